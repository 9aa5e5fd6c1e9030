"""zephon_vl.media.header_geometry: every image kind's and test clip's grid from its header
equals the decoded grid, and reading it decodes no pixel."""

from __future__ import annotations

import io
import struct
import zlib
from contextlib import contextmanager

import numpy as np
import pytest
from PIL import Image, ImageFile

from zephon_core import BadSampleError
from zephon_vl import ImageSettings, VideoSettings, process_image, process_video
from zephon_vl.families.registry import get_family
from zephon_vl.media.header_geometry import image_geometry, video_geometry
from zephon_vl.testing.video import encode_test_video

QWEN = ImageSettings()
SMALL = ImageSettings(max_pixels=128 * 128, min_pixels=56 * 56)
PATCHES = get_family("kimi_k2_5").image_settings(max_pixels=200_000)
SETTINGS = {"qwen": QWEN, "small": SMALL, "patches": PATCHES,
            "no-exif": ImageSettings(max_pixels=128 * 128, exif_transpose=False)}


@contextmanager
def no_decode():
    """Any pixel decode (Pillow's `load`) inside the block fails the test."""
    def refuse(self, *a, **k):
        raise AssertionError(f"{self.format} image was decoded")
    saved = ImageFile.ImageFile.load, Image.Image.load
    ImageFile.ImageFile.load = Image.Image.load = refuse
    try:
        yield
    finally:
        ImageFile.ImageFile.load, Image.Image.load = saved


def _picture(w: int, h: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), "RGB")


def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def _png_exif_after_pixels(img: Image.Image, orientation: int) -> bytes:
    """A PNG whose eXIf chunk follows IDAT (Pillow writes it before)."""
    data = _save(img, "PNG")
    end = data.rindex(b"IEND") - 4
    body = _exif(orientation)[6:] if _exif(orientation).startswith(b"Exif") else _exif(orientation)
    chunk = struct.pack(">I", len(body)) + b"eXIf" + body
    chunk += struct.pack(">I", zlib.crc32(b"eXIf" + body) & 0xFFFFFFFF)
    return data[:end] + chunk + data[end:]


def image_kinds() -> dict[str, bytes]:
    """Every image kind the project reads, with odd sizes so orientation matters."""
    rgb = _picture(301, 157)
    kinds = {f"jpeg exif {k}": _save(rgb, "JPEG", exif=_exif(k)) for k in range(1, 9)}
    kinds.update({
        "jpeg": _save(rgb, "JPEG", quality=90),
        "jpeg progressive": _save(rgb, "JPEG", progressive=True),
        "jpeg cmyk": _save(rgb.convert("CMYK"), "JPEG"),
        "jpeg grayscale": _save(rgb.convert("L"), "JPEG"),
        "jpeg large": _save(_picture(2000, 1100, 1), "JPEG"),
        "png rgb": _save(rgb, "PNG"),
        "png palette": _save(rgb.convert("P", palette=Image.Palette.ADAPTIVE), "PNG"),
        "png palette transparency": _save(rgb.convert("P"), "PNG", transparency=0),
        "png alpha": _save(rgb.convert("RGBA"), "PNG"),
        "png 16-bit": _save(Image.fromarray(
            (np.arange(301 * 157, dtype=np.uint32).reshape(157, 301) * 3 % 65536)
            .astype(np.uint16)), "PNG"),
        "png grayscale": _save(rgb.convert("L"), "PNG"),
        "png la": _save(rgb.convert("LA"), "PNG"),
        "png exif 6 before pixels": _save(rgb, "PNG", exif=_exif(6)),
        "gif": _save(rgb.convert("P"), "GIF"),
        "gif animated": _save(rgb.convert("P"), "GIF", save_all=True,
                              append_images=[_picture(301, 157, 2).convert("P")]),
        "webp": _save(rgb, "WEBP"),
        "webp lossless alpha": _save(rgb.convert("RGBA"), "WEBP", lossless=True),
        "webp exif 8": _save(rgb, "WEBP", exif=_exif(8)),
        "tiff": _save(rgb, "TIFF"),
        "tiff exif 5": _save(rgb, "TIFF", exif=_exif(5)),
        "tiff multipage": _save(rgb, "TIFF", save_all=True, append_images=[_picture(90, 40)]),
        "bmp": _save(rgb, "BMP"),
        "bmp grayscale": _save(rgb.convert("L"), "BMP"),
        "tiny": _save(_picture(3, 2), "PNG"),
    })
    return kinds


KINDS = image_kinds()


