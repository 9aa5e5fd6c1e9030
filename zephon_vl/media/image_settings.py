"""The settings of image decode, resize and patch layout (`ImageSettings`).

A model family's preset picks them (:mod:`zephon_vl.families`); the decode
(:mod:`zephon_vl.media.image`) and the patch layout
(:mod:`zephon_vl.media.patches`) read them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from PIL import Image

from zephon_core import ConfigError
from zephon_core.extend import check_choices, setting
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

    patch_size: int = setting(14, unit="pixels", help="side of one square patch")
    merge_size: int = setting(2, unit="patches", help="patches per side merged into one "
                              "vision token (the token covers merge_size x merge_size)")
    temporal_patch_size: int = setting(2, unit="frames", help="frames in one patch (a still "
                                       "image repeats its one frame)")
    min_pixels: int = setting(56 * 56, unit="pixels", help="smallest image area (smaller "
                              "ones are scaled up)")
    max_pixels: int = setting(28 * 28 * 1280, unit="pixels", help="largest image area "
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
    max_image_pixels: int = setting(64_000_000, unit="pixels", help="refuse images whose "
                                    "header claims more pixels, before decoding them")
    resample: str = setting("bicubic", choices=tuple(sorted(_RESAMPLE)),
                            help="the resize filter (PIL)")
    exif_transpose: bool = setting(
        True, help="turn the image upright by its EXIF orientation first, as cameras record "
        "it and as transformers' load_image does; the patch grid follows the upright size")
    patch_order: str = setting("block", choices=PATCH_ORDERS, help="the row order of the "
                               "patches: block (Qwen-VL's merge blocks) or raster")
    resize: str = setting(
        "pixels", choices=RESIZE_RULES, help="the size rule: pixels (smart_resize within "
        "min_pixels/max_pixels) or patches (patch_budget_resize within max_patches and "
        "max_patches_per_side, padded)")
    max_patches: int = setting(16384, unit="patches", help="with resize = patches: the most "
                               "patches an image (or video frame) keeps")
    max_patches_per_side: int = setting(512, unit="patches", help="with resize = patches: the "
                                        "most patches a side keeps (the encoder's position "
                                        "grid)")

    def __post_init__(self) -> None:
        for name in ("patch_size", "merge_size", "temporal_patch_size", "min_pixels"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ImageSettings.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_image_pixels < 1:
            raise ConfigError(
                f"ImageSettings.max_image_pixels must be >= 1, got {self.max_image_pixels}"
            )
        if self.max_pixels < self.min_pixels:
            raise ConfigError(
                f"ImageSettings.max_pixels ({self.max_pixels}) < min_pixels ({self.min_pixels})"
            )
        check_choices(self)
        if self.max_patches < 1 or self.max_patches_per_side < 1:
            raise ConfigError("ImageSettings.max_patches and max_patches_per_side must be "
                              f">= 1, got {self.max_patches} and {self.max_patches_per_side}")
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
        """JSON-able view of every field, for checkpoint fingerprints.

        The geometry fields added after the first release (`_LATER_FIELDS`) are
        left out while they hold their defaults, so the fingerprints of
        checkpoints written before them stay valid; any other value is in, and
        a resume with a different one is refused.
        """
        d = asdict(self)
        d["image_mean"] = list(self.image_mean)
        d["image_std"] = list(self.image_std)
        for name, default in _LATER_FIELDS.items():
            if d[name] == default:
                del d[name]
        return d


#: Fields that are in `ImageSettings.settings` only when they differ from these.
_LATER_FIELDS = {"patch_order": "block", "resize": "pixels", "max_patches": 16384,
                 "max_patches_per_side": 512}

