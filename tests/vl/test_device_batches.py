"""Issue 12: uint8 pixels to the device, normalized there, equal to the host collate."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch

from tests.helpers.vl import IMAGE, demo_shards, make_recipe
from zephon_core import Execution, Loader
from zephon_vl.ops.device import normalize_pixels, to_device


def _batches(shards: list[str], normalize: str, steps: int = 3) -> list[dict]:
    image = dataclasses.replace(IMAGE, normalize=normalize)
    with Loader(make_recipe(shards, image=image), 0, 1, Execution(runner="inline")) as loader:
        return [next(loader) for _ in range(steps)]


def test_device_normalize_is_bit_identical_to_the_host_collate(tmp_path_factory) -> None:
    shards = demo_shards(tmp_path_factory)
    host = _batches(shards, "collate")
    wire = _batches(shards, "device")
    for want, got in zip(host, wire, strict=True):
        frames, patches = got["pixel_frames"], got["grid_thw"].prod(dim=1)
        assert got["pixel_values"].dtype == torch.uint8 and set(frames.tolist()) <= {1, 2}
        assert got["pixel_values"].shape == (int((frames * patches).sum()),
                                             want["pixel_values"].shape[1] // 2)
        moved = to_device(got, "cpu")
        assert set(moved) == set(want)
        for key, value in want.items():
            assert moved[key].dtype == value.dtype and torch.equal(moved[key], value), key


def test_to_device_sizes_nothing_from_device_data(tmp_path_factory) -> None:
    """The patch rows' gather index is made on the host: on an accelerator, sizing it from
    device tensors (repeat_interleave) makes the host wait for the copy. The meta device
    has no data, so any size read from device data fails there."""
    got = _batches(demo_shards(tmp_path_factory), "device", steps=1)[0]
    moved = to_device(got, "meta")
    want = to_device(got, "cpu")["pixel_values"]
    assert moved["pixel_values"].shape == want.shape
    assert moved["pixel_values"].dtype == want.dtype


def test_normalize_pixels_is_the_host_table_lookup() -> None:
    from zephon_vl.media.image import normalization_table, normalize_patches

    rng = np.random.default_rng(3)
    rows = rng.integers(0, 256, size=(37, 3 * 2 * 16 * 16), dtype=np.uint8)
    table = torch.from_numpy(normalization_table(IMAGE).copy())
    got = normalize_pixels(torch.from_numpy(rows), table)
    assert torch.equal(got, torch.from_numpy(normalize_patches(rows, IMAGE)))


def test_a_batch_over_the_pinned_budget_falls_back_with_a_warning(caplog) -> None:
    if not torch.cuda.is_available():
        pytest.skip("pinned staging needs a CUDA device; this machine has none")
    batch = {"input": torch.zeros(4, 8, dtype=torch.int64)}
    with caplog.at_level(logging.WARNING, logger="zephon_vl.ops.device"):
        moved = to_device(batch, "cuda", pinned_budget_bytes=1)
    assert moved["input"].is_cuda and "pinned budget" in caplog.text


def test_a_micro_batch_without_images_normalizes_to_an_empty_float_tensor() -> None:
    """A text-only micro-batch (filler off) has 0 patch rows; it must not crash the move."""
    from zephon_vl.media.image import normalization_table

    table = torch.from_numpy(normalization_table(IMAGE).copy())
    empty = torch.zeros((0, 3 * 2 * 16 * 16), dtype=torch.uint8)
    out = normalize_pixels(empty, table)
    assert out.shape == (0, 3 * 2 * 16 * 16) and out.dtype == table.dtype
    moved = to_device({"pixel_values": empty, "pixel_lut": table}, "cpu")
    assert moved["pixel_values"].shape == (0, 3 * 2 * 16 * 16)
    no_frames = {"pixel_values": torch.zeros((0, 3 * 16 * 16), dtype=torch.uint8),
                 "pixel_frames": torch.zeros(0, dtype=torch.int64),
                 "grid_thw": torch.zeros((0, 3), dtype=torch.int64),
                 "pixel_temporal": torch.tensor(2), "pixel_lut": table}
    moved = to_device(no_frames, "cpu")
    assert moved["pixel_values"].shape == (0, 3 * 2 * 16 * 16) and set(moved) == {
        "pixel_values", "grid_thw"}
