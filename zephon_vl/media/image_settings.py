"""The settings of image decode, resize and patch layout (`ImageSettings`).

A model family's preset picks them (:mod:`zephon_vl.families`); the decode
(:mod:`zephon_vl.media.image`) and the patch layout
(:mod:`zephon_vl.media.patches`) read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from zephon_core import ConfigError
from zephon_core.extend import check_settings, setting, settings_fingerprint
from zephon_vl.media.geometry import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    PATCH_ORDERS,
    RESIZE_RULES,
)

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


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
