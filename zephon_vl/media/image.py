"""Image decode, resize and patch layout for Qwen2-VL style vision encoders (and others).

The settings choose the size rule (``resize``: Qwen's pixel budget, or
Kimi's patch budget with padding) and the patch row order (``patch_order``:
Qwen's merge blocks, or raster); a model family's preset picks them
(:mod:`zephon_vl.families`).

One call, :func:`process_image`, turns encoded bytes into the patch rows a
Qwen2-VL / TorchTitan ``qwen3_5`` vision tower eats: ``pixel_values`` of shape
``[grid_t * grid_h * grid_w, 3 * temporal_patch * patch * patch]`` plus
``grid_thw``. The size rule (:func:`smart_resize`), resampling (PIL bicubic),
RGB conversion (alpha composited on white) and element order follow
transformers' ``Qwen2VLImageProcessorPil``. Like it, we do not apply EXIF
orientation.

Agreement with transformers (tests/test_image.py): ``grid_thw`` is exact;
``pixel_values`` are asserted within max abs 1e-5 and mean abs 1e-6 after
normalization. Both sides resize with the same PIL build and normalize with
the same float64-rescale / float32-normalize arithmetic, so the measured
difference is 0.0 on every test photo; the bound only leaves room for a
float rounding change upstream.

Normalization is a 256-entry lookup table per channel. The worker path
("worker") and the collate path ("collate": uint8 rows, then
:func:`normalize_patches`) index the same table, so they agree bit for bit,
and uint8 rows are 4x smaller to move between processes. A still image's
``temporal_patch`` frames are identical, so the pipeline's workers ship one
(``one_frame=True``) and :func:`patch_rows` repeats it while normalizing in
the collate: the same float32 rows, from half the bytes.
"""

from __future__ import annotations

import functools
import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFile, ImageOps

from zephon_core import BadSampleError, ConfigError
from zephon_core.extend import check_settings, setting, settings_fingerprint
from zephon_vl.media.geometry import (  # noqa: F401  (the geometry's public names, here too)
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    PATCH_ORDERS,
    RESIZE_RULES,
    VisionPatches,
    patch_budget_resize,
    smart_resize,
)

__all__ = [
    "ImageSettings",
    "VisionPatches",
    "decode_rgb",
    "normalization_table",
    "normalize_patches",
    "open_image",
    "pad_frames",
    "patch_rows",
    "frame_rows_uint8",
    "patch_budget_resize",
    "patchify",
    "pillow_backend",
    "process_image",
    "smart_resize",
    "warn_if_not_simd",
]


#: Sample member (and image file) extensions that hold an image: what the shard
#: writer packs, and what the decoder looks for in a sample. A GIF is its first
#: frame (an animated GIF is not read as a clip), a multi-page TIFF its first page.
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")

Image.init()
#: Formats we try to open. PIL would otherwise probe dozens of exotic plugins,
#: EPS among them (which runs Ghostscript): slower, and an attack surface.
IMAGE_FORMATS = tuple(
    f
    for f in ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "PPM", "AVIF", "QOI", "TGA")
    if f in Image.OPEN
)

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


@functools.cache
def pillow_backend() -> str:
    """``"pillow-simd"`` if the PIL that is imported is the SIMD fork, else ``"pillow"``.

    The imported module decides, not package metadata: both distributions may
    be registered while only one owns the files (see scripts/setup.sh).
    pillow-simd tags its releases "X.Y.Z.postN"; Pillow never does.
    """
    return "pillow-simd" if ".post" in Image.__version__ else "pillow"


_warned_not_simd = False


def warn_if_not_simd() -> None:
    """Warn once per process when plain Pillow (about 5x slower resize) is active."""
    global _warned_not_simd
    if _warned_not_simd:
        return
    _warned_not_simd = True
    if pillow_backend() != "pillow-simd":
        warnings.warn(
            "zephon_vl: plain Pillow is active; install pillow-simd built with AVX2 "
            '(CC="cc -mavx2" pip install pillow-simd) for about 5x faster resizing',
            RuntimeWarning,
            stacklevel=2,
        )


