"""The placeholder image that keeps every row training-safe (guarantee 10).

With FSDP/ZeRO-3 every rank must run the vision encoder at every micro-step:
a rank whose micro-batch has no image skips the encoder's collectives and the
step hangs. The rule that makes this hold at any ``D`` and any micro-batch
split is per row: a row that closes without an image gets this document, a
small uniform grey image at the smallest grid the image settings allow, as
its own segment (labels -100, positions from 0, so it attends to nothing
else and trains nothing). Its pixels and tokens are a pure function of the
settings and the family, so every rank and every resume builds the same one.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from zephon_core.extend import RowFiller
from zephon_vl.families.base import VisionFamily
from zephon_vl.media.image import ImageSettings, finish_patches, target_size

#: The filler's grey level (the middle of uint8; about zero after normalization).
GREY = 128


def image_filler(image: ImageSettings, family: VisionFamily, special: Any) -> RowFiller:
    """The row filler for `family`'s recipes: one grey image at the minimum grid."""
    side = image.patch_size * image.merge_size
    h, w = target_size(side, side, image, "the row filler")
    frames = np.full((1, h, w, 3), GREY, dtype=np.uint8)
    patches = finish_patches(frames, image, one_frame=True)
    tokens = family.placeholder(special, patches, image.merge_size, False).astype(np.int32)
    payload = {
        "tokens": tokens,
        "targets": np.zeros(len(tokens), dtype=bool),
        "costs": {"vision_tokens": family.item_tokens(patches.grid_thw, image.merge_size),
                  "images": 1},
        "pixel_values": [patches.pixel_values],
        "grid_thw": [patches.grid_thw],
    }
    digest = hashlib.sha256()
    for arr in (tokens, patches.pixel_values, patches.grid_thw):
        digest.update(np.ascontiguousarray(arr).tobytes())
    return RowFiller("images", payload, digest.hexdigest()[:16])
