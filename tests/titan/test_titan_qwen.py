"""zephon's VLM batch in the qwen3_5 layout: patch order, MRoPE, padding, videos."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

import transformers  # noqa: E402,F401  (before the torchvision stub; see zephon_vl.testing.titan_cpu)

from zephon_core import ConfigError  # noqa: E402
from zephon_vl import ImageSettings, QwenVL, to_device
from zephon_vl.families.qwen import mrope_positions, to_qwen3_5  # noqa: E402
from zephon_vl.media.image import patchify  # noqa: E402
from zephon_vl.testing.titan_cpu import stub_torchvision  # noqa: E402
from zephon_vl.titan.dataloader import ZephonDataLoader  # noqa: E402

stub_torchvision()
from torchtitan.hf_datasets.multimodal.mm_collator import MultiModalCollator  # noqa: E402
from torchtitan.hf_datasets.multimodal.utils.image import vision_to_patches  # noqa: E402
from torchtitan.models.common.multimodal import get_vision_positions  # noqa: E402

IMG, VID, VS, VE, PAD = 9, 10, 7, 8, 0


@pytest.fixture(scope="module")
def vlm_batches():
    cfg = ZephonDataLoader.Config(runner="inline", recipe="vlm-demo", num_lanes=2,
                                  global_batch_size=4, model_format="qwen3_5",
                                  image_preset="qwen3_5", max_pixels=64 * 32 * 32)
    dl = cfg.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=256,
                   local_batch_size=2, snapshot_every_n_steps=None)
    it = iter(dl)
    raw = [next(dl.loader) for _ in range(2)]  # zephon's own collated micro-batches
    dl.close()
    del it
    return dl, [mb for step in raw for mb in step]


def test_pixels_normalized_on_the_device_are_the_host_floats():
    """uint8 batches moved and normalized by the adapter give the model the same input."""
    got = {}
    for on_device in (False, True):
        cfg = ZephonDataLoader.Config(runner="inline", recipe="vlm-demo", num_lanes=2,
                                      global_batch_size=4, model_format="qwen3_5",
                                      image_preset="qwen3_5", max_pixels=64 * 32 * 32,
                                      normalize_on_device=on_device, device="cpu")
        dl = cfg.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=256,
                       local_batch_size=2, snapshot_every_n_steps=None)
        got[on_device] = [next(iter(dl)) for _ in range(1)][0]
        dl.close()
    (host, labels), (device, labels2) = got[False], got[True]
    assert torch.equal(labels, labels2) and set(host) == set(device)
    for key, value in host.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == device[key].dtype and torch.equal(value, device[key]), key


def test_patch_layout_is_torchtitans_block_order():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (1, 64, 96, 3), dtype=np.uint8)
    ours = patchify(frame, ImageSettings(patch_size=16))
    theirs, grid = vision_to_patches(torch.from_numpy(frame), 16, 2, 2, patch_order="block")
    assert grid.tolist() == [1, 4, 6]
    assert np.array_equal(ours, theirs.numpy())


def test_batch_shapes_and_special_tokens(vlm_batches):
    dl, raw = vlm_batches
    for batch in raw:
        batch = to_device(batch, "cpu")  # uint8 frames -> the float patch rows, as convert does
        out = to_qwen3_5({k: v for k, v in batch.items() if k != "labels"},
                         dl.recipe.collate.special.pad)
        grid = batch["grid_thw"]
        n, longest, width = out["pixel_values"].shape
        assert n == grid.shape[0] and width == 3 * 2 * 16 * 16 and longest % 4 == 0
        assert longest >= int(grid.prod(-1).max())
        assert set(out["special_tokens"]) == {"image_id", "video_id", "vision_start_id",
                                              "vision_end_id", "pad_id"}
        assert out["mrope_positions"].shape == (*batch["input"].shape, 3)
        # the model's own locator finds every item where its patches say it is
        found = get_vision_positions(out["input"], grid.prod(-1) // 4,
                                     out["special_tokens"]["image_id"])
        assert len(found) == grid.shape[0]
        # padding rows are zero, real rows are the flat rows in order
        offset = 0
        for i, k in enumerate(grid.prod(-1).tolist()):
            assert torch.equal(out["pixel_values"][i, :k], batch["pixel_values"][offset:offset + k])
            assert not out["pixel_values"][i, k:].any()
            offset += k


def test_a_batch_of_frames_must_go_through_to_device_first(vlm_batches):
    _, raw = vlm_batches
    with pytest.raises(ValueError, match="to_device"):
        to_qwen3_5({k: v for k, v in raw[0].items() if k != "labels"}, PAD)


def test_mrope_matches_torchtitans_collator(vlm_batches):
    dl, raw = vlm_batches
    fake_self = types.SimpleNamespace(patch_order="block", spatial_merge_size=2)
    checked = 0
    for batch in raw:
        batch = to_device(batch, "cpu")
        special = {"image_id": int(batch["image_token_id"]),
                   "video_id": int(batch["video_token_id"])}
        split = to_qwen3_5({k: v for k, v in batch.items() if k != "labels"}, PAD,
                           video_mode="split", with_mrope=False)
        theirs = MultiModalCollator._build_mrope_positions(
            fake_self, batch["input"], split.get("grid_thw"), split.get("grid_thw_videos"),
            batch["positions"], image_token_id=special["image_id"],
            video_token_id=special["video_id"])
        ours = mrope_positions(batch["input"], batch["positions"], batch["grid_thw"], 2,
                               special["image_id"], special["video_id"])
        assert torch.equal(ours, theirs)
        checked += 1
    assert checked


def _synthetic():
    # row 0: text, an image of grid [1,4,4] (4 tokens), text; row 1: a video [2,4,4]
    # (8 tokens in two frames of 4)
    toks = torch.tensor([[1, VS, IMG, IMG, IMG, IMG, VE, 2, 3, PAD, PAD, PAD, PAD],
                         [VS, VID, VID, VID, VID, VE, VS, VID, VID, VID, VID, VE, 4]])
    pos = torch.tensor([list(range(9)) + [0, 1, 2, 3], list(range(13))])
    grid = torch.tensor([[1, 4, 4], [2, 4, 4]])
    pv = torch.arange(16 * 1536 + 32 * 1536, dtype=torch.float32).view(48, 1536)
    return {"input": toks, "positions": pos, "pixel_values": pv, "grid_thw": grid,
            "image_token_id": torch.tensor(IMG), "video_token_id": torch.tensor(VID),
            "vision_start_token_id": torch.tensor(VS), "vision_end_token_id": torch.tensor(VE)}


def test_video_modes():
    b = _synthetic()
    merged = to_qwen3_5(b, PAD, video_mode="merge")
    # the video of grid (2, 4, 4) is handed over as its two frames, one item each
    assert merged["pixel_values"].shape == (3, 16, 1536) and "pixel_values_videos" not in merged
    assert merged["grid_thw"].tolist() == [[1, 4, 4]] * 3
    assert torch.equal(merged["pixel_values"].reshape(48, 1536), b["pixel_values"])
    assert not (merged["input"] == VID).any() and int((merged["input"] == IMG).sum()) == 12
    split = to_qwen3_5(b, PAD, video_mode="split")
    assert split["pixel_values"].shape == (1, 16, 1536)
    assert split["pixel_values_videos"].shape == (2, 16, 1536)
    assert split["grid_thw_videos"].tolist() == [[1, 4, 4], [1, 4, 4]]
    for inputs in (merged, split):
        QwenVL().check_model_inputs(inputs, vocab_size=VID + 1)
    with pytest.raises(ValueError, match=r"token ids span \[0, 10\] but the model's vocabulary"):
        QwenVL().check_model_inputs(split, vocab_size=VID)
    assert torch.equal(split["input"], b["input"])
    mp = merged["mrope_positions"]
    assert mp[0, :2, 0].tolist() == [0, 1]
    assert mp[0, 2:6].tolist() == [[2, 2, 2], [2, 2, 3], [2, 3, 2], [2, 3, 3]]
    assert mp[0, 6].tolist() == [4, 4, 4]
    assert mp[0, 9].tolist() == [0, 0, 0]  # a new document restarts
    # each frame is positioned as an image after the tokens before it (Qwen3.5)
    assert mp[1, 1:5].tolist() == [[1, 1, 1], [1, 1, 2], [1, 2, 1], [1, 2, 2]]
    assert mp[1, 5:7, 0].tolist() == [3, 4]
    assert mp[1, 7:11].tolist() == [[5, 5, 5], [5, 5, 6], [5, 6, 5], [5, 6, 6]]


def test_qwen3_5_needs_matching_image_settings():
    cfg = ZephonDataLoader.Config(runner="inline", recipe="vlm-demo", num_lanes=2,
                                  global_batch_size=2, model_format="qwen3_5")
    with pytest.raises(ConfigError, match="image_preset qwen3_5"):
        cfg.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=256, local_batch_size=2)


def test_qwen35_registry_config_builds_its_dataloader():
    from zephon_vl.titan import config_registry

    cfg = config_registry.zephon_qwen35_debug()
    assert cfg.dataloader.model_format == "qwen3_5"
    dl = cfg.dataloader.build(dp_world_size=8, dp_rank=7, tokenizer=None,
                              seq_len=cfg.training.seq_len,
                              local_batch_size=cfg.training.local_batch_size,
                              snapshot_every_n_steps=None)
    x, labels = next(iter(dl))
    assert labels.shape == (1, cfg.training.seq_len)
    assert x["pixel_values"].shape[-1] == 1536 and "special_tokens" in x
    dl.close()