@dataclass(frozen=True)
class ImageSettings:
    """Everything that decides the bytes of an image's patch rows (a recipe's ``[image]``).

    ``settings()`` goes into checkpoint fingerprints: changing any field
    changes the training data, so a resume must refuse it.
    """

    patch_size: int = setting(14, min=1, unit="pixels", help="side of one square patch")
    merge_size: int = setting(2, min=1, unit="patches", help="patches per side merged into one "
                              "vision token (the token covers merge_size x merge_size)")
    temporal_patch_size: int = setting(2, min=1, unit="frames", help="frames in one patch (a still "
                                       "image repeats its one frame)")
    min_pixels: int = setting(56 * 56, min=1, unit="pixels", help="smallest image area (smaller "
                              "ones are scaled up)")
    max_pixels: int = setting(28 * 28 * 1280, min=1, unit="pixels", help="largest image area "
                              "(larger ones are scaled down)")
    draft: bool = setting(False, help="decode JPEGs at a reduced DCT scale when the target "
                          "is at most half the source on each side: faster and deterministic "
                          "(the scale depends only on the header size and the target), but "
                          "pixels differ slightly from a full decode")
    normalize: str = setting(
        "collate", choices=("collate", "worker", "device"),
        help="where pixels are normalized: collate (workers ship uint8 rows, 4x fewer bytes), "
        "worker (float32 rows from the worker) or device (the batch carries uint8 rows and "
        "the table; zephon_vl.ops.device.to_device normalizes on the accelerator)")
    image_mean: tuple[float, float, float] = setting(
        OPENAI_CLIP_MEAN, help="per-channel mean (RGB) subtracted after scaling to [0, 1]")
    image_std: tuple[float, float, float] = setting(
        OPENAI_CLIP_STD, help="per-channel standard deviation (RGB) divided by")
    max_image_pixels: int = setting(64_000_000, unit="pixels", min=1, help="refuse images whose "
                                    "header claims more pixels, before decoding them")
    resample: str = setting("bicubic", choices=tuple(sorted(_RESAMPLE)),
                            help="the resize filter (PIL)")
    exif_transpose: bool = setting(
        True, help="turn the image upright by its EXIF orientation first, as cameras record "
        "it and as transformers' load_image does; the patch grid follows the upright size")
    patch_order: str = setting(
        "block", since="0.3.0", choices=PATCH_ORDERS,
        help="the row order of the patches: block (Qwen-VL's merge blocks) or raster")
    resize: str = setting(
        "pixels", since="0.3.0", choices=RESIZE_RULES,
        help="the size rule: pixels (smart_resize within min_pixels/max_pixels) or patches "
        "(patch_budget_resize within max_patches and max_patches_per_side, padded)")
    max_patches: int = setting(
        16384, min=1, since="0.3.0", unit="patches",
        help="with resize = patches: the most patches an image (or video frame) keeps")
    max_patches_per_side: int = setting(
        512, min=1, since="0.3.0", unit="patches",
        help="with resize = patches: the most patches a side keeps (the encoder's position "
        "grid)")

    def __post_init__(self) -> None:
        check_settings(self)  # choices and bounds, from the declarations
        if self.max_pixels < self.min_pixels:
            raise ConfigError(
                f"ImageSettings.max_pixels ({self.max_pixels}) < min_pixels ({self.min_pixels})"
            )
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise ConfigError("ImageSettings.image_mean/image_std need 3 values, std > 0")
        # Normalize list inputs to tuples so the dataclass stays hashable.
        object.__setattr__(self, "image_mean", tuple(float(x) for x in self.image_mean))
        object.__setattr__(self, "image_std", tuple(float(x) for x in self.image_std))

    @property
    def factor(self) -> int:
        """Side lengths are multiples of this: one merged token covers factor x factor pixels."""
        return self.patch_size * self.merge_size

    def settings(self) -> dict:
        """JSON-able view of every field, for checkpoint fingerprints: the geometry fields
        added in 0.3.0 (declared ``since``) only where they differ from their defaults, so
        the fingerprints of checkpoints written before them stay valid."""
        return settings_fingerprint(self)


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


_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I")


