"""Video clips -> Qwen2-VL temporal patch rows, decoded with PyAV.

Frames are picked by :func:`sample_frame_indices`, a pure function of the
frame count, the native frame rate and the settings, so the same bytes give
the same rows on every rank and every run. Every frame is resized (one PIL
bicubic call) to the single smart_resize target of the first frame, and
consecutive groups of ``temporal_patch_size`` frames form one temporal patch,
in transformers' Qwen2-VL video element order (see ``image.patchify``).

How the kept frames are reached is `VideoSettings.decode`: ``"sequential"``
decodes every frame up to the last kept one; ``"seek"`` jumps to the keyframe
before each kept frame and decodes forward from there; ``"auto"`` (default)
picks one from the container's packet index (a demux pass: presentation
times and keyframe flags, no decoding), never from timing. Both give the
same frames with the same pixels (the seek path checks every decoded frame's
timestamp against the index and falls back to sequential on any surprise), so
the strategy is not part of the fingerprint. See docs/video.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

import av
import numpy as np

from zephon_core import BadSampleError, ConfigError
from zephon_core.extend import (
    StoredFileIO,
    check_choices,
    is_remote,
    local_path,
    open_shard,
    scheme_of,
    setting,
)
from zephon_vl.media.files import file_kind, path_fault, real_inside
from zephon_vl.media.image import (
    ImageSettings,
    VisionPatches,
    finish_patches,
    resize_rgb,
    target_size,
    warn_if_not_simd,
)
from zephon_vl.media.video_index import (
    Source,
    Surprise,
    VideoIndex,
    decode_plan,
    native_fps,
    open_source,
    read_video_index,
)

__all__ = ["VIDEO_DECODE", "VideoIndex", "VideoSettings", "decode_frames", "decode_plan",
           "open_video_reference", "process_indexed_video", "process_video", "read_video_index",
           "read_video_reference", "sample_frame_indices", "video_location"]

#: How `process_video` reaches the kept frames (`VideoSettings.decode`).
VIDEO_DECODE = ("auto", "seek", "sequential")
#: "auto" seeks when the plan decodes at most this share of the frames sequential would.
SEEK_SHARE = 0.8


@dataclass(frozen=True)
class VideoSettings:
    """Frame sampling of video clips (a recipe's ``[video]``; the checkpoint fingerprint)."""

    fps: float = setting(2.0, unit="fps", help="frames kept per second of the clip")
    max_frames: int = setting(16, unit="frames", help="the most frames a clip keeps (rounded "
                              "down to a multiple of temporal_patch_size), spread over its "
                              "whole duration")
    min_frames: int = setting(2, unit="frames", help="the fewest frames a clip keeps (rounded "
                              "up to a multiple of temporal_patch_size); a clip with fewer "
                              "keeps all of its own, none invented beyond the temporal padding")
    max_pixels_per_frame: int | None = setting(
        None, unit="pixels", help="per-frame pixel budget (none: the image settings' "
        "max_pixels)")
    decode: str = setting(
        "auto", choices=VIDEO_DECODE, help="how kept frames are reached: seek, sequential, or "
        "auto (seek when it decodes clearly fewer frames). Never changes which frames are "
        "kept or their pixels: not in the fingerprint")
    decoder_threads: int = setting(
        1, unit="threads", help="FFmpeg decoder threads per worker process: workers already "
        "fill the rank's cores, so 1 keeps the pool within its budget; more helps when "
        "workers < cores. Pixels are bit-identical at any count: not in the fingerprint")
    video_folder: str | None = setting(
        None, help="where samples' referenced videos live ({\"video\": \"clips/a.mp4\"}, as "
        "TorchTitan's video_dir or LLaVA-Video's video_folder): a local folder or a URL "
        "prefix (s3://bucket/videos), read through zephon_core's storage. In the fingerprint "
        "when set")

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
        check_choices(self)
        if self.video_folder is not None and not (isinstance(self.video_folder, str)
                                                  and self.video_folder):
            raise ConfigError("VideoSettings.video_folder must be a non-empty path or URL")
        if self.decoder_threads < 1:
            raise ConfigError("VideoSettings.decoder_threads must be >= 1, got "
                              f"{self.decoder_threads}")

    def settings(self) -> dict:
        """JSON-able view of the fields that decide the rows, for checkpoint fingerprints.

        `decode` and `decoder_threads` change speed only, so they are left out;
        `video_folder` is in when set.
        """
        d = asdict(self)
        del d["decode"], d["decoder_threads"]
        if self.video_folder is None:  # fingerprints of clips carried in the tar stay as they were
            del d["video_folder"]
        return d


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



def _threads(stream: av.video.stream.VideoStream, settings: VideoSettings) -> None:
    ctx = stream.codec_context
    ctx.thread_count = settings.decoder_threads
    ctx.thread_type = "AUTO" if settings.decoder_threads > 1 else "SLICE"


def _first_frame(frame: av.VideoFrame, n_out: int, image_settings: ImageSettings,
                 video_settings: VideoSettings, where: str) -> tuple[int, int, np.ndarray]:
    """One target for the whole clip, from its first frame."""
    w, h = frame.width, frame.height
    if w * h > image_settings.max_image_pixels:
        raise BadSampleError("decompression_bomb", where, f"frames are {w}x{h}")
    budget = video_settings.max_pixels_per_frame
    th, tw = target_size(h, w, image_settings, where, max_pixels=budget)
    return th, tw, np.empty((n_out, th, tw, 3), dtype=np.uint8)


def _slots(indices: list[int]) -> dict[int, list[int]]:
    """Frame -> the output slots it fills (a short clip repeats frames)."""
    slots: dict[int, list[int]] = {}
    for slot, idx in enumerate(indices):
        slots.setdefault(idx, []).append(slot)
    return slots


def _decode_sequential(
    source: Source,
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
    with open_source(source) as container:
        if not container.streams.video:
            raise BadSampleError("corrupt_video", where, "no video stream")
        stream = container.streams.video[0]
        _threads(stream, video_settings)
        n = stream.frames if num_frames is None else num_frames
        if n <= 0:
            return sum(1 for _ in container.decode(stream)), [], None
        indices = sample_frame_indices(n, native_fps(stream), video_settings, tp)
        slots = _slots(indices)
        out: np.ndarray | None = None
        th = tw = seen = 0
        for k, frame in enumerate(container.decode(stream)):
            seen = k + 1
            if k == 0:
                th, tw, out = _first_frame(frame, len(indices), image_settings,
                                           video_settings, where)
            if k in slots:
                arr = resize_rgb(frame.to_image(), th, tw, image_settings)
                for slot in slots[k]:
                    out[slot] = arr
            if k == indices[-1]:
                break
        return seen, indices, out


def _seek_plan(index: VideoIndex | None, image_settings: ImageSettings,
               video_settings: VideoSettings) -> tuple[list[int], list, VideoIndex, str] | str:
    """The kept indices and the seek plan, or why sequential decoding is the
    choice (no usable index, or "auto" and the plan saves too little).
    Depends only on the bytes and the settings."""
    if index is None:
        return "no usable packet index"
    indices = sample_frame_indices(len(index.pts), index.fps, video_settings,
                                   image_settings.temporal_patch_size)
    try:
        segments, cost, sequential = decode_plan(index, indices)
    except Surprise as e:
        return str(e)
    fed = f"the plan feeds {cost} packets, sequential {sequential}"
    if video_settings.decode == "auto" and cost > SEEK_SHARE * sequential:
        return f"dense: {fed}"
    return indices, segments, index, fed


class _SeekDecoder:
    """The seek path's state across segments: FFmpeg's pts offset (learnt from packet 0),
    the output array (sized at frame 0) and the slots each kept frame fills."""

    def __init__(self, indices: list[int], index: VideoIndex, image_settings: ImageSettings,
                 video_settings: VideoSettings, where: str) -> None:
        self.slots = _slots(indices)
        self.n_out, self.index, self.where = len(indices), index, where
        self.image_settings, self.video_settings = image_settings, video_settings
        self.where_pts = {p: k for k, p in enumerate(index.pts)}
        self.shift: int | None = None  # FFmpeg's pts minus the index's
        self.out: np.ndarray | None = None
        self.th = self.tw = 0

    def segment(self, container: av.container.InputContainer,
                stream: av.video.stream.VideoStream, key: int, frames: list[int]) -> None:
        """Decode from keyframe `key` through `frames[-1]`, checking every frame is the
        one the index predicts (a mismatch raises Surprise)."""
        key_pts = self.index.key_pts[self.index.keys.index(key)]
        if key != 0:
            assert self.shift is not None  # the first segment starts at packet 0
            container.seek(key_pts + self.shift, backward=True, any_frame=False, stream=stream)
        expect = self.where_pts[key_pts]
        first_packet = True
        for packet in container.demux(stream):
            if first_packet and packet.size:
                self._check_start(packet, key_pts)
                first_packet = False
            for frame in packet.decode():
                if frame.pts is None or self.shift is None:
                    raise Surprise("a frame without pts")
                if frame.pts < key_pts + self.shift:  # before the keyframe: stale or leading
                    continue
                k = self.where_pts.get(frame.pts - self.shift)
                if k != expect:
                    raise Surprise(f"decoded pts {frame.pts}, not frame {expect}'s")
                expect += 1
                self._keep(k, frame)
                if k == frames[-1]:
                    return
        raise Surprise(f"the clip ended before frame {frames[-1]}")

    def _check_start(self, packet: av.Packet, key_pts: int) -> None:
        """A segment's first packet must be the keyframe the seek aimed at."""
        if packet.pts is None or not packet.is_keyframe:
            raise Surprise("a segment does not start at a keyframe")
        if self.shift is None:
            self.shift = packet.pts - key_pts
        if packet.pts != key_pts + self.shift:
            raise Surprise(f"seek landed on pts {packet.pts}, not {key_pts + self.shift}")

    def _keep(self, k: int, frame: av.VideoFrame) -> None:
        """Size the output at frame 0; resize a kept frame into its slots."""
        if k == 0:
            self.th, self.tw, self.out = _first_frame(frame, self.n_out, self.image_settings,
                                                      self.video_settings, self.where)
        if k in self.slots:
            if self.out is None:
                raise Surprise("a kept frame before the first frame")
            arr = resize_rgb(frame.to_image(), self.th, self.tw, self.image_settings)
            for slot in self.slots[k]:
                self.out[slot] = arr


def _decode_seek(source: Source, indices: list[int], segments: list, index: VideoIndex,
                 image_settings: ImageSettings, video_settings: VideoSettings,
                 where: str) -> np.ndarray:
    """Decode each segment from its keyframe; raises Surprise where a decoded
    frame is not the one the index predicts (then the caller decodes sequentially)."""
    dec = _SeekDecoder(indices, index, image_settings, video_settings, where)
    with open_source(source) as container:
        stream = container.streams.video[0]
        _threads(stream, video_settings)
        for key, frames in segments:
            dec.segment(container, stream, key, frames)
    if dec.out is None:
        raise Surprise("the first frame was not decoded")
    return dec.out


def _decode_today(source: Source, image_settings: ImageSettings,
                  video_settings: VideoSettings, where: str) -> np.ndarray:
    """Sequential decoding, recounting the frames when the header's count is wrong."""
    seen, indices, frames = _decode_sequential(source, None, image_settings, video_settings,
                                               where)
    if frames is None or seen <= indices[-1]:  # no or wrong count in the header
        if seen == 0:
            raise BadSampleError("corrupt_video", where, "no decodable frames")
        seen, indices, frames = _decode_sequential(source, seen, image_settings,
                                                   video_settings, where)
        if frames is None or seen <= indices[-1]:
            raise BadSampleError("corrupt_video", where, "frame count changed between passes")
    return frames


def decode_frames(
    data: Source,
    image_settings: ImageSettings,
    video_settings: VideoSettings,
    where: str = "?",
) -> tuple[np.ndarray, str]:
    """The kept frames (uint8 ``[T, H, W, 3]``, resized) and how they were reached:
    ``"seek (mp4 index): <packets fed>"``, ``"seek (packet index): ..."``,
    ``"sequential"``, or ``"sequential: <why not seek>"``.

    Bad input raises BadSampleError. The frames do not depend on
    `video_settings.decode` or `decoder_threads` (see the module docstring).
    """
    return _decode_frames(data, image_settings, video_settings, where, None)


def _decode_frames(data: Source, image_settings: ImageSettings, video_settings: VideoSettings,
                   where: str, index: VideoIndex | None) -> tuple[np.ndarray, str]:
    """`decode_frames`, seeking with `index` where the caller read it already."""
    if isinstance(data, bytes | bytearray | memoryview) and not data:
        raise BadSampleError("corrupt_video", where, "empty input")
    how = "sequential"
    if video_settings.decode != "sequential":
        try:
            if index is None:
                index = read_video_index(data)
            plan = _seek_plan(index, image_settings, video_settings)
            if isinstance(plan, str):
                how = f"sequential: {plan}"
            else:
                frames = _decode_seek(data, *plan[:3], image_settings, video_settings, where)
                return frames, f"seek ({plan[2].source}): {plan[3]}"
        except (BadSampleError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - Surprise or a seek failure: decode as before
            how = f"sequential: {type(e).__name__}: {e}"
    try:
        return _decode_today(data, image_settings, video_settings, where), how
    except (BadSampleError, MemoryError):
        raise
    except Exception as e:  # PyAV / FFmpeg / PIL failures on bad bytes
        raise BadSampleError("corrupt_video", where, f"{type(e).__name__}: {e}") from None


def process_video(
    data: Source,
    image_settings: ImageSettings,
    video_settings: VideoSettings,
    where: str = "?",
) -> VisionPatches:
    """Encoded video (bytes, or a seekable binary file object) -> temporal patch rows.

    Bad input raises BadSampleError; see `decode_frames`.
    """
    return process_indexed_video(data, image_settings, video_settings, where, None)


def process_indexed_video(data: Source, image_settings: ImageSettings,
                          video_settings: VideoSettings, where: str,
                          index: VideoIndex | None) -> VisionPatches:
    """`process_video` seeking with the clip's index read before (a planned clip's: the
    index is a function of the bytes, so the pixels are the same; where the bytes changed
    since, a frame the index did not predict sends the decode down the sequential path,
    as for any seek); None reads it here."""
    warn_if_not_simd()
    frames, _ = _decode_frames(data, image_settings, video_settings, where, index)
    return finish_patches(frames, image_settings)


def video_location(ref: Any, video_folder: str | None, where: str = "?") -> str:
    """Where the video a sample names lives: `ref` joined to `video_folder`.

    `ref` is the sample's own content, so a bad one is a bad sample
    (``bad_video_ref``: not a non-empty relative path, or one that climbs out of
    the folder with ``..``; an absolute path or URL in a sample is refused, so
    a dataset cannot read files outside its folder). No `video_folder` is a
    configuration error.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise BadSampleError("bad_video_ref", where, f"'video' is {ref!r}, not a relative path")
    parts = ref.replace("\\", "/").split("/")
    if scheme_of(ref) or ref.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
        raise BadSampleError("bad_video_ref", where, f"'video' {ref!r} must be a path relative "
                             "to VideoSettings.video_folder, without '..'")
    if video_folder is None:
        raise ConfigError(f"{where} names the video {ref!r}, but VideoSettings.video_folder is "
                          "not set: set it (recipe video: {video_folder: <folder or URL>}) to "
                          "the folder the samples' video paths are relative to")
    if is_remote(video_folder):
        return f"{video_folder.rstrip('/')}/{ref}"
    location = os.path.join(video_folder, ref)
    if not real_inside(str(local_path(location)), str(local_path(video_folder))):
        raise BadSampleError("bad_video_ref", where, f"'video' {ref!r} leads out of "
                             "VideoSettings.video_folder through a symbolic link")
    return location


class _VideoFile(StoredFileIO):
    """A `StoredFileIO` that closes its stored file: one referenced video, read by range."""

    def close(self) -> None:
        self.stored.close()

    def __enter__(self) -> _VideoFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_regular_file(location: str, ref: str, where: str) -> None:
    """Refuse a local video that is no regular file, or a path no file can have."""
    try:
        kind = file_kind(os.stat(local_path(location)).st_mode)
    except OSError as exc:
        why = path_fault(exc)
        if why is None:
            raise
        raise BadSampleError("bad_video_ref", where, f"'video' {ref!r}: {why}") from None
    if kind is not None:
        raise BadSampleError("not_a_regular_file", where, f"'video' {ref!r} is a {kind}, "
                             "not a regular file; not read")


def open_video_reference(ref: Any, video_folder: str | None, where: str = "?") -> _VideoFile:
    """A seekable file object over the video a sample names (see `video_location`),
    for `process_video`: an MP4 is then read by range (its index, then the GOPs of
    the kept frames; see docs/video.md).

    A missing file raises FileNotFoundError naming the sample, the path and the
    folder: an I/O error stops the run, never a drop (the same sample would be
    dropped on one run and kept on another). Storage errors propagate as
    `zephon_core.data.storage` raises them (retried first).
    """
    location = video_location(ref, video_folder, where)
    try:
        if not is_remote(location):  # a FIFO would block the open, a device never end
            _check_regular_file(location, ref, where)
        return _VideoFile(open_shard(location))
    except BadSampleError as e:
        if e.reason != "missing_shard":
            raise
    except FileNotFoundError:
        pass
    raise FileNotFoundError(f"{where}: the video {ref!r} it names is not at {location} "
                            f"(VideoSettings.video_folder={video_folder!r}); fix the folder "
                            "setting, copy the video there, or remove the sample")


def read_video_reference(ref: Any, video_folder: str | None, where: str = "?") -> bytes:
    """All bytes of the video a sample names (see `open_video_reference`)."""
    with open_video_reference(ref, video_folder, where) as f:
        return f.read()
