"""Token ids side by side with the original Zephon (``zephon`` 0.2.0) on the same files.

Writes a few hundred documents (prose, code, CJK, emoji, combining marks, very
long ones, empty ones, text that looks like control tokens) as JSONL and as
Parquet shards, then tokenizes every document three ways and compares them per
document:

- zephon-vl: ``zephon_core.JsonlReader`` / ``ParquetReader`` read the record,
  ``zephon_core.Tokenize(qwen_tokenizer_dir())`` (defaults: no BOS, EOS appended)
  turns it into ``tokens`` -- the per-document ids before packing;
- the original Zephon, in its own virtual environment (``.cache/zephon-peer/``,
  built once with ``pip install zephon[parquet]==0.2.0`` and the transformers,
  tokenizers and pyarrow versions of constraints.txt; never a dependency of
  zephon-vl): its own readers and ``Pipeline.tokenize(special_tokens="eos")`` with
  a copy of the same tokenizer folder whose ``tokenizer_config.json`` says
  ``split_special_tokens: true`` (``scripts/peer_zephon_driver.py``);
- the reference: transformers' ``AutoTokenizer.from_pretrained(path,
  split_special_tokens=True)`` on the same text, plus EOS.

Run: ``python scripts/peer_zephon.py [--work DIR] [--json]``; the first run needs
PyPI for the virtual environment. Exit status 1 when any document differs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

from zephon_core import Element, JsonlReader, ParquetReader, Tokenize, qwen_tokenizer_dir

REPO = Path(__file__).resolve().parent.parent
PEER_VERSION = "0.2.0"
# The peer's other packages at the versions zephon-vl is tested with, so a
# difference can only come from the loaders, never from another tokenizer build.
PINNED = ("transformers", "tokenizers", "pyarrow")
SHARDS = 3

WORDS = ("the model reads every shard once and the loader keeps its place while ranks "
         "come and go data training batch token image caption resume lane epoch").split()


def _prose(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n_words)]
    sentences = [" ".join(words[i:i + 12]).capitalize() + "." for i in range(0, n_words, 12)]
    return " ".join(sentences)


CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b\\n"}}',
    "SELECT id, COUNT(*) FROM t WHERE x <> 'y' GROUP BY id;\n",
    "    indented with trailing spaces   \n\n\n",
    "#include <stdio.h>\r\nint main(void) { puts(\"hi\"); }\r\n",
    "x=1;y=2\t\t# tabs\n" * 20,
    "<html><body><p class=\"a\">&amp; &lt;tag&gt;</p></body></html>",
    "```python\nimport os\nprint(os.sep)\n```",
    "λx. x → x ∘ f ≠ g ≤ ∞",
    "classic Mac OS\rline endings\r", "mixed\r\n\rline\n\rends\r\r\n",
]

UNICODE = [
    "中文文本的分词测试，包括标点符号。", "日本語のテキスト：ひらがな、カタカナ、漢字。",
    "한국어 문장입니다.", "emoji 😀😃🎉 and flags 🇫🇷🇯🇵 and family 👨‍👩‍👧‍👦 and skin 👍🏽",
    "combining: e\u0301 a\u0300 n\u0303 o\u0308\u0304 (NFD)", "precomposed: é à ñ ȫ (NFC)",
    "Tiếng Việt có dấu: người, được, những", "देवनागरी लिपि में हिंदी",
    "العربية من اليمين إلى اليسار", "עברית עם ניקוד: שָׁלוֹם",
    "zero\u200bwidth\u200cjoiners\u200d and soft\u00adhyphen", "\ufeffstarts with a BOM",
    "Ω≈ç√∫˜µ≤≥÷ ¡™£¢∞§¶•ªº", "math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕋𝕖𝕩𝕥 and old italic 𐌀𐌁𐌂",
    "control \x07 bell \x1b[31m ansi \x00 nul", "ｆｕｌｌ ｗｉｄｔｈ ＡＢＣ １２３",
    "ﬁ ligature and Å (angstrom sign) and Å", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
]

SPECIAL_LOOKING = [
    "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "text before <|endoftext|> text after", "<|image_pad|><|vision_start|><|vision_end|>",
    "<|im_end", "|im_end|>", "< |im_end| >", "<|IM_END|>", "<|im_end|><|im_end|><|im_end|>",
    "<think>reasoning</think> answer", "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<s> </s> [CLS] [SEP] <unk> <pad>",
]


def documents(seed: int = 0) -> list[str]:
    """The test documents: every kind the comparison is meant to cover, deterministic."""
    rng = random.Random(seed)
    docs: list[str] = ["", " ", "\n", "\n\n", "\t", "   \n  "]
    docs += [_prose(rng, rng.randint(3, 200)) for _ in range(120)]
    docs += CODE + [c.upper() for c in CODE]
    docs += UNICODE + [unicodedata.normalize("NFD", u) for u in UNICODE]
    docs += [" ".join(rng.sample(UNICODE, 4)) + " " + _prose(rng, 20) for _ in range(40)]
    docs += SPECIAL_LOOKING + [f"{_prose(rng, 8)} {s} {_prose(rng, 8)}" for s in SPECIAL_LOOKING]
    docs += [" ".join(rng.sample(CODE + UNICODE + SPECIAL_LOOKING, 6)) for _ in range(40)]
    # Very long documents: longer than any context, one of a single repeated
    # character (a worst case for BPE merges) and one without a single space.
    docs += [_prose(rng, 40_000), "a" * 100_000, "字" * 30_000,
             "".join(rng.choice(UNICODE) for _ in range(2_000)),
             "x" * 5_000 + "<|endoftext|>" * 500]
    return docs


def write_files(docs: list[str], work: Path) -> dict[str, Path]:
    """The same documents as JSONL shards and as Parquet shards, one folder each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folders = {"jsonl": work / "data" / "jsonl", "parquet": work / "data" / "parquet"}
    for folder in folders.values():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    for shard in range(SHARDS):
        part = [(i, d) for i, d in enumerate(docs) if i % SHARDS == shard]
        with open(folders["jsonl"] / f"part-{shard:03d}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"id": i, "text": d}) + "\n" for i, d in part)
        table = pa.table({"id": [i for i, _ in part], "text": [d for _, d in part]})
        pq.write_table(table, folders["parquet"] / f"part-{shard:03d}.parquet", row_group_size=16)
    return folders


def zephon_vl_ids(folders: dict[str, Path], tokenizer: Path) -> dict[str, dict[str, list[int]]]:
    """Per-document ids as zephon-vl's text recipe produces them before packing:
    its readers, then `Tokenize` with its defaults (no BOS, EOS appended)."""
    tokenize = Tokenize(tokenizer)
    out: dict[str, dict[str, list[int]]] = {}
    for name, folder in folders.items():
        paths = sorted(folder.iterdir())
        reader = JsonlReader(paths) if name == "jsonl" else ParquetReader(paths)
        ids: dict[str, list[int]] = {}
        for shard in range(reader.num_shards):
            records = [reader.read(shard, i) for i in range(reader.shard_len(shard))]
            results = tokenize.process_many([Element(i, r) for i, r in enumerate(records)])
            ids.update((str(r["id"]), res["tokens"].tolist())
                       for r, res in zip(records, results, strict=True))
        out[name] = ids
    return out


def reference_ids(docs: list[str], tokenizer: Path, split: bool = True) -> dict[str, list[int]]:
    """transformers' ids for each document, plus EOS: with ``split_special_tokens=True``
    the reference, without it (`split` False) text that looks like a control token
    becomes that token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer), split_special_tokens=split)
    return {str(i): tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            for i, d in enumerate(docs)}


def peer_python(cache: Path) -> Path:
    """The peer's interpreter, in a virtual environment built once under `cache`."""
    venv = cache / "venv"
    python = venv / "bin" / "python"
    ready = cache / f"ready-{PEER_VERSION}"
    if ready.is_file() and python.is_file():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-c", str(REPO / "constraints.txt"),
                    f"zephon[parquet]=={PEER_VERSION}", *PINNED], check=True)
    ready.write_text(PEER_VERSION + "\n")
    return python


