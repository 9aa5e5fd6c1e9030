"""Files zephon writes: where its cache lives, and writes that never leave a torn file."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def cache_dir() -> Path:
    """`$ZEPHON_CACHE`, else `~/.cache/zephon-vl` (created if missing)."""
    root = Path(os.environ.get("ZEPHON_CACHE") or Path.home() / ".cache" / "zephon-vl")
    root.mkdir(parents=True, exist_ok=True)
    return root


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` (str as UTF-8) to `path` through a temporary file and a rename.

    A reader, a crash or a concurrent writer never sees a torn file: only the
    old content or the whole new one. The temporary name is unique per process
    and thread, so concurrent writers of the same file do not clash.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
