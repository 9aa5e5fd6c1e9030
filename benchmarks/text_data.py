"""The text workload's data: two JSONL datasets of real text, made from the running Python.

* ``prose``: documents of English prose, the docstrings of the standard library
  (the text-demo corpus) strung together, 300-4,500 characters each;
* ``code``: documents of Python source, consecutive lines of the standard
  library's own modules, 300-4,500 characters each.

No document is longer than a 2048-token row (about 1,500 tokens at most), so no
loader's overlong policy (zephon-vl splits, the original Zephon's ``best_fit``
drops) changes what is delivered. Every document's text comes from ``(seed,
index)`` alone; the set is built once per size and cached.
"""

from __future__ import annotations

import json
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from zephon_core.extend import atomic_write, cache_dir

VERSION = "v1"  # bump whenever the generated text changes
SHARDS = 8
CHARS = (300, 4500)
#: characters of source the code documents are cut from (the prose pool is about 1.2 M)
CODE_POOL = 4_000_000
SKIP = {"test", "tests", "idlelib", "site-packages", "lib2to3"}


@dataclass(frozen=True)
class TextData:
    """The datasets' shard files by name, and how many documents each has."""

    root: Path
    shards: dict[str, list[Path]]
    documents: dict[str, int]


def _stdlib_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in stdlib.rglob("*.py")
                  if not SKIP & set(p.relative_to(stdlib).parts))


def _prose_pool() -> list[str]:
    from zephon_core import text_corpus

    return [json.loads(line)["text"] for p in text_corpus() for line in open(p)]


def _code_pool() -> list[str]:
    """Lines of the standard library's modules, in file order, up to `CODE_POOL` characters."""
    lines: list[str] = []
    size = 0
    for f in _stdlib_files():
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        lines += text.splitlines(keepends=True)
        size += len(text)
        if size >= CODE_POOL:
            break
    return lines


def _document(rng: random.Random, pool: list[str], joiner: str) -> str:
    """Consecutive items of `pool` from a random place, cut to a length drawn in CHARS."""
    size = rng.randint(*CHARS)
    start = rng.randrange(len(pool))
    parts, n = [], 0
    while n < size:
        item = pool[(start + len(parts)) % len(pool)]
        parts.append(item)
        n += len(item) + len(joiner)
    return joiner.join(parts)[:size]


def build_text_data(documents: int, seed: int = 0, root: Path | None = None) -> TextData:
    """`documents` documents in each dataset (prose and code), as `SHARDS` JSONL shards
    each; built once under zephon's cache, reused while the manifest says the same."""
    root = root or cache_dir() / f"bench-text-{VERSION}-{documents}-{seed}-py" \
        f"{sys.version_info.major}.{sys.version_info.minor}"
    shards = {name: [root / name / f"part-{i:03d}.jsonl" for i in range(SHARDS)]
              for name in ("prose", "code")}
    manifest = root / "manifest.json"
    if not manifest.is_file():
        pools = {"prose": (_prose_pool(), "\n\n"), "code": (_code_pool(), "")}
        for k, (name, (pool, joiner)) in enumerate(pools.items()):
            rng = random.Random(seed * 1_000_003 + k)
            docs = [_document(rng, pool, joiner) for _ in range(documents)]
            for i, path in enumerate(shards[name]):
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, "".join(json.dumps({"id": j, "text": d}) + "\n"
                                           for j, d in enumerate(docs) if j % SHARDS == i))
        atomic_write(manifest, json.dumps({"documents": documents, "seed": seed,
                                           "version": VERSION}))
    return TextData(root, shards, {name: documents for name in shards})