def split_special_copy(tokenizer: Path, work: Path) -> Path:
    """A copy of the tokenizer folder whose config turns `split_special_tokens` on:
    the peer loads tokenizers by folder, so this is how it gets the flag zephon-vl uses."""
    copy = work / "tokenizer-split-special"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(tokenizer, copy)
    config_path = copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["split_special_tokens"] = True
    config_path.write_text(json.dumps(config, indent=2))
    return copy


# How the peer is run. "raw": the tokenizer copy with `split_special_tokens` on,
# newlines kept as zephon-vl keeps them, one sample a chunk; "readme": as raw but
# `decode_text()` with its default `normalize_newlines=True`, as the peer's README
# writes it; "chunk16": as raw with 16 samples a chunk; "as_shipped": as raw with the
# tokenizer folder as zephon-vl ships it (no `split_special_tokens` in its config).
VARIANTS = {
    "raw": {"tokenizer": "split", "normalize_newlines": False, "chunk_size": 1},
    "readme": {"tokenizer": "split", "normalize_newlines": True, "chunk_size": 1},
    "chunk16": {"tokenizer": "split", "normalize_newlines": False, "chunk_size": 16},
    "as_shipped": {"tokenizer": "as_shipped", "normalize_newlines": False, "chunk_size": 1},
}


