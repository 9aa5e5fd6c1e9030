"""Test videos: frames encoded as an mp4 in memory, the same bytes on every run."""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

import av
import numpy as np


def encode_test_video(frames: Iterable[np.ndarray], fps: int, *, crf: int = 0,
                      preset: str = "ultrafast", gop: int | None = None,
                      bframes: int | None = None, pts_ms: Sequence[int] | None = None,
                      rotation: int | None = None, faststart: bool = False) -> bytes:
    """Encode HWC uint8 RGB frames (even sides) as an in-memory H.264 mp4.

    `crf` 0 is lossless, so tests know the decoded pixels; the demo data uses a
    lossy `crf`. Falls back to h264 or mpeg4 (near-lossless, `crf` and `preset`
    ignored) where PyAV has no libx264.

    The clip's structure, for decoder tests (None: x264's defaults, and the
    same bytes as before these parameters existed): `gop` a keyframe every
    `gop` frames (fixed: ``keyint = min-keyint``, no scene cuts), `bframes`
    the most consecutive B-frames, `pts_ms` each frame's presentation time in
    milliseconds (increasing; variable frame rate), `rotation` a display
    matrix turning the picture by that many degrees on playback, `faststart`
    the ``moov`` index before the frames (readable from the front).

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
    params = ["mbtree=0"]
    if gop is not None:
        params += [f"keyint={gop}", f"min-keyint={gop}", "scenecut=0"]
    if bframes is not None:
        params.append(f"bframes={bframes}")
    options = ({"crf": str(crf), "preset": preset, "x264-params": ":".join(params)}
               if codec == "libx264" else {})
    if codec != "libx264" and gop is not None:
        options["g"] = str(gop)
    if faststart:  # the muxer rewrites the file to move its index: it needs a real file
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "clip.mp4")
            _encode(path, codec, fps, options, frames, pts_ms, rotation, {"movflags": "+faststart"})
            with open(path, "rb") as f:
                return f.read()
    buf = io.BytesIO()
    _encode(buf, codec, fps, options, frames, pts_ms, rotation, {})
    return buf.getvalue()


def _encode(target: Any, codec: str, fps: int, options: dict, frames: Iterable[np.ndarray],
            pts_ms: Sequence[int] | None, rotation: int | None, container_options: dict) -> None:
    count = 0
    with av.open(target, mode="w", format="mp4", options=container_options) as container:
        stream = container.add_stream(codec, rate=fps, options=options)
        stream.codec_context.thread_count = 1
        if pts_ms is not None:
            stream.codec_context.time_base = Fraction(1, 1000)
            stream.time_base = Fraction(1, 1000)
        if codec == "mpeg4":
            stream.codec_context.qscale = 1  # type: ignore[attr-defined]
        for arr in frames:
            if count == 0:
                stream.height, stream.width = arr.shape[:2]
                stream.pix_fmt = "yuv420p"
                if rotation is not None:
                    stream.set_display_rotation(rotation)
            rgb = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            if pts_ms is not None:
                rgb.pts = int(pts_ms[count])
                rgb.time_base = Fraction(1, 1000)
            for packet in stream.encode(rgb):
                container.mux(packet)
            count += 1
        if count == 0:
            raise ValueError("encode_test_video needs at least one frame")
        for packet in stream.encode(None):
            container.mux(packet)
