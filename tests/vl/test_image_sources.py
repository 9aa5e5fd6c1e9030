"""Images as cameras and scanners write them: EXIF orientation and 16-bit greyscale."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from zephon_vl import ImageSettings, process_image

SETTINGS = ImageSettings(max_pixels=64 * 28 * 28, normalize="collate")


def _png(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", **kw)
    return buf.getvalue()


def _photo(w: int = 120, h: int = 64) -> Image.Image:
    rng = np.random.default_rng(7)
    base = np.linspace(0, 255, w * h * 3).reshape(h, w, 3)
    return Image.fromarray((base + rng.integers(0, 40, (h, w, 3))).clip(0, 255)
                           .astype(np.uint8), "RGB")


@pytest.mark.parametrize("orientation", [1, 2, 3, 4, 5, 6, 7, 8])
def test_exif_orientation_is_applied_before_the_patch_grid(orientation: int) -> None:
    photo = _photo()
    exif = Image.Exif()
    exif[0x0112] = orientation
    tagged = _png(photo, exif=exif)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(tagged)))
    want = process_image(_png(upright), SETTINGS)
    got = process_image(tagged, SETTINGS)
    assert got.grid_thw.tolist() == want.grid_thw.tolist()
    assert np.array_equal(got.pixel_values, want.pixel_values)
    if orientation in (5, 6, 7, 8):
        assert got.grid_thw[1] > got.grid_thw[2], "a turned landscape photo is portrait"


def test_exif_transpose_can_be_turned_off() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6
    tagged = _png(_photo(), exif=exif)
    off = ImageSettings(max_pixels=64 * 28 * 28, exif_transpose=False)
    assert np.array_equal(process_image(tagged, off).pixel_values,
                          process_image(_png(_photo()), off).pixel_values)
    assert off.settings()["exif_transpose"] is False


def test_sixteen_bit_greyscale_is_scaled_not_clipped() -> None:
    h, w = 56, 84
    ramp = np.linspace(0, 65535, h * w).reshape(h, w).astype(np.uint16)
    wide = _png(Image.fromarray(ramp))
    narrow = _png(Image.fromarray(((ramp.astype(np.uint32) + 128) // 257).astype(np.uint8),
                                  "L"))
    got = process_image(wide, SETTINGS).pixel_values
    assert np.array_equal(got, process_image(narrow, SETTINGS).pixel_values)
    assert np.mean(got == 255) < 0.05, "most of a 16-bit ramp must not saturate to white"
