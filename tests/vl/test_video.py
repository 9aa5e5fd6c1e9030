"""zephon_vl.media.video: deterministic frame sampling, temporal patch layout, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import BadSampleError, ConfigError
from zephon_vl import ImageSettings, VideoSettings, normalize_patches, process_video
from zephon_vl.media.video import sample_frame_indices
from zephon_vl.testing.video import encode_test_video

# Distinct, well separated solid colours (lossy codec + YUV 4:2:0 round trip).
COLOURS = [(30 * k % 256, 255 - 25 * k, (80 + 60 * k) % 256) for k in range(10)]


def _solid_video(n: int, fps: int = 4, h: int = 64, w: int = 96) -> bytes:
    return encode_test_video([np.full((h, w, 3), COLOURS[k], np.uint8) for k in range(n)], fps)


@settings(max_examples=400, deadline=None)
@given(
    num_frames=st.integers(1, 3000),
    native_fps=st.one_of(st.none(), st.floats(1.0, 120.0), st.just(30000 / 1001)),
    fps=st.floats(0.1, 10.0),
    max_frames=st.integers(1, 64),
    min_frames=st.integers(1, 64),
    tp=st.sampled_from([1, 2, 3]),
)
def test_sample_frame_indices_properties(num_frames, native_fps, fps, max_frames, min_frames, tp):
    min_frames = min(min_frames, max_frames)
    vs = VideoSettings(fps=fps, max_frames=max_frames, min_frames=min_frames)
    idx = sample_frame_indices(num_frames, native_fps, vs, tp)
    assert idx == sample_frame_indices(num_frames, native_fps, vs, tp)  # pure
    assert len(idx) % tp == 0 and len(idx) >= tp
    assert len(idx) <= max(tp, max_frames // tp * tp)  # capped (at least one temporal patch)
    assert idx[0] == 0 and all(0 <= i < num_frames for i in idx)
    assert idx == sorted(idx)
    distinct = sorted(set(idx))
    assert idx[: len(distinct)] == distinct  # repeats only as padding at the end
    assert len(idx) - len(distinct) < tp
    # Evenly spaced: gaps differ by at most one frame.
    gaps = np.diff(distinct)
    if len(gaps):
        assert gaps.max() - gaps.min() <= 1
    # At the target fps: as many frames as fps ticks in the clip, unless a cap binds.
    rate = native_fps if native_fps else fps
    x = num_frames * fps / rate  # fps ticks in the clip; allow float noise at integers
    max_n = max(tp, max_frames // tp * tp)
    min_n = min(max_n, math.ceil(min_frames / tp) * tp)
    allowed = {min(max(math.ceil(x + e), min_n), max_n, num_frames) for e in (-1e-6, 1e-6)}
    assert len(distinct) in allowed


def test_sample_frame_indices_examples():
    vs = VideoSettings(fps=2.0, max_frames=16, min_frames=2)
    assert sample_frame_indices(100, 30.0, vs, 2) == [0, 14, 28, 42, 57, 71, 85, 85]
    assert sample_frame_indices(1, 30.0, vs, 2) == [0, 0]
    assert sample_frame_indices(0, 30.0, vs, 2) == []
    assert len(sample_frame_indices(10_000, 30.0, vs, 2)) == 16  # max_frames cap


def test_temporal_slots_hold_the_right_frames():
    n, tp = 8, 2
    vs = VideoSettings(fps=4.0, max_frames=16)
    out = process_video(_solid_video(n), ImageSettings(), vs, where="clip")
    gt, gh, gw = (int(x) for x in out.grid_thw)
    assert out.grid_thw.dtype == np.int64 and (gt, gh, gw) == (n // tp, 4, 6)
    assert out.pixel_values.shape == (gt * gh * gw, 3 * tp * 14 * 14)
    assert out.pixel_values.dtype == np.uint8
    rows = out.pixel_values.reshape(gt, gh * gw, 3, tp, 14 * 14).astype(np.int16)
    for k in range(n):
        t, slot = divmod(k, tp)
        for c in range(3):
            assert np.abs(rows[t, :, c, slot] - COLOURS[k][c]).max() <= 4, (k, c)


def test_odd_frame_count_pads_with_last_frame():
    out = process_video(_solid_video(5), ImageSettings(), VideoSettings(fps=4.0, max_frames=16))
    assert int(out.grid_thw[0]) == 3
    rows = out.pixel_values.reshape(3, -1, 3, 2, 196)
    np.testing.assert_array_equal(rows[2, :, :, 0], rows[2, :, :, 1])  # slot 1 repeats frame 4


def test_max_frames_cap_and_determinism():
    data = _solid_video(10)
    vs = VideoSettings(fps=4.0, max_frames=4)
    a = process_video(data, ImageSettings(), vs)
    b = process_video(data, ImageSettings(), vs)
    assert int(a.grid_thw[0]) == 2
    np.testing.assert_array_equal(a.pixel_values, b.pixel_values)
    # frames 0, 2, 5, 7 (i * 10 // 4): slot (t=1, 0) holds frame 5
    got = a.pixel_values.reshape(2, -1, 3, 2, 196)[1, :, :, 0].astype(int).mean(axis=(0, 2))
    assert np.abs(got - COLOURS[5]).max() <= 4


def test_worker_normalization_matches_collate():
    data = _solid_video(4)
    vs = VideoSettings(fps=4.0)
    u8 = process_video(data, ImageSettings(normalize="collate"), vs)
    f32 = process_video(data, ImageSettings(normalize="worker"), vs)
    later = normalize_patches(u8.pixel_values, ImageSettings())
    assert np.array_equal(later.view(np.uint32), f32.pixel_values.view(np.uint32))


def test_frame_budget():
    vs = VideoSettings(fps=4.0, max_pixels_per_frame=28 * 28 * 4)
    out = process_video(_solid_video(2, h=224, w=224), ImageSettings(), vs)
    assert tuple(out.grid_thw) == (1, 4, 4)


@pytest.mark.parametrize("cut", ["random", "empty", "half", "head"])
def test_corrupt_video(cut):
    good = _solid_video(6)
    data = {
        "random": np.random.default_rng(1).bytes(4096),
        "empty": b"",
        "half": good[: len(good) // 2],
        "head": good[:64],
    }[cut]
    with pytest.raises(BadSampleError) as info:
        process_video(data, ImageSettings(), VideoSettings(), where="clip-9")
    assert info.value.reason == "corrupt_video" and info.value.where == "clip-9"


def test_video_settings():
    d = VideoSettings().settings()
    assert json.loads(json.dumps(d)) == d
    with pytest.raises(ConfigError):
        VideoSettings(min_frames=8, max_frames=4)
    with pytest.raises(ConfigError):
        VideoSettings(fps=0)
