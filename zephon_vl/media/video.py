"""Video clips -> Qwen2-VL temporal patch rows, decoded with PyAV from memory.

Frames are picked by :func:`sample_frame_indices`, a pure function of the
frame count, the native frame rate and the settings, so the same bytes give
the same rows on every rank and every run. Every frame is resized (one PIL
bicubic call) to the single smart_resize target of the first frame, and
consecutive groups of ``temporal_patch_size`` frames form one temporal patch,
in transformers' Qwen2-VL video element order (see ``image.patchify``).
"""

from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass
from fractions import Fraction

import av
import numpy as np

from zephon_core import BadSampleError, ConfigError
from zephon_vl.media.image import (
    ImageSettings,
    VisionPatches,
    finish_patches,
    resize_rgb,
    target_size,
    warn_if_not_simd,
)

__all__ = ["VideoSettings", "process_video", "sample_frame_indices"]


@dataclass(frozen=True)
class VideoSettings:
    """Frame sampling of video clips (part of the checkpoint fingerprint)."""

    fps: float = 2.0
    max_frames: int = 16
    #: Rounded up to a multiple of temporal_patch_size; clips with fewer frames
    #: keep all of theirs (no frame is invented beyond the temporal padding).
    min_frames: int = 2
    #: Per-frame pixel budget; None uses the image settings' max_pixels.
    max_pixels_per_frame: int | None = None

    def __post_init__(self) -> None:
        if not (self.fps > 0 and math.isfinite(self.fps)):
            raise ConfigError(f"VideoSettings.fps must be a positive number, got {self.fps}")
        if self.max_frames < 1 or self.min_frames < 1 or self.min_frames > self.max_frames:
            raise ConfigError(
                f"VideoSettings needs 1 <= min_frames <= max_frames, got "
                f"{self.min_frames}, {self.max_frames}"
            )
        if self.max_pixels_per_frame is not None and self.max_pixels_per_frame < 1:
            raise ConfigError("VideoSettings.max_pixels_per_frame must be >= 1")

    def settings_dict(self) -> dict:
        """JSON-able view of every field, for checkpoint fingerprints."""
        return asdict(self)


def sample_frame_indices(
    num_frames: int, native_fps: float | None, settings: VideoSettings, temporal_patch: int
) -> list[int]:
    """Indices of the frames to keep, evenly spaced, len a multiple of temporal_patch.

    The count is the number of ticks of the target fps within the clip
    (ceil(duration * fps)), clamped to [min_frames, max_frames] (both rounded to
    multiples of temporal_patch, max down and min up) and to num_frames. Indices
    are ``i * num_frames // count`` (integer arithmetic: no float drift), so a
    capped clip is spread over its whole duration. The list is padded with its
    last index up to a multiple of temporal_patch. An unknown or non-positive
    native_fps counts as equal to the target fps.
    """
    if num_frames <= 0:
        return []
    tp = temporal_patch
    max_n = max(tp, settings.max_frames // tp * tp)
    min_n = min(max_n, -(-settings.min_frames // tp) * tp)
    if native_fps is None or not native_fps > 0 or not math.isfinite(native_fps):
        ticks = num_frames
    else:
        # Fraction keeps e.g. 30000/1001 fps exact; the ceil is then exact too.
        target = Fraction(settings.fps).limit_denominator(10**6)
        native = Fraction(native_fps).limit_denominator(10**6)
        ticks = math.ceil(num_frames * target / native)
    count = min(max(ticks, min_n), max_n, num_frames)
    indices = [i * num_frames // count for i in range(count)]
    indices += [indices[-1]] * (-count % tp)
    return indices


def _native_fps(stream: av.video.stream.VideoStream) -> float | None:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return float(rate) if rate else None


def _decode(
    data: bytes,
    num_frames: int | None,
    image_settings: ImageSettings,
    video_settings: VideoSettings,
    where: str,
) -> tuple[int, list[int], np.ndarray | None]:
    """One decode pass: (frames seen, indices, uint8 [len(indices), H, W, 3] or None).

    `num_frames` None trusts the container's frame count; when it has none,
    the pass only counts frames and returns None for the array. The pass stops
    after the last wanted index, so ``seen <= indices[-1]`` means the header
    over-counted and `seen` is the true count.
    """
    tp = image_settings.temporal_patch_size
    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.video:
            raise BadSampleError("corrupt_video", where, "no video stream")
        stream = container.streams.video[0]
        n = stream.frames if num_frames is None else num_frames
        if n <= 0:
            return sum(1 for _ in container.decode(stream)), [], None
        indices = sample_frame_indices(n, _native_fps(stream), video_settings, tp)
        slots: dict[int, list[int]] = {}
        for slot, idx in enumerate(indices):
            slots.setdefault(idx, []).append(slot)
        out: np.ndarray | None = None
        th = tw = seen = 0
        for k, frame in enumerate(container.decode(stream)):
            seen = k + 1
            if k == 0:  # one target for the whole clip, from the first frame
                w, h = frame.width, frame.height
                if w * h > image_settings.max_image_pixels:
                    raise BadSampleError("decompression_bomb", where, f"frames are {w}x{h}")
                budget = video_settings.max_pixels_per_frame
                th, tw = target_size(h, w, image_settings, where, max_pixels=budget)
                out = np.empty((len(indices), th, tw, 3), dtype=np.uint8)
            if k in slots:
                arr = resize_rgb(frame.to_image(), th, tw, image_settings)
                for slot in slots[k]:
                    out[slot] = arr
            if k == indices[-1]:
                break
        return seen, indices, out


def process_video(
    data: bytes,
    image_settings: ImageSettings,
    video_settings: VideoSettings,
    where: str = "?",
) -> VisionPatches:
    """Encoded video bytes -> temporal patch rows; bad input raises BadSampleError."""
    warn_if_not_simd()
    if not data:
        raise BadSampleError("corrupt_video", where, "empty input")
    try:
        seen, indices, frames = _decode(data, None, image_settings, video_settings, where)
        if frames is None or seen <= indices[-1]:  # no or wrong count in the header
            if seen == 0:
                raise BadSampleError("corrupt_video", where, "no decodable frames")
            seen, indices, frames = _decode(data, seen, image_settings, video_settings, where)
            if frames is None or seen <= indices[-1]:
                raise BadSampleError("corrupt_video", where, "frame count changed between passes")
    except (BadSampleError, MemoryError):
        raise
    except Exception as e:  # PyAV / FFmpeg / PIL failures on bad bytes
        raise BadSampleError("corrupt_video", where, f"{type(e).__name__}: {e}") from None
    return finish_patches(frames, image_settings)
