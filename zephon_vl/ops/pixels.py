"""Users' ``pixels`` operators: their functions on each still image's decoded pixels.

A ``pixels`` operator (`zephon_core.UserOp` with ``after="pixels"``) sees an image
as `DecodeVision` has it after the decode and before the resize to the patch grid:
an upright RGB ``uint8`` array of shape ``(height, width, 3)`` at the file's full
resolution (no reduced-scale JPEG decode, so a crop keeps every pixel). A map
returns the new array (a crop, a flip, a colour change); its size then decides
the patch grid, by the recipe's resize rule. A filter returning False drops the
whole sample with its reason. The k-th image of a document gets the draws of
part k of the sample's generator (`zephon_core.user_rng`). Videos are not passed.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from PIL import Image

from zephon_core import ConfigError, Dropped, Element, UserTransform
from zephon_vl.media.image import (
    ImageSettings,
    VisionPatches,
    decode_rgb,
    finish_patches,
    open_image,
    resize_rgb,
    target_size,
)


class _Refused(Exception):  # noqa: N818 - a control signal, caught in `decode_with_pixels`
    """A ``pixels`` filter dropped the sample: carries its `Dropped` out of the decode."""

    def __init__(self, dropped: Dropped) -> None:
        super().__init__(dropped.reason)
        self.dropped = dropped


class PixelEdit:
    """The ``pixels`` operators of one element, applied to its images in document order."""

    def __init__(self, ops: list[UserTransform], key: int) -> None:
        self.ops = ops
        self.key = key
        self.images = 0

    def __call__(self, pixels: np.ndarray, where: str) -> np.ndarray:
        part, self.images = self.images, self.images + 1
        for t in self.ops:
            out = t.apply(pixels, self.key, part)
            if isinstance(out, Dropped):
                raise _Refused(out)
            pixels = _checked(out, t.name, where)
        return pixels


def _checked(out: Any, name: str, where: str) -> np.ndarray:
    """A map's result as a contiguous image array; anything else stops the run (a bug in
    the function, not in the sample)."""
    if not (isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.ndim == 3
            and out.shape[2] == 3 and out.shape[0] >= 1 and out.shape[1] >= 1):
        what = (f"a {out.dtype} array of shape {out.shape}" if isinstance(out, np.ndarray)
                else f"a {type(out).__name__}")
        raise ConfigError(f"pixels operator {name!r} returned {what} for {where}; it must "
                          "return a uint8 array of shape (height, width, 3), height and "
                          "width >= 1")
    return np.ascontiguousarray(out)


def edited_image(data: bytes, settings: ImageSettings, where: str,
                 edit: PixelEdit) -> VisionPatches:
    """`process_image` with the user's ``pixels`` operators between the decode (full
    resolution, upright) and the resize to the patch grid."""
    img = open_image(data, settings, where)
    side = max(img.size)  # a target this large turns the reduced-scale decode off
    pixels = edit(np.array(decode_rgb(img, side, side, settings, where)), where)
    th, tw = target_size(pixels.shape[0], pixels.shape[1], settings, where)
    out = resize_rgb(Image.fromarray(pixels), th, tw, settings)
    return finish_patches(out[None], settings, one_frame=True)


def decode_with_pixels(op: Any, element: Element) -> Any:
    """`op.decode(element.payload)` (a `DecodeVision`) with its ``pixels`` operators on
    every still image; a copy of `op` carries this element's edit, so threads that share
    `op` never see another element's."""
    one = copy.copy(op)
    one.edit = PixelEdit(op.pixel_ops, element.key)
    try:
        return one.decode(element.payload)
    except _Refused as refused:
        return refused.dropped
