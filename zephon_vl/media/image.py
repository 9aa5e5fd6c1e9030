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

The module is the front of three: `image_settings` (`ImageSettings`),
`patches` (patch layout, normalization, the collate's rows) and the decode
here (open, orient, convert to RGB, resize); it offers all their names.
"""

from __future__ import annotations

import functools
import io
import warnings

import numpy as np
from PIL import Image, ImageFile, ImageOps

from zephon_core import BadSampleError, ConfigError
from zephon_vl.media.geometry import (  # noqa: F401  (the geometry's public names, here too)
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    PATCH_ORDERS,
    RESIZE_RULES,
    VisionPatches,
    patch_budget_resize,
    smart_resize,
)
from zephon_vl.media.image_settings import _RESAMPLE, ImageSettings
from zephon_vl.media.patches import (  # noqa: F401  (the patch layout's names, here too)
    finish_patches,
    frame_rows_uint8,
    normalization_table,
    normalize_patches,
    pad_frames,
    patch_rows,
    patchify,
)

__all__ = [
    "ImageSettings",
    "VisionPatches",
    "decode_rgb",
    "exif_orientation",
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
SWAPS_SIDES = (5, 6, 7, 8)


def exif_orientation(img: Image.Image, settings: ImageSettings, header_only: bool = False) -> int:
    """The EXIF orientation (1..8) the decode applies: 1 without `exif_transpose`, or for
    a missing or damaged tag. Pillow reads a PNG's chunks after its pixels (where EXIF
    may be) only by decoding it; `header_only` reads what the header has, never decoding
    (`header_geometry` uses it where no such chunk exists)."""
    if not settings.exif_transpose:
        return 1
    try:
        exif = Image.Image.getexif(img) if header_only else img.getexif()
        value = exif.get(0x0112, 1)
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
def process_image(data: bytes, settings: ImageSettings, where: str = "?",
                  one_frame: bool = False) -> VisionPatches:
    """Encoded image bytes -> patch rows; bad input raises BadSampleError, never a PIL error.

    `one_frame`: rows of one frame, to be repeated by `patch_rows` (see `finish_patches`).
    """
    warn_if_not_simd()
    img = open_image(data, settings, where)
    orientation = exif_orientation(img, settings)
    w, h = img.size
    if orientation in SWAPS_SIDES:
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
    orientation = exif_orientation(img, settings)
    sw, sh = (th, tw) if orientation in SWAPS_SIDES else (tw, th)
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
