"""Paths in the reports this package writes: the repository's and the user's, not this
machine's, so that a committed report names no folder of the machine that made it."""

from __future__ import annotations

from pathlib import Path

#: the repository (the benchmarks are installed from it, editable)
ROOT = Path(__file__).resolve().parents[1]


def portable(text: str) -> str:
    """`text` with paths in the repository made relative to it and the home folder as ``~``."""
    text = text.replace(str(ROOT) + "/", "").replace(str(ROOT), ".")
    home = str(Path.home())
    return text.replace(home + "/", "~/") if len(home) > 1 else text
