"""Patch layout and normalization: uint8 frames -> the patch rows a vision tower eats.

The worker lays out rows (`finish_patches`, `patchify`); the collate path
normalizes uint8 rows with the same 256-entry table per channel
(`normalize_patches`, `patch_rows`), or keeps uint8 frames for the device to
normalize (`frame_rows_uint8`). See :mod:`zephon_vl.media.image`'s docstring.
"""

from __future__ import annotations

import functools

import numpy as np

from zephon_vl.media.geometry import VisionPatches
from zephon_vl.media.image_settings import ImageSettings


def pad_frames(frames: np.ndarray, settings: ImageSettings) -> np.ndarray:
    """uint8 ``[F, H, W, 3]`` padded with zeros (black) right and bottom to multiples of
    ``settings.factor`` (the "patches" rule); returned as is when already there."""
    f, h, w, c = frames.shape
    ph, pw = -h % settings.factor, -w % settings.factor
    if not ph and not pw:
        return frames
    out = np.zeros((f, h + ph, w + pw, c), dtype=frames.dtype)
    out[:, :h, :w] = frames
    return out


@functools.lru_cache(maxsize=16)
def normalization_table(settings: ImageSettings) -> np.ndarray:
    """The read-only float32 ``[3 * 256]`` table that normalizes uint8 value v of channel c."""
    return _lut(settings.image_mean, settings.image_std)