@pytest.mark.parametrize("settings_name", sorted(SETTINGS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_image_grid_from_header_equals_decode(kind, settings_name):
    settings, data = SETTINGS[settings_name], KINDS[kind]
    with no_decode():
        geometry = image_geometry(data, settings, kind)
    assert geometry is not None, kind
    decoded = process_image(data, settings, kind, one_frame=True)
    assert geometry.grid_thw == tuple(int(x) for x in decoded.grid_thw), kind
    assert np.array_equal(geometry.grid_array(), decoded.grid_thw)
    assert geometry.frames == 1


@pytest.mark.parametrize("orientation", [1, 6, 8])
def test_png_with_exif_after_its_pixels_is_not_trusted(orientation):
    """Pillow reads such a chunk only by decoding: the header cannot say, so None (the
    sample is decoded early); the decode applies the orientation."""
    data = _png_exif_after_pixels(_picture(301, 157), orientation)
    with no_decode():
        assert image_geometry(data, SMALL, "late exif") is None
    decoded = process_image(data, SMALL, "late exif", one_frame=True)
    t, h, w = (int(x) for x in decoded.grid_thw)
    assert (h < w) == (orientation == 1)
    assert image_geometry(data, ImageSettings(max_pixels=128 * 128, exif_transpose=False),
                          "no exif") is not None


@pytest.mark.parametrize("data, reason", [
    (b"", "corrupt_image"),
    (b"plain text, not an image", "corrupt_image"),
    (_save(_picture(2000, 8), "PNG"), "bad_aspect_ratio"),
])
def test_header_refusals_are_the_decode_refusals(data, reason):
    with pytest.raises(BadSampleError) as planned:
        image_geometry(data, QWEN, "bad")
    with pytest.raises(BadSampleError) as decoded:
        process_image(data, QWEN, "bad")
    assert planned.value.reason == decoded.value.reason == reason
    assert str(planned.value) == str(decoded.value)


def _clip(n: int, fps: int = 30, h: int = 48, w: int = 64, **kw) -> bytes:
    rng = np.random.default_rng(n)
    base = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    return encode_test_video([np.roll(base, 3 * i, axis=1) for i in range(n)], fps,
                             crf=18, **kw)


def _vfr(n: int) -> list[int]:
    return list(np.cumsum([0] + [20 + (17 * i) % 51 for i in range(n - 1)]))


#: the clips the tests make (tests/vl/test_video*.py, the demo's): frame counts, GOPs,
#: B-frames, variable frame rate, rotation, the index in front
CLIPS = {
    "1 frame": dict(n=1),
    "2 frames": dict(n=2),
    "5 frames 4 fps": dict(n=5, fps=4, h=64, w=96),
    "7 frames gop 3": dict(n=7, gop=3),
    "61 x264 defaults": dict(n=61),
    "90 all keyframes": dict(n=90, gop=1),
    "150 gop 30 B3": dict(n=150, gop=30, bframes=3),
    "200 gop 7 B2": dict(n=200, gop=7, bframes=2),
    "180 gop 20 B2 vfr": dict(n=180, gop=20, bframes=2, pts_ms=_vfr(180)),
    "120 gop 10 rotated 90": dict(n=120, gop=10, rotation=90),
    "150 gop 25 faststart": dict(n=150, gop=25, faststart=True),
    "24 frames 320x240 12 fps": dict(n=24, fps=12, h=240, w=320),
}
VIDEO = {"default": VideoSettings(), "dense": VideoSettings(fps=8.0, max_frames=12),
         "sequential": VideoSettings(decode="sequential"),
         "small frames": VideoSettings(max_pixels_per_frame=32 * 32)}


@pytest.mark.parametrize("video_name", sorted(VIDEO))
@pytest.mark.parametrize("name", sorted(CLIPS))
def test_video_grid_from_index_equals_decode(name, video_name):
    data, vs = _clip(**CLIPS[name]), VIDEO[video_name]
    for image in (QWEN, PATCHES):
        geometry = video_geometry(data, image, vs, name)
        assert geometry is not None, name
        decoded = process_video(data, image, vs, name)
        assert geometry.grid_thw == tuple(int(x) for x in decoded.grid_thw), name


def test_demo_clips_grid_from_index_equals_decode(tmp_path_factory):
    from tests.helpers.vl import demo_samples_by_kind

    clips = [s["mp4"] for samples in demo_samples_by_kind(tmp_path_factory).values()
             for s in samples if "mp4" in s]
    assert clips
    for data in clips:
        geometry = video_geometry(data, QWEN, VideoSettings(), "demo")
        assert geometry is not None
        assert geometry.grid_thw == tuple(
            int(x) for x in process_video(data, QWEN, VideoSettings(), "demo").grid_thw)


def test_a_clip_the_header_cannot_plan_is_left_to_the_decode():
    """No frames, not a video: None, and the decode reports the fault as before."""
    assert video_geometry(b"not a video", QWEN, VideoSettings(), "bad") is None
    with pytest.raises(BadSampleError):
        process_video(b"not a video", QWEN, VideoSettings(), "bad")


def test_the_guard_sees_a_decode():
    """`no_decode` would catch a header read that decodes (else the tests above prove
    nothing about it)."""
    with no_decode(), pytest.raises(BadSampleError, match="PNG image was decoded"):
        process_image(KINDS["png rgb"], SMALL, "png")


def test_a_decode_unlike_its_plan_is_refused_with_a_reason():
    """`PlannedItem.decode` never hands on pixels of another grid than the tokens were
    counted for: a header that lied is a drop naming both grids."""
    from dataclasses import replace

    from zephon_vl.media.planned import PlannedItem, plan_image

    planned = plan_image(KINDS["jpeg"], SMALL, "jpeg")
    assert isinstance(planned, PlannedItem)
    assert np.array_equal(planned.decode().pixel_values,
                          process_image(KINDS["jpeg"], SMALL, "jpeg", one_frame=True).pixel_values)
    wrong = replace(planned, geometry=replace(planned.geometry, grid_thw=(1, 2, 2)))
    with pytest.raises(BadSampleError) as info:
        wrong.decode()
    assert info.value.reason == "planned_size_mismatch"
    assert "(1, 2, 2)" in str(info.value) and "bytes" in repr(planned)
