"""Composition offsets (``ctts``) of an MP4's first video track, read box by box.

FFmpeg builds an MP4's sample index when it opens the file but exposes only
decode times (``stream.index_entries``); presentation order also needs each
sample's composition offset. This reads just the boxes on the way to the
video track's ``ctts`` through a ``read_at(offset, length)`` callable, so a
clip read by range costs its ``moov`` (wherever it sits: boxes before it are
skipped, not read), not its frames.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

__all__ = ["video_composition_offsets"]

ReadAt = Callable[[int, int], bytes]
_CONTAINERS = (b"moov", b"trak", b"mdia", b"minf", b"stbl")


def _boxes(read_at: ReadAt, start: int, end: int):
    """(type, payload start, box end) of the boxes in [start, end)."""
    at = start
    while at + 8 <= end:
        head = read_at(at, 16)
        if len(head) < 8:
            return
        size, kind = struct.unpack(">I4s", head[:8])
        body = at + 8
        if size == 1:
            if len(head) < 16:
                return
            size = struct.unpack(">Q", head[8:16])[0]
            body = at + 16
        elif size == 0:
            size = end - at
        if size < body - at or at + size > end:
            return
        yield kind, body, at + size
        at += size


def _child(read_at: ReadAt, start: int, end: int, kind: bytes) -> list[tuple[int, int]]:
    return [(b, e) for k, b, e in _boxes(read_at, start, end) if k == kind]


def video_composition_offsets(read_at: ReadAt, size: int) -> tuple[list[int], int] | None:
    """(per-sample composition offsets, sample count) of the first video track, in
    decode order; offsets are empty when the track has no ``ctts`` (all zero).

    None where the bytes are not an MP4 this reader understands (no ``moov``,
    no video track, more than one video track, a box that runs past its
    parent): the caller then indexes the clip another way.
    """
    moovs = _child(read_at, 0, size, b"moov")
    if len(moovs) != 1:
        return None
    videos = []
    for tb, te in _child(read_at, *moovs[0], b"trak"):
        for mb, me in _child(read_at, tb, te, b"mdia"):
            hdlr = _child(read_at, mb, me, b"hdlr")
            if hdlr and read_at(hdlr[0][0] + 8, 4) == b"vide":
                videos.append((mb, me))
    if len(videos) != 1:
        return None
    stbl = [s for mi in _child(read_at, *videos[0], b"minf")
            for s in _child(read_at, *mi, b"stbl")]
    if len(stbl) != 1:
        return None
    stsz = _child(read_at, *stbl[0], b"stsz")
    if len(stsz) != 1:
        return None
    count = struct.unpack(">I", read_at(stsz[0][0] + 8, 4))[0]
    ctts = _child(read_at, *stbl[0], b"ctts")
    if not ctts:
        return [], count
    if len(ctts) != 1:
        return None
    cb, ce = ctts[0]
    body = read_at(cb, ce - cb)
    entries = struct.unpack(">I", body[4:8])[0]
    if 8 + 8 * entries > len(body):
        return None
    offsets: list[int] = []
    for run, offset in struct.iter_unpack(">Ii", body[8:8 + 8 * entries]):
        if len(offsets) + run > count:
            return None
        offsets.extend([offset] * run)
    return offsets, count
