"""zephon_vl.media.image: agreement with transformers' Qwen2-VL processor, layout, bad input.

Tolerance against transformers (same decoded RGB input, normalized float32):
max abs diff <= 1e-5 and mean abs diff <= 1e-6; grid_thw exact. Both sides
resize with the same PIL and normalize with the same arithmetic, so the
measured difference is 0.0 on every photo here; the bound only leaves room for
float rounding changes upstream, not for a different resampler.
"""

from __future__ import annotations

import io
import json
import os
import warnings

import numpy as np
import pytest
import skimage.data
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile

from tests.helpers.vl import hf_image_processor, png_header_only
from zephon_core import BadSampleError, ConfigError
from zephon_vl import (
    ImageSettings,
    VisionPatches,
    normalize_patches,
    patch_rows,
    pillow_backend,
    process_image,
    smart_resize,
)
from zephon_vl.media import image as zimage
from zephon_vl.media.image import target_size, warn_if_not_simd

MAX_ABS = 1e-5
MEAN_ABS = 1e-6
PHOTOS = ["astronaut", "coffee", "chelsea", "rocket"]


def _encode(img: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _photo(name: str, scale: float = 1.0) -> Image.Image:
    img = Image.fromarray(getattr(skimage.data, name)())
    if scale != 1.0:
        size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
        img = img.resize(size, Image.Resampling.BILINEAR)
    return img


# --- agreement with transformers -------------------------------------------------------

S_WORKER = ImageSettings(normalize="worker")


@pytest.fixture(scope="module")
def reference():
    return hf_image_processor(S_WORKER)


@pytest.mark.parametrize("name", PHOTOS)
@pytest.mark.parametrize("scale,cap", [(1.0, None), (3.0, "max"), (0.05, "min")])
def test_matches_transformers(name, scale, cap, reference):
    data = _encode(_photo(name, scale), quality=90)
    w, h = Image.open(io.BytesIO(data)).size
    f = S_WORKER.factor
    rounded = round(h / f) * f * round(w / f) * f
    if cap == "max":
        assert rounded > S_WORKER.max_pixels  # the max_pixels branch of smart_resize runs
    elif cap == "min":
        assert rounded < S_WORKER.min_pixels  # the min_pixels branch runs

    ours = process_image(data, S_WORKER, where=name)
    ref = reference(Image.open(io.BytesIO(data)).convert("RGB"), return_tensors="np")

    np.testing.assert_array_equal(ours.grid_thw, np.asarray(ref["image_grid_thw"])[0])
    assert ours.grid_thw.dtype == np.int64 and ours.grid_thw.shape == (3,)
    ref_pv = np.asarray(ref["pixel_values"])
    assert ours.pixel_values.shape == ref_pv.shape
    assert ours.pixel_values.dtype == np.float32
    diff = np.abs(ours.pixel_values.astype(np.float64) - ref_pv)
    assert diff.max() <= MAX_ABS, diff.max()
    assert diff.mean() <= MEAN_ABS, diff.mean()


def test_matches_transformers_grey_and_alpha(reference):
    grey = _encode(Image.fromarray(skimage.data.camera()), quality=90)
    rgba = Image.fromarray(skimage.data.astronaut()).convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize(rgba.size))
    for data in (grey, _encode(rgba, "PNG")):
        ours = process_image(data, S_WORKER)
        ref = reference(Image.open(io.BytesIO(data)), return_tensors="np")
        np.testing.assert_array_equal(ours.grid_thw, np.asarray(ref["image_grid_thw"])[0])
        assert np.abs(ours.pixel_values - np.asarray(ref["pixel_values"])).max() <= MAX_ABS


@settings(max_examples=300, deadline=None)
@given(
    h=st.integers(1, 5000),
    w=st.integers(1, 5000),
    factor=st.sampled_from([14, 28, 32]),
    min_px=st.sampled_from([56 * 56, 128 * 28 * 28]),
    max_px=st.sampled_from([28 * 28 * 256, 28 * 28 * 1280, 16384 * 28 * 28]),
)
def test_smart_resize_matches_transformers(h, w, factor, min_px, max_px):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        smart_resize as ref_smart_resize,
    )

    try:
        expected = ref_smart_resize(h, w, factor=factor, min_pixels=min_px, max_pixels=max_px)
    except ValueError:
        with pytest.raises(ValueError):
            smart_resize(h, w, factor, min_px, max_px)
        return
    assert smart_resize(h, w, factor, min_px, max_px) == expected


# --- layout and normalization ----------------------------------------------------------