def peer_ids(python: Path, folders: dict[str, Path], tokenizer: Path, n_docs: int,
             work: Path) -> dict:
    """What the original Zephon produces, from the driver run by the peer's interpreter."""
    job = {"tokenizers": {"split": str(split_special_copy(tokenizer, work)),
                          "as_shipped": str(tokenizer)},
           "datasets": {k: str(v) for k, v in folders.items()},
           "expected": {k: n_docs for k in folders}, "variants": VARIANTS,
           "out": str(work / "peer-ids.json")}
    (work / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["HF_HUB_OFFLINE"] = "1"
    subprocess.run([str(python), str(REPO / "scripts" / "peer_zephon_driver.py"),
                    str(work / "job.json")], check=True, env=env, cwd=work)
    return json.loads((work / "peer-ids.json").read_text())


def _first_difference(a: list[int], b: list[int]) -> int:
    pairs = enumerate(zip(a, b, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))


def cause(doc: str, ids: list[int] | None, newline_ids: list[int],
          control_ids: list[int]) -> str:
    """Why the peer's ids for `doc` differ: ``not_delivered`` (no ids came back),
    ``normalize_newlines`` (they are zephon-vl's ids for the text with CR LF and CR
    turned into LF, what the peer's `decode_text` does by default),
    ``control_tokens_parsed`` (they are transformers' ids without
    `split_special_tokens`: text such as ``<|im_end|>`` became the control token),
    else ``unexplained``."""
    if ids is None:
        return "not_delivered"
    if "\r" in doc and ids == newline_ids:
        return "normalize_newlines"
    if ids == control_ids:
        return "control_tokens_parsed"
    return "unexplained"


def compare(docs: list[str], vl: dict, peer: dict, ref: dict, newline: dict,
            control: dict) -> dict:
    """Per peer variant, format and document: zephon-vl's ids against the peer's, and
    zephon-vl's against transformers' (`ref`). `newline` (zephon-vl's ids for each
    document with its newlines normalized) and `control` (transformers' ids with
    control tokens parsed) name the cause of a difference."""
    differences = []
    counts: dict[str, dict] = {}
    for variant, by_format in peer["ids"].items():
        for fmt, vl_ids in vl.items():
            theirs = by_format[fmt]
            equal = 0
            for key, ids in vl_ids.items():
                if theirs.get(key) == ids:
                    equal += 1
                    continue
                other = theirs.get(key)
                differences.append({
                    "variant": variant, "format": fmt, "doc": int(key),
                    "cause": cause(docs[int(key)], other, newline[key], control[key]),
                    "text": docs[int(key)][:60],
                    "first_difference_at": None if other is None
                    else _first_difference(ids, other)})
            counts[f"{variant}/{fmt}"] = {"documents": len(vl_ids), "equal": equal,
                                          "delivered": len(theirs)}
    transformers = sorted({int(k) for ids in vl.values() for k, v in ids.items() if v != ref[k]})
    return {"peer_version": peer["version"], "documents": len(docs),
            "peer_split_special_tokens": peer["split_special_tokens"],
            "counts": counts, "differences": differences,
            "differ_from_transformers": transformers}


def zephon_vl_text_ids(texts: dict[str, str], tokenizer: Path) -> dict[str, list[int]]:
    """zephon-vl's `Tokenize` ids for in-memory texts, keyed as given."""
    keys = list(texts)
    results = Tokenize(tokenizer).process_many(
        [Element(i, {"text": texts[k]}) for i, k in enumerate(keys)])
    return {k: r["tokens"].tolist() for k, r in zip(keys, results, strict=True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="folder for the data and the peer's output "
                        "(default: a temporary one)")
    parser.add_argument("--cache", type=Path, default=REPO / ".cache" / "zephon-peer",
                        help="where the peer's virtual environment is built once")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        docs = documents()
        folders = write_files(docs, work)
        tokenizer = qwen_tokenizer_dir()
        peer = peer_ids(peer_python(args.cache), folders, tokenizer, len(docs), work)
        newline = zephon_vl_text_ids(
            {str(i): d.replace("\r\n", "\n").replace("\r", "\n") for i, d in enumerate(docs)},
            tokenizer)
        result = compare(docs, zephon_vl_ids(folders, tokenizer), peer,
                         reference_ids(docs, tokenizer), newline,
                         reference_ids(docs, tokenizer, split=False))
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        print(f"zephon {result['peer_version']} against zephon-vl, "
              f"{result['documents']} documents")
        for name, c in result["counts"].items():
            print(f"{name}: {c['equal']}/{c['documents']} equal, {c['delivered']} delivered")
        for d in result["differences"]:
            print(f"  {d['variant']}/{d['format']} doc {d['doc']} ({d['cause']}, first "
                  f"difference at token {d['first_difference_at']}): {d['text']!r}")
        print("documents where zephon-vl differs from transformers:",
              result["differ_from_transformers"] or "none")
    return 1 if result["differences"] or result["differ_from_transformers"] else 0


if __name__ == "__main__":
    sys.exit(main())
