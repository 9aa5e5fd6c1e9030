"""Files zephon writes: where its cache lives, and writes that never leave a torn file."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$ZEPHON_CACHE`, else `~/.cache/zephon-vl`."""
    root = Path(os.environ.get("ZEPHON_CACHE", Path.home() / ".cache" / "zephon-vl"))
    root.mkdir(parents=True, exist_ok=True)
    return root
