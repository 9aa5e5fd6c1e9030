"""Scanning a WebDataset tar's headers into samples (`scan_tar`), damage included.

Members are grouped into samples with WebDataset's own key rule; a header that
cannot be read makes the scan step forward in 512-byte blocks to the next valid
one, and the unreadable bytes become an entry of their own (see
`zephon_vl.wds.index` for the whole story and the index file).
"""

from __future__ import annotations

import re
import tarfile

from zephon_core import ZephonError
from zephon_core.extend import StoredFileIO

#: the drop reason of a sample lost to (or next to) damaged tar structure
DAMAGED = "damaged_tar"
_BLOCK = tarfile.BLOCKSIZE
# Types whose data tarfile does not skip: one of them with a size is a damaged header.
_NO_DATA_TYPES = {tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE,
                  tarfile.BLKTYPE, tarfile.FIFOTYPE}

# WebDataset's rule (webdataset.tariterators.base_plus_ext): the key is the path up
# to the first dot of the basename, the extension is everything after it.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
# WebDataset skips these metadata members entirely.
_SKIP_META = re.compile(r"__[^/]*__($|/)")

Member = tuple[str, int, int]  # (extension, data offset, size)


def _is_header(block: bytes) -> bool:
    """A complete tar header block with a valid checksum (not the zero end block)."""
    if len(block) < _BLOCK or block.count(0) == _BLOCK:
        return False
    try:
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


def _next_header(f: StoredFileIO, start: int, size: int) -> int | None:
    """Offset of the first valid header at or after `start` (512-byte steps), else None."""
    for pos in range(start, size - _BLOCK + 1, _BLOCK):
        f.seek(pos)
        if _is_header(f.read(_BLOCK)):
            return pos
    return None


class _Samples:
    """Members grouped into samples by WebDataset's key rule, with damage recorded."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.keys: list[str] = []
        self.members: list[list[Member]] = []
        self.bad: dict[int, tuple[str, str]] = {}
        self._after_damage: tuple[int, int] | None = None

    def add(self, fname: str, offset: int, size: int) -> int | None:
        """Index one regular member; returns its entry, or None when WebDataset skips it."""
        if "/" not in fname and fname.startswith("__") and fname.endswith("__"):
            return None
        if _SKIP_META.match(fname):
            return None
        m = _KEY_EXT.match(fname)
        if m is None:
            return None
        key, ext = m.group(1), m.group(2).lower()
        if self._after_damage is not None or not self.keys or self.keys[-1] != key:
            self.keys.append(key)
            self.members.append([])
            if self._after_damage is not None:
                a, b = self._after_damage
                self._mark(len(self.keys) - 1, f"it follows unreadable bytes {a}..{b} of "
                           f"{self.name} and may have lost members there")
                self._after_damage = None
        i = len(self.keys) - 1
        if any(e == ext for e, _, _ in self.members[i]):
            self.bad.setdefault(i, ("duplicate_member", f"{fname} appears twice in one sample"))
            return i
        self.members[i].append((ext, offset, size))
        return i

    def _mark(self, i: int, detail: str) -> None:
        self.bad.setdefault(i, (DAMAGED, detail))

    def damage(self, start: int, end: int) -> None:
        """Bytes [start, end) hold no readable header: an entry of its own, neighbours marked."""
        if self.keys and self._after_damage is None:
            self._mark(len(self.keys) - 1, f"it precedes unreadable bytes {start}..{end} of "
                       f"{self.name} and may have lost members there")
        self.keys.append(f"damaged@{start}-{end}")
        self.members.append([])
        self._mark(len(self.keys) - 1, f"bytes {start}..{end} of {self.name} are a damaged tar "
                   "header and the data it described; the member(s) there cannot be read")
        self._after_damage = (start, end)

    def truncate_last(self, detail: str) -> None:
        if self.keys and (len(self.keys) - 1) not in self.bad:
            self.bad[len(self.keys) - 1] = ("truncated_member", detail)


def scan_tar(f: StoredFileIO, size: int, name: str, where: str) -> _Samples:
    """Walk every header of the tar, resynchronising after damage (module docstring)."""
    out = _Samples(name)
    pos = 0
    while True:
        stop = pos
        try:
            f.seek(pos)
            tf = tarfile.TarFile(fileobj=f, mode="r")  # type: ignore[call-overload]
        except (tarfile.TarError, EOFError):
            tf = None
        while tf is not None:
            try:
                ti = tf.next()
            except (tarfile.TarError, EOFError):
                ti = None
            if ti is None:
                stop = tf.offset
                break
            tf.members.clear()  # tarfile keeps every TarInfo otherwise
            end = ti.offset_data + ti.size
            if ti.type in _NO_DATA_TYPES and ti.size > 0:
                stop = ti.offset  # e.g. a file's typeflag flipped to "directory"
                break
            if end > size:
                later = _next_header(f, ti.offset_data, size)
                if later is not None:  # a damaged size: other headers follow
                    stop = ti.offset
                    break
                if ti.isreg() and not ti.issparse():
                    i = out.add(ti.name, ti.offset_data, ti.size)
                    if i is not None:
                        out.bad[i] = ("truncated_member", f"needs bytes up to {end} but the "
                                      f"file has {size}")
                out.truncate_last(f"the archive is cut inside a member at byte {ti.offset}")
                return out
            if ti.isreg() and not ti.issparse():
                out.add(ti.name, ti.offset_data, ti.size)
        f.seek(stop)
        block = f.read(_BLOCK)
        if len(block) < _BLOCK:
            if stop < size:
                out.truncate_last(f"the archive is cut at byte {stop} (file size {size}); "
                                  "the last sample may be incomplete")
            return out
        later = _next_header(f, stop + _BLOCK, size)
        if later is None:
            if block.count(0) == _BLOCK:
                return out  # the end-of-archive marker
            if not out.keys and stop == 0:
                raise ZephonError(
                    f"cannot index {where}: not a readable uncompressed tar (no valid tar "
                    "header anywhere). Check the file is a complete WebDataset shard, or "
                    "re-create it with zephon_vl.wds.writer.write_shards.")
            out.damage(stop, size)
            return out
        out.damage(stop, later)
        pos = later
