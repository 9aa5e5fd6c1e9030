"""Vision geometry without pixels: how an image's size and patch grid are chosen
(`smart_resize`, `patch_budget_resize`), the patch rows' container (`VisionPatches`)
and the rule names `ImageSettings` validates. numpy and math only, no PIL."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

#: How an image's size is chosen (``ImageSettings.resize``): "pixels" = `smart_resize`
#: (sides multiples of patch x merge, area in [min_pixels, max_pixels], small images
#: scaled up: Qwen-VL); "patches" = `patch_budget_resize` (scale down, never up, to at
#: most ``max_patches`` patches and ``max_patches_per_side`` a side, then pad right and
#: bottom with black to a multiple of patch x merge: Kimi-VL / MoonViT).
RESIZE_RULES = ("pixels", "patches")
#: Row order of an image's patches (``ImageSettings.patch_order``): "block" = the
#: merge_size x merge_size patches of one LLM token are consecutive rows (Qwen-VL's
#: merger); "raster" = plain row-major (t, h, w) (encoders whose position embeddings
#: index ``row = p // w``: MoonViT, Muse Glimmer).
PATCH_ORDERS = ("block", "raster")


@dataclass
class VisionPatches:
    """Patch rows of one image or video, in the vision tower's input layout."""

    #: [t*h*w, 3*T*P*P], uint8 or float32; [h*w, 3*P*P] for a still image decoded with
    #: ``one_frame=True`` (its T identical frames are laid out later, by `patch_rows`)
    pixel_values: np.ndarray
    grid_thw: np.ndarray  # int64, shape (3,)

    @property
    def num_patches(self) -> int:
        return int(self.pixel_values.shape[0])

    def num_tokens(self, merge_size: int) -> int:
        """LLM placeholder tokens: each merge_size x merge_size patch block is one token."""
        t, h, w = (int(x) for x in self.grid_thw)
        return t * h * w // (merge_size * merge_size)


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Target (h, w): multiples of `factor`, area in [min_pixels, max_pixels], aspect kept.

    Same arithmetic (including Python's round-half-to-even and the order of
    float operations) as transformers' Qwen2-VL ``smart_resize``, so the grid
    and hence the token count match the reference exactly. Raises ValueError
    for an aspect ratio above 200, like the reference.
    """
    if height < 1 or width < 1:
        raise ValueError(f"image side must be >= 1, got {height}x{width}")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio {max(height, width) / min(height, width):.1f} > 200")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def patch_budget_resize(height: int, width: int, patch_size: int, max_patches: int,
                        max_patches_per_side: int) -> tuple[int, int]:
    """Target (h, w) of the "patches" rule: scaled down (never up, aspect kept) to at most
    `max_patches` patches of `patch_size` and `max_patches_per_side` a side.

    The result is not a multiple of the patch grid: the frames are padded with
    black right and bottom to a multiple of patch x merge afterwards
    (`pad_frames`). Same arithmetic as TorchTitan's ``resize_to_patch_budget``
    (float scale, ``int()`` truncation), so grids and token counts match it.
    """
    if height < 1 or width < 1:
        raise ValueError(f"image side must be >= 1, got {height}x{width}")
    patches = max(1.0, height // patch_size) * max(1.0, width // patch_size)
    side = max_patches_per_side * patch_size
    scale = min(1.0, math.sqrt(max_patches / patches), side / height, side / width)
    return (min(max(1, int(height * scale)), side), min(max(1, int(width * scale)), side))