def test_patch_layout_groups_merge_blocks():
    """Each 14x14 patch has its own value; rows come in (block-row, block-col, mh, mw) order."""
    s = ImageSettings()
    gh, gw = 4, 6  # 56 x 84 pixels: a multiple of 28 within budget, so no resize
    patch_id = np.arange(gh * gw, dtype=np.uint8).reshape(gh, gw)
    img = np.repeat(np.repeat(patch_id, 14, axis=0), 14, axis=1)
    rgb = np.stack([img, img + 100, img + 200], axis=-1).astype(np.uint8)
    out = process_image(_encode(Image.fromarray(rgb), "PNG"), s)
    assert tuple(out.grid_thw) == (1, gh, gw)
    rows = out.pixel_values.reshape(-1, 3, 2, 14 * 14)
    expected = [
        (bh * 2 + mh) * gw + bw * 2 + mw
        for bh in range(gh // 2)
        for bw in range(gw // 2)
        for mh in range(2)
        for mw in range(2)
    ]
    for r, pid in enumerate(expected):
        for c in range(3):
            for t in range(2):  # the single image is repeated over the temporal axis
                assert (rows[r, c, t] == pid + 100 * c).all()
    assert out.num_patches == gh * gw
    assert out.num_tokens(2) == gh * gw // 4


def test_collate_path_equals_worker_path_bitwise():
    for name in PHOTOS:
        data = _encode(_photo(name), quality=90)
        u8 = process_image(data, ImageSettings(normalize="collate"))
        f32 = process_image(data, ImageSettings(normalize="worker"))
        assert u8.pixel_values.dtype == np.uint8
        np.testing.assert_array_equal(u8.grid_thw, f32.grid_thw)
        later = normalize_patches(u8.pixel_values, ImageSettings())
        assert later.dtype == np.float32 and later.shape == f32.pixel_values.shape
        assert np.array_equal(later.view(np.uint32), f32.pixel_values.view(np.uint32))


def test_one_frame_rows_lay_out_to_the_full_rows_bitwise():
    """Workers ship one frame per still image; `patch_rows` (the collate) restores the
    T-frame layout: float32 rows identical to normalizing the full rows, in either mode."""
    full_u8 = [process_image(_encode(_photo(n), quality=90), ImageSettings()).pixel_values
               for n in PHOTOS[:3]]
    want = np.concatenate([normalize_patches(x, ImageSettings()) for x in full_u8])
    for mode in ("collate", "worker"):
        s = ImageSettings(normalize=mode)
        one = [process_image(_encode(_photo(n), quality=90), s, one_frame=True)
               for n in PHOTOS[:3]]
        assert all(o.pixel_values.shape[1] == 3 * 14 * 14 for o in one)
        assert [o.num_patches for o in one] == [len(x) for x in full_u8]
        # mixed with rows that already hold T frames (videos)
        got = patch_rows([one[0].pixel_values, full_u8[1], one[2].pixel_values], s)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), mode
    with pytest.raises(ValueError, match="neither one frame"):
        patch_rows([np.zeros((4, 100), np.uint8)], ImageSettings())


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_patch_rows_write_once_into_the_given_output(data):
    """The collate's one-pass kernel: any mix of one-frame / T-frame uint8 and float32 rows
    gives the values of normalizing and repeating each item, written into `out`; uint8
    items' frames (still images once) expand to the same rows on the device side."""
    import torch

    from zephon_vl import frame_rows_uint8, patch_rows_from_frames

    s = ImageSettings()
    k = 14 * 14
    items, want, want_u8 = [], [], []
    for _ in range(data.draw(st.integers(1, 4))):
        n = data.draw(st.integers(0, 5))
        kind = data.draw(st.sampled_from(["one", "full", "float"]))
        seed = data.draw(st.integers(0, 2**16))
        rng = np.random.default_rng(seed)
        width = 3 * k if kind == "one" else 6 * k
        x = rng.integers(0, 256, (n, width), dtype=np.uint8)
        full = np.repeat(x.reshape(n, 3, 1, k), 2, axis=2).reshape(n, 6 * k) \
            if kind == "one" else x
        if kind == "float":
            items.append(normalize_patches(x, s))
        else:
            items.append(x)
            want_u8.append(full)
        want.append(normalize_patches(full, s))
    out = np.full((sum(len(x) for x in items), 6 * k), np.nan, dtype=np.float32)
    got = patch_rows(items, s, out=out)
    assert got.size == 0 or np.shares_memory(got, out)
    assert np.array_equal(out.view(np.uint32), np.concatenate(want).view(np.uint32))
    if len(want_u8) == len(items):
        u8 = np.zeros((sum(x.size for x in items) // (3 * k), 3 * k), dtype=np.uint8)
        frames_u8, frames = frame_rows_uint8(items, s, out=u8)
        assert frames_u8 is u8 and frames == [x.shape[1] // (3 * k) for x in items]
        grid = torch.tensor([[1, 1, len(x)] for x in items], dtype=torch.int64)
        rows = patch_rows_from_frames(torch.from_numpy(u8), torch.tensor(frames), grid, 2)
        assert np.array_equal(rows.numpy(), np.concatenate(want_u8))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        patch_rows(items, s, out=np.empty((len(out) + 1, 6 * k), np.float32))


def test_normalize_patches_is_per_channel():
    s = ImageSettings()
    row = np.zeros((1, 3 * 2 * 14 * 14), dtype=np.uint8)
    row[0, : 2 * 196] = 255  # channel 0 is the first third of the row
    out = normalize_patches(row, s).reshape(3, -1)
    np.testing.assert_allclose(out[0], (1 - s.image_mean[0]) / s.image_std[0], rtol=1e-6)
    np.testing.assert_allclose(out[1], -s.image_mean[1] / s.image_std[1], rtol=1e-6)
    np.testing.assert_allclose(out[2], -s.image_mean[2] / s.image_std[2], rtol=1e-6)


# --- draft decoding --------------------------------------------------------------------


def test_draft_is_deterministic_and_keeps_the_grid():
    s = ImageSettings(max_pixels=256 * 28 * 28)  # target about 448x448: below half of 1536
    data = _encode(_photo("astronaut", 3.0), quality=90)
    full = process_image(data, s)
    d1 = process_image(data, ImageSettings(max_pixels=s.max_pixels, draft=True))
    d2 = process_image(data, ImageSettings(max_pixels=s.max_pixels, draft=True))
    np.testing.assert_array_equal(d1.grid_thw, full.grid_thw)
    np.testing.assert_array_equal(d1.pixel_values, d2.pixel_values)
    assert not np.array_equal(d1.pixel_values, full.pixel_values)  # draft really engaged
    err = np.abs(d1.pixel_values.astype(np.int16) - full.pixel_values).mean()
    assert err < 3.0, err  # same picture, a few grey levels apart on average


def test_draft_skipped_when_target_is_over_half():
    data = _encode(_photo("coffee"), quality=90)  # 600x400 -> 588x392: no reduction allowed
    a = process_image(data, ImageSettings(draft=True))
    b = process_image(data, ImageSettings(draft=False))
    np.testing.assert_array_equal(a.pixel_values, b.pixel_values)


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data,reason",
    [
        (np.random.default_rng(0).bytes(4096), "corrupt_image"),
        (b"", "corrupt_image"),
        (png_header_only(100_000, 100_000), "decompression_bomb"),  # PIL's own limit too
        (png_header_only(9000, 9000), "decompression_bomb"),  # only ours (81M > 64M)
        (png_header_only(64, 64), "corrupt_image"),  # header fine, no pixel data
        (png_header_only(1, 300), "bad_aspect_ratio"),
    ],
    ids=["random", "empty", "png-bomb-1e10", "png-bomb-81M", "png-no-idat", "aspect-300"],
)
def test_bad_input(data, reason):
    with pytest.raises(BadSampleError) as info:
        process_image(data, ImageSettings(), where="shard-3/key-7")
    assert info.value.reason == reason
    assert info.value.where == "shard-3/key-7"
    assert not ImageFile.LOAD_TRUNCATED_IMAGES


def test_truncated_jpeg():
    data = _encode(_photo("chelsea"), quality=90)
    with pytest.raises(BadSampleError) as info:
        process_image(data[: len(data) // 2], ImageSettings())
    assert info.value.reason == "corrupt_image"
    assert not ImageFile.LOAD_TRUNCATED_IMAGES


def test_bad_sample_details_are_stable():
    """Drop records must be deterministic: no object addresses in the detail."""
    data = os.urandom(64)
    details = set()
    for _ in range(2):
        with pytest.raises(BadSampleError) as info:
            process_image(data, ImageSettings())
        details.add(str(info.value))
    assert len(details) == 1


def test_image_too_small():
    with pytest.raises(BadSampleError) as info:
        target_size(0, 10, ImageSettings(), "k")
    assert info.value.reason == "image_too_small"


def test_truncated_images_flag_set_elsewhere_is_refused(monkeypatch):
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(ConfigError):
        process_image(_encode(_photo("coffee")), ImageSettings())


# --- settings and backend ---------------------------------------------------------------


def test_image_settings_are_json_and_frozen():
    s = ImageSettings(image_mean=[0.5, 0.5, 0.5], image_std=(0.5, 0.5, 0.5))
    d = s.settings()
    assert json.loads(json.dumps(d)) == d
    assert d["image_mean"] == [0.5, 0.5, 0.5] and d["normalize"] == "collate"
    assert hash(s) == hash(ImageSettings(image_mean=(0.5, 0.5, 0.5), image_std=(0.5,) * 3))
    with pytest.raises(AttributeError):
        s.patch_size = 16  # type: ignore[misc]
    with pytest.raises(ConfigError):
        ImageSettings(normalize="gpu")


def test_backend_detection_and_single_warning(monkeypatch):
    assert pillow_backend() in ("pillow", "pillow-simd")
    monkeypatch.setattr(zimage, "pillow_backend", lambda: "pillow")
    monkeypatch.setattr(zimage, "_warned_not_simd", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_not_simd()
        warn_if_not_simd()
    assert len([w for w in caught if "pillow-simd" in str(w.message)]) == 1


def test_vision_patches_counts():
    vp = VisionPatches(np.zeros((2 * 4 * 6, 1176), np.uint8), np.array([2, 4, 6], np.int64))
    assert vp.num_patches == 48 and vp.num_tokens(2) == 12