def to_rgb(img: Image.Image) -> Image.Image:
    """RGB, compositing transparency on white (as transformers does).

    16-bit greyscale (PIL modes ``I;16`` and ``I``) is scaled to 8 bits; PIL's
    own conversion clips it, which turns most of such a picture white.
    """
    if img.mode == "RGB":
        return img
    if img.mode in _SIXTEEN_BIT:
        wide = np.asarray(img, dtype=np.uint32)
        return Image.fromarray(((np.minimum(wide, 65535) + 128) // 257).astype(np.uint8),
                               "L").convert("RGB")
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", img.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


#: EXIF orientations that swap width and height (transpose, 90 and 270 degree turns)
_SWAPS_SIDES = (5, 6, 7, 8)


def _orientation(img: Image.Image, settings: ImageSettings) -> int:
    if not settings.exif_transpose:
        return 1
    try:
        value = img.getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001 - a damaged EXIF block is no orientation
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def target_size(
    height: int, width: int, settings: ImageSettings, where: str, max_pixels: int | None = None
) -> tuple[int, int]:
    """The resize target by the settings' rule (`RESIZE_RULES`); ValueErrors become
    BadSampleError. `max_pixels` (a video's per-frame budget) replaces the settings'
    under the "pixels" rule; the "patches" rule has its patch budget for every frame."""
    if height < 1 or width < 1:
        raise BadSampleError("image_too_small", where, f"{width}x{height}")
    try:
        if settings.resize == "patches":  # no aspect limit: TorchTitan's rule has none
            return patch_budget_resize(height, width, settings.patch_size,
                                       settings.max_patches, settings.max_patches_per_side)
        budget = settings.max_pixels if max_pixels is None else max_pixels
        th, tw = smart_resize(height, width, settings.factor, settings.min_pixels, budget)
    except ValueError as e:
        raise BadSampleError("bad_aspect_ratio", where, f"{width}x{height}: {e}") from None
    if th < 1 or tw < 1:
        raise BadSampleError("image_too_small", where, f"{width}x{height} -> {tw}x{th}")
    return th, tw


def resize_rgb(img: Image.Image, th: int, tw: int, settings: ImageSettings) -> np.ndarray:
    """One PIL resize to (tw, th), returned as a HWC uint8 array."""
    if img.size != (tw, th):
        img = img.resize((tw, th), resample=_RESAMPLE[settings.resample])
    return np.asarray(img)


def content_kind(data: bytes) -> str:
    """What bytes that are no image are, without any of them (``4,120 bytes of text``):
    a message, a drop detail and the ledger may be read by others than the data's owner,
    and the file may be anything a record named."""
    head = data[:4096]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:  # a character cut at the end of the head is still text
        text = head[:e.start].decode("utf-8") if e.start >= len(head) - 3 else None
    printable = text is not None and all(c.isprintable() or c in "\t\r\n" for c in text)
    return f"{len(data):,} bytes of {'text' if printable else 'binary data'}"


def open_image(data: bytes, settings: ImageSettings, where: str) -> Image.Image:
    """Open lazily (header only) and refuse bombs before any pixel is decoded."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise ConfigError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True: truncated images would be "
            "padded with grey instead of dropped; set it back to False"
        )
    if not data:
        raise BadSampleError("corrupt_image", where, "empty input")
    try:
        # PIL warns (rather than raises) between 1x and 2x its own pixel limit; make
        # that an error here. catch_warnings swaps a global filter list: racing
        # threads can at worst leave this one filter installed, which is harmless.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise BadSampleError("decompression_bomb", where, str(e)) from None
    except Image.UnidentifiedImageError:  # its message holds an object address: not stable
        raise BadSampleError("corrupt_image", where, f"{content_kind(data)}, not a "
                             "supported image format") from None
    except MemoryError:
        raise
    except Exception as e:  # any PIL failure to parse a header is a bad file
        raise BadSampleError("corrupt_image", where, f"{type(e).__name__}: {e}") from None
    w, h = img.size
    if w * h > settings.max_image_pixels:
        limit = settings.max_image_pixels
        detail = f"header claims {w}x{h} = {w * h} pixels > max_image_pixels {limit}"
        raise BadSampleError("decompression_bomb", where, detail)
    if w < 1 or h < 1:
        raise BadSampleError("image_too_small", where, f"{w}x{h}")
    return img


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


def process_image(data: bytes, settings: ImageSettings, where: str = "?",
                  one_frame: bool = False) -> VisionPatches:
    """Encoded image bytes -> patch rows; bad input raises BadSampleError, never a PIL error.

    `one_frame`: rows of one frame, to be repeated by `patch_rows` (see `finish_patches`).
    """
    warn_if_not_simd()
    img = open_image(data, settings, where)
    orientation = _orientation(img, settings)
    w, h = img.size
    if orientation in _SWAPS_SIDES:
        w, h = h, w
    th, tw = target_size(h, w, settings, where)
    arr = resize_rgb(decode_rgb(img, th, tw, settings, where), th, tw, settings)
    return finish_patches(arr[None], settings, one_frame)


def decode_rgb(img: Image.Image, th: int, tw: int, settings: ImageSettings,
               where: str) -> Image.Image:
    """Decode an `open_image` result to RGB, for a resize to (th, tw) next.

    With `settings.draft`, a JPEG at least twice the target on each side is
    decoded at a reduced DCT scale. The image is then turned upright by its EXIF
    orientation (`settings.exif_transpose`), so (th, tw) is the upright size.
    A decode failure raises BadSampleError.
    """
    orientation = _orientation(img, settings)
    sw, sh = (th, tw) if orientation in _SWAPS_SIDES else (tw, th)
    w, h = img.size
    try:
        if settings.draft and img.format in ("JPEG", "MPO") and 2 * sw <= w and 2 * sh <= h:
            img.draft("RGB", (sw, sh))
        img.load()  # force the lazy decode here so truncation surfaces now
        if orientation != 1:
            img = ImageOps.exif_transpose(img)
        rgb = to_rgb(img)
    except MemoryError:
        raise
    except Exception as e:
        raise BadSampleError("corrupt_image", where, f"{type(e).__name__}: {e}") from None
    if rgb.width < 1 or rgb.height < 1:
        raise BadSampleError("image_too_small", where, f"decoded {rgb.width}x{rgb.height}")
    return rgb
