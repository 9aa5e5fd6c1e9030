"""A video clip's packet index (presentation and decode order, keyframes) and the seek plan
it gives: what the seek path of `video` needs to know before decoding a frame.

The index comes from the MP4 sample table (`mp4index`, no frame read) or a demux pass; a
clip whose frame k cannot be told from it for sure has no index and is decoded sequentially.
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import av
import numpy as np

from zephon_vl.media.mp4index import video_composition_offsets

__all__ = ["SEEK_COST_FRAMES", "Source", "Surprise", "VideoIndex", "decode_plan", "native_fps",
           "open_source", "read_video_index"]

#: In a decode plan, one seek costs about as much as decoding this many frames.
SEEK_COST_FRAMES = 4

Source = bytes | BinaryIO


def native_fps(stream: av.video.stream.VideoStream) -> float | None:
    """The stream's frame rate as the container states it, or None."""
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return float(rate) if rate else None


def open_source(source: Source) -> av.container.InputContainer:
    """Open bytes or a file object (rewound) with PyAV."""
    if isinstance(source, bytes | bytearray | memoryview):
        return av.open(io.BytesIO(source), mode="r")
    source.seek(0)
    return av.open(source, mode="r")


class Surprise(ValueError):
    """The seek path met something its index did not predict: decode sequentially."""


@dataclass(frozen=True)
class VideoIndex:
    """A clip's video packets (`read_video_index`: the MP4 sample table, or a demux
    pass; nothing decoded).

    Frame `k` (the k-th frame the decoder puts out, in presentation order) is
    the packet with the k-th smallest pts: ``pts[k]``, fed to the decoder as
    packet number ``pos[k]`` (decode order). ``keys`` are the decode positions
    of keyframes and ``key_pts`` their pts.
    """

    pts: list[int]
    pos: list[int]
    keys: list[int]
    key_pts: list[int]
    fps: float | None
    #: "mp4 index" (the sample table) or "packet index" (a demux pass)
    source: str = "packet index"
    #: the stream header's (width, height), read in the same open (a planner needs both)
    frame_size: tuple[int, int] = (0, 0)


def _read_at(source: Source) -> tuple[Callable[[int, int], bytes], int]:
    if isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source)
        return (lambda offset, length: bytes(view[offset:offset + length])), len(view)
    size = source.seek(0, io.SEEK_END)

    def read_at(offset: int, length: int) -> bytes:
        source.seek(offset)
        return source.read(length)

    return read_at, size


def _sorted_index(pts: list[int], keys: list[int], key_pts: list[int], header: int,
                  stream: av.video.stream.VideoStream, source: str) -> VideoIndex | None:
    """The index in presentation order; None for a count unlike the header's, no keyframe
    first, or a repeated pts (sorted in numpy: a long clip has thousands of packets, and
    every plan and every seek decode reads its index)."""
    if not pts or len(pts) != header or not keys or keys[0] != 0:
        return None
    times = np.asarray(pts, dtype=np.int64)
    order = np.argsort(times, kind="stable")
    ordered = times[order]
    if (ordered[1:] == ordered[:-1]).any():
        return None
    ctx = stream.codec_context
    return VideoIndex(ordered.tolist(), order.tolist(), keys, key_pts, native_fps(stream),
                      source, (ctx.width, ctx.height))


def _index_from_mp4(source: Source) -> VideoIndex | None:
    """The index from the MP4 sample table: FFmpeg's decode times plus the
    ``ctts`` composition offsets (`mp4index`). Reads the boxes, not the frames."""
    read_at, size = _read_at(source)
    try:
        found = video_composition_offsets(read_at, size)
    except Exception:  # noqa: BLE001 - not an MP4 this reader understands
        return None
    if found is None:
        return None
    offsets, count = found
    with open_source(source) as container:
        if "mp4" not in container.format.name or not container.streams.video:
            return None
        stream = container.streams.video[0]
        entries = stream.index_entries
        if len(entries) != count or (offsets and len(offsets) != count):
            return None
        pts: list[int] = []
        keys: list[int] = []
        key_pts: list[int] = []
        for i, entry in enumerate(entries):
            if entry.is_discard:
                return None
            t = entry.timestamp + (offsets[i] if offsets else 0)
            if entry.is_keyframe:
                keys.append(i)
                key_pts.append(t)
            pts.append(t)
        return _sorted_index(pts, keys, key_pts, stream.frames, stream, "mp4 index")


def _index_from_packets(source: Source) -> VideoIndex | None:
    """The index from a demux pass (every packet read, none decoded)."""
    with open_source(source) as container:
        if not container.streams.video:
            return None
        stream = container.streams.video[0]
        pts: list[int] = []
        keys: list[int] = []
        key_pts: list[int] = []
        for packet in container.demux(stream):
            if packet.size == 0:
                continue
            if packet.pts is None or packet.is_discard or packet.is_corrupt:
                return None
            if packet.is_keyframe:
                keys.append(len(pts))
                key_pts.append(packet.pts)
            pts.append(packet.pts)
        return _sorted_index(pts, keys, key_pts, stream.frames, stream, "packet index")


def read_video_index(source: Source) -> VideoIndex | None:
    """The packet index, or None where frame k cannot be told from it for sure
    (a packet without pts, repeated pts, packets the decoder discards (edit
    lists), or a count unlike the header's): such clips are decoded sequentially.

    An MP4 is indexed from its sample table (no frame is read: a clip read by
    range costs its index, then only the GOPs of kept frames); other
    containers, or an MP4 whose table this cannot read, by a demux pass.
    """
    try:
        return _index_from_mp4(source) or _index_from_packets(source)
    except Exception:  # noqa: BLE001 - the sequential path reports what is wrong
        return None


def _key_for(index: VideoIndex, k: int) -> int | None:
    """Decode position of the keyframe to start from for frame k: the last one
    before it in decode order that it does not display before (a frame shown
    before its keyframe, an open GOP's leading frame, needs the one before)."""
    j = bisect.bisect_right(index.keys, index.pos[k]) - 1
    while j >= 0 and index.key_pts[j] > index.pts[k]:
        j -= 1
    return index.keys[j] if j >= 0 else None


def decode_plan(index: VideoIndex,
                wanted: list[int]) -> tuple[list[tuple[int, list[int]]], int, int]:
    """Segments ``(keyframe decode position, frames)`` for the seek path, and the
    frames it and sequential decoding would feed the decoder.

    Frames are taken in presentation order; a frame joins the current segment
    when decoding on from there is no dearer than a seek to its own keyframe
    (`SEEK_COST_FRAMES` per seek). A pure function of the index; the first
    segment starts at packet 0 (frame 0 is always kept and is the first keyframe).
    A frame with no keyframe before it raises ValueError.
    """
    frames = sorted(set(wanted))
    segments: list[tuple[int, list[int]]] = []
    cost = 0
    fed = -1  # the last decode position fed so far
    for k in frames:
        key = _key_for(index, k)
        if key is None:
            raise Surprise(f"frame {k} has no keyframe before it")
        need = index.pos[k]
        onward = max(0, need - fed)
        jump = need - key + 1 + SEEK_COST_FRAMES
        if segments and onward <= jump:
            segments[-1][1].append(k)
            cost += onward
        else:
            segments.append((key, [k]))
            cost += jump
        fed = max(fed, need)
    sequential = max(index.pos[k] for k in frames) + 1
    return segments, cost, sequential
