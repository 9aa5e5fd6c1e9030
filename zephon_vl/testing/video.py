"""Test videos: frames encoded as an mp4 in memory, the same bytes on every run."""

from __future__ import annotations

import io
from collections.abc import Iterable

import av
import numpy as np


def encode_test_video(frames: Iterable[np.ndarray], fps: int, *, crf: int = 0,
                      preset: str = "ultrafast") -> bytes:
    """Encode HWC uint8 RGB frames (even sides) as an in-memory H.264 mp4.

    `crf` 0 is lossless, so tests know the decoded pixels; the demo data uses a
    lossy `crf`. Falls back to h264 or mpeg4 (near-lossless, `crf` and `preset`
    ignored) where PyAV has no libx264.

    Reproducible: x264 runs on one thread (its output depends on the thread
    count) and without macroblock-tree rate control (``mbtree=0``). With
    mbtree on, encoding the same frames twice in one process gave different
    bytes now and then (x264 165 in FFmpeg 8; it depends on what the process
    did before, as if it read memory it had not written), so two builds of
    the demo shards differed inside their videos.
    """
    for codec in ("libx264", "h264", "mpeg4"):
        if codec in av.codecs_available:
            break
    else:
        raise RuntimeError("PyAV has no h264 or mpeg4 encoder here")
    options = ({"crf": str(crf), "preset": preset, "x264-params": "mbtree=0"}
               if codec == "libx264" else {})
    buf = io.BytesIO()
    count = 0
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps, options=options)
        stream.codec_context.thread_count = 1
        if codec == "mpeg4":
            stream.codec_context.qscale = 1  # type: ignore[attr-defined]
        for arr in frames:
            if count == 0:
                stream.height, stream.width = arr.shape[:2]
                stream.pix_fmt = "yuv420p"
            rgb = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            for packet in stream.encode(rgb):
                container.mux(packet)
            count += 1
        if count == 0:
            raise ValueError("encode_test_video needs at least one frame")
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()