def _lut(mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """[3 * 256] float32: entry c*256 + v is uint8 v of channel c, rescaled and normalized.

    Same arithmetic as transformers (float64 rescale, cast to float32, float32
    (x - mean) / std), so a table lookup reproduces it bit for bit.
    """
    x = (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32)
    m = np.asarray(mean, dtype=np.float32)[:, None]
    s = np.asarray(std, dtype=np.float32)[:, None]
    lut = ((x[None, :] - m) / s).reshape(-1)
    lut.setflags(write=False)
    return lut


_CHANNEL_OFFSET = (np.arange(3, dtype=np.uint16) * 256)[None, :, None]


def normalize_patches(pixel_values_uint8: np.ndarray, settings: ImageSettings) -> np.ndarray:
    """uint8 patch rows ``[N, 3*K]`` -> float32 normalized rows.

    The channel is the slowest axis of a row, so row[c*K:(c+1)*K] is channel c.
    One gather from a 768-entry table (uint16 index = c*256 + v) was the fastest
    of the numpy variants we timed, about 2 ns per value.
    """
    if pixel_values_uint8.dtype != np.uint8:
        raise TypeError(f"normalize_patches expects uint8, got {pixel_values_uint8.dtype}")
    n, d = pixel_values_uint8.shape
    lut = _lut(settings.image_mean, settings.image_std)
    return lut[pixel_values_uint8.reshape(n, 3, d // 3) + _CHANNEL_OFFSET].reshape(n, d)


def _patchify(frames: np.ndarray, p: int, m: int, tp: int, order: str = "block") -> np.ndarray:
    """uint8 ``[F, H, W, 3]`` -> uint8 rows ``[F/tp * gh * gw, 3 * tp * p * p]``; F == 1 repeats.

    `order` "raster" is block order with merge size 1: every patch its own block."""
    if order == "raster":
        m = 1
    f, h, w, c = frames.shape
    if f != 1 and f % tp:
        raise ValueError(f"frame count {f} is neither 1 nor a multiple of {tp}")
    gh, gw = h // p, w // p
    gt = max(1, f // tp)
    # Planar (channel-first) frames, then each p-pixel run of a patch row is one
    # opaque p-byte item: the 8-D reorder below moves 14-byte items instead of
    # single bytes, which made it about 1.6x faster than a plain uint8 transpose.
    chw = np.ascontiguousarray(frames.transpose(0, 3, 1, 2)).view(np.dtype((np.void, p)))
    x = chw.reshape(f, c, gh // m, m, p, gw // m, m)  # (F, C, bh, mh, ph, bw, mw) of runs
    if f == 1:
        x = np.broadcast_to(x, (tp, *x.shape[1:]))
    x = x.reshape(gt, tp, *x.shape[1:])
    # (gt, T, C, bh, mh, ph, bw, mw) -> (gt, bh, bw, mh, mw, C, T, ph)
    rows = np.ascontiguousarray(x.transpose(0, 3, 6, 4, 7, 2, 1, 5))
    return rows.view(np.uint8).reshape(gt * gh * gw, c * tp * p * p)


def patchify(frames: np.ndarray, settings: ImageSettings) -> np.ndarray:
    """uint8 ``[F, H, W, 3]`` (F = 1 or a multiple of T) -> uint8 rows ``[gt*gh*gw, 3*T*P*P]``.

    Row order (``settings.patch_order``) is "block": (t, h-block, w-block,
    h-in-block, w-in-block), the merge_size x merge_size patches of one LLM
    token consecutive, as transformers lays them out; or "raster": (t, h, w).
    Each row is (channel, temporal, py, px). A single frame is repeated over
    the temporal axis, as transformers does.
    """
    return _patchify(frames, settings.patch_size, settings.merge_size,
                     settings.temporal_patch_size, settings.patch_order)


def finish_patches(frames: np.ndarray, settings: ImageSettings,
                   one_frame: bool = False) -> VisionPatches:
    """Lay out uint8 frames and normalize them if the settings say the worker does it.

    With `one_frame`, a single frame is not repeated over the temporal axis:
    half the bytes to lay out, move between processes and hold until collate.
    """
    p, m, tp = settings.patch_size, settings.merge_size, settings.temporal_patch_size
    order = settings.patch_order
    if settings.resize == "patches":
        frames = pad_frames(frames, settings)
    f, h, w, _ = frames.shape
    if one_frame and f == 1:
        rows = _patchify(frames, p, m, 1, order)
        if settings.normalize == "worker":
            rows = normalize_patches(rows, settings)
    elif settings.normalize != "worker":
        rows = _patchify(frames, p, m, tp, order)
    elif f == 1:  # normalize one copy, then repeat it: half the table lookups
        one = normalize_patches(_patchify(frames, p, m, 1, order), settings)
        n, k = one.shape[0], one.shape[1] // 3
        rows = np.broadcast_to(one.reshape(n, 3, 1, k), (n, 3, tp, k)).reshape(n, 3 * tp * k)
    else:
        rows = normalize_patches(_patchify(frames, p, m, tp, order), settings)
    grid = np.array([max(1, f // tp), h // p, w // p], dtype=np.int64)
    return VisionPatches(pixel_values=rows, grid_thw=grid)




def _rows_out(items: list[np.ndarray], settings: ImageSettings, dtype: type,
              out: np.ndarray | None) -> np.ndarray:
    """The ``[patches, 3, T, P*P]`` view to write into: `out` (caller-allocated, e.g. pinned
    memory) checked for shape and dtype, or a new array."""
    tp, k = settings.temporal_patch_size, settings.patch_size ** 2
    shape = (sum(len(x) for x in items), 3 * tp * k)
    if out is None:
        return np.empty((shape[0], 3, tp, k), dtype=dtype)
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous {np.dtype(dtype)} array of shape {shape}, "
                         f"got {out.dtype} {out.shape}")
    return out.reshape(shape[0], 3, tp, k)


def patch_rows(items: list[np.ndarray], settings: ImageSettings,
               out: np.ndarray | None = None) -> np.ndarray:
    """Patch rows of several images/videos -> one float32 ``[patches, 3*T*P*P]`` array.

    Takes uint8 or float32 rows, of T frames or of one frame (``one_frame``),
    normalizes uint8 and repeats one frame over the temporal axis while
    writing the output, so a one-frame image costs half the table lookups.
    uint8 rows are looked up straight into the output, one channel at a time
    (no float32 temporary): the output is written once. `out`: the array to
    write (C-contiguous float32 ``[patches, 3*T*P*P]``), e.g. pinned memory.
    """
    tp, k = settings.temporal_patch_size, settings.patch_size ** 2
    dest = _rows_out(items, settings, np.float32, out)
    lut = normalization_table(settings).reshape(3, 256)
    at = 0
    for x in items:
        n = len(x)
        if x.shape[1] not in (3 * k, 3 * tp * k):
            raise ValueError(f"patch rows of width {x.shape[1]} are neither one frame "
                             f"({3 * k}) nor {tp} frames ({3 * tp * k})")
        frames = x.shape[1] // (3 * k)
        block = dest[at:at + n]
        if x.dtype == np.uint8:
            src = x.reshape(n, 3, frames, k)
            for c in range(3):
                for t in range(frames):
                    np.take(lut[c], src[:, c, t], out=block[:, c, t], mode="clip")
            if frames == 1:
                block[:, :, 1:] = block[:, :, :1]
        else:
            block[:] = x.reshape(n, 3, frames, k)
        at += n
    return dest.reshape(len(dest), 3 * tp * k)


def frame_rows_uint8(items: list[np.ndarray], settings: ImageSettings,
                     out: np.ndarray | None = None) -> tuple[np.ndarray, list[int]]:
    """uint8 patch rows of several images/videos -> their frames, and each item's frames
    per patch row.

    Every patch row gives one uint8 ``[3*P*P]`` row per frame it holds, in
    temporal order: a still image's single frame once (not repeated over the
    temporal axis: half the bytes through the collate and the copy to the
    device), each of a video's T frames. ``zephon_vl.ops.device.patch_rows_from_frames``
    makes the ``[patches, 3*T*P*P]`` rows of `patch_rows` from them, on any
    device. `out`: a C-contiguous uint8 ``[frames, 3*P*P]`` array to write into
    (frames = total bytes of `items` / (3*P*P)), e.g. pinned memory.
    """
    tp, k = settings.temporal_patch_size, settings.patch_size ** 2
    width = 3 * k
    total = sum(x.size for x in items) // width
    if out is None:
        out = np.empty((total, width), dtype=np.uint8)
    elif out.shape != (total, width) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous uint8 array of shape {(total, width)}, "
                         f"got {out.dtype} {out.shape}")
    frames, at = [], 0
    for x in items:
        if x.dtype != np.uint8 or x.shape[1] not in (width, tp * width):
            raise ValueError(f"expected uint8 patch rows of width {width} or {tp * width}, got "
                             f"{x.dtype} rows of width {x.shape[1]}")
        n, t = len(x), x.shape[1] // width
        out[at:at + n * t].reshape(n, t, 3, k)[:] = x.reshape(n, 3, t, k).transpose(0, 2, 1, 3)
        frames.append(t)
        at += n * t
    return out, frames


