"""A video in Qwen3.5's native layout: zephon's qwen3_5 batch equals TorchTitan's collator.

The same mp4 goes through zephon (shard -> decode -> tokenize -> pack -> collate
-> ``to_qwen3_5``) and through TorchTitan's own pieces (``load_video``, its
placeholder insertion with one vision run per temporal patch, its
``MultiModalTokenizer`` and ``MultiModalCollator``). Input ids, positions,
MRoPE positions, grids and patches must agree.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

import transformers  # noqa: E402,F401  (before the torchvision stub; see zephon_vl.testing.titan_cpu)

from zephon_core import Execution, Loader, qwen_tokenizer_dir  # noqa: E402
from zephon_vl import (  # noqa: E402
    QwenVL,
    TitanOptions,
    VideoSettings,
    get_family,
    vlm_recipe,
    write_shards,
)
from zephon_vl.testing.titan_cpu import stub_torchvision  # noqa: E402
from zephon_vl.testing.video import encode_test_video  # noqa: E402

stub_torchvision()
from torchtitan.components.loss import IGNORE_INDEX  # noqa: E402
from torchtitan.components.tokenizer import MultiModalTokenizer  # noqa: E402
from torchtitan.hf_datasets.multimodal.mm_collator import MultiModalCollator  # noqa: E402
from torchtitan.hf_datasets.multimodal.utils.image import smart_resize  # noqa: E402
from torchtitan.hf_datasets.multimodal.utils.text import insert_vision_placeholders  # noqa: E402
from torchtitan.hf_datasets.multimodal.utils.video import load_video  # noqa: E402
from torchtitan.models.qwen3_5 import QWEN3_5_SPECIAL_TOKENS  # noqa: E402

SEQ_LEN = 512
FRAMES, SIDE, FPS = 6, 256, 2  # 3 temporal patches of a 16 x 16 patch grid
CAPTION = "A square that drifts to the right."


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> tuple[bytes, str, list[str]]:
    rng = np.random.default_rng(5)
    frames = [np.roll(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8), 8 * i, axis=1)
              for i in range(FRAMES)]
    data = encode_test_video(frames, FPS)
    out = tmp_path_factory.mktemp("qwen_video")
    (out / "clip.mp4").write_bytes(data)
    shards = write_shards([{"__key__": "clip", "mp4": data, "txt": CAPTION.encode()}],
                          out / "shards", samples_per_shard=1)
    return data, str(out / "clip.mp4"), [str(p) for p in shards]


def titan_tokenizer() -> MultiModalTokenizer:
    config = MultiModalTokenizer.Config(**QWEN3_5_SPECIAL_TOKENS)
    return config.build(tokenizer_path=str(qwen_tokenizer_dir()))


def zephon_batch(shards: list[str], video_mode: str) -> dict:
    image = QwenVL().image_settings(max_pixels=SIDE * SIDE)
    recipe = vlm_recipe(shards, qwen_tokenizer_dir(), seq_len=SEQ_LEN, global_batch_size=1,
                        num_lanes=1, image=image,
                        video=VideoSettings(fps=FPS, min_frames=2, max_frames=16),
                        shuffle_buffer=0, epochs=1, pack={"image_every_row": False})
    loader = Loader(recipe, 0, 1, Execution(runner="inline"))
    try:
        batch = next(iter(loader))
    finally:
        loader.close()
    inputs = get_family("qwen3_5").titan_inputs({k: v for k, v in batch.items() if k != "labels"},
                                 recipe.collate, TitanOptions(video_mode=video_mode))
    return {**inputs, "labels": batch["labels"]}


def titan_batch(path: str) -> tuple[dict, torch.Tensor]:
    tok = titan_tokenizer()
    frames = load_video(path, fps=FPS, min_frames=2, max_frames=16)
    assert frames is not None and frames.shape == (FRAMES, SIDE, SIDE, 3)
    assert smart_resize(SIDE, SIDE, factor=32, min_pixels=65536, max_pixels=SIDE * SIDE) \
        == (SIDE, SIDE)  # TorchTitan's resize keeps the frames as they are
    video = ((frames.float() / 255 - 0.5) / 0.5)  # process_video's normalization
    t, per_frame = FRAMES // 2, (SIDE // 32) ** 2
    text = insert_vision_placeholders(
        [None] * t + [CAPTION], [per_frame] * t, vision_start_token=tok.vision_start_token,
        vision_token=tok.video_token, vision_end_token=tok.vision_end_token,
        eos_token=tok.eos_token)
    ids = torch.tensor(tok.encode(text))
    special = torch.tensor([tok.vision_start_id, tok.vision_end_id, tok.image_id, tok.video_id])
    labels = torch.where(torch.isin(ids, special), IGNORE_INDEX, ids)
    sample = {"input_ids": ids, "labels": labels, "positions": torch.arange(len(ids)),
              "pixel_values_videos": [video]}
    collator = MultiModalCollator(batch_size=1, seq_len=SEQ_LEN, max_images_per_batch=64,
                                  patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                                  tokenizer=tok, build_mrope_positions=True)
    return collator([sample])


def test_video_layout_equals_torchtitans_collator(clip) -> None:
    _, path, shards = clip
    theirs, their_labels = titan_batch(path)
    ours = zephon_batch(shards, "split")
    n = int((theirs["positions"][0] > 0).sum()) + 1  # the document; the rest is padding
    assert n > 3 * 64
    for key in ("input", "positions"):
        assert torch.equal(ours[key][:, :n], theirs[key][:, :n]), key
    assert torch.equal(ours["mrope_positions"][:, :n], theirs["mrope_positions"][:, :n])
    # TorchTitan's collator hands the video as one item of grid (3, 16, 16); zephon hands
    # its three frames as items of one temporal patch each: the same patches, in order
    assert theirs["grid_thw_videos"].tolist() == [[3, 16, 16]]
    assert ours["grid_thw_videos"].tolist() == [[1, 16, 16]] * 3
    assert "pixel_values" not in ours and theirs["pixel_values"] is None
    assert torch.allclose(ours["pixel_values_videos"].reshape(1, 3 * 256, -1),
                          theirs["pixel_values_videos"], atol=1e-6)
    # labels: zephon trains on the caption only (-100 on the frames), like TorchTitan
    assert torch.equal(ours["labels"][:, :n - 1], their_labels[:, :n - 1])
    # three frames: three vision runs, as the Qwen3.5 chat template lays a video out
    vs = QWEN3_5_SPECIAL_TOKENS["vision_start_token"]
    assert int((ours["input"] == titan_tokenizer().tokenizer.token_to_id(vs)).sum()) == 3


def test_torchtitans_own_model_refuses_its_collators_video_and_accepts_zephons(clip) -> None:
    """The reason for the frame items: the qwen3_5 forward wants one placeholder run per
    item, and a Qwen3.5 video (as TorchTitan's collator positions it) is one run per frame."""
    _, path, shards = clip
    theirs, _ = titan_batch(path)
    family = get_family("qwen3_5")
    with pytest.raises(ValueError, match="found 3 contiguous run.*received 1 visual item"):
        family.check_model_inputs({k: v for k, v in theirs.items() if v is not None})
    for mode in ("split", "merge"):
        family.check_model_inputs(zephon_batch(shards, mode))


def test_merged_video_keeps_the_native_positions(clip) -> None:
    """video_mode="merge" renames the placeholders but positions the frames the same way."""
    _, _, shards = clip
    split, merged = zephon_batch(shards, "split"), zephon_batch(shards, "merge")
    assert torch.equal(split["mrope_positions"], merged["mrope_positions"])
    assert torch.equal(merged["grid_thw"], split["grid_thw_videos"])
    assert torch.equal(merged["pixel_values"], split["pixel_values_videos"])


def test_qwen3_5_preset_min_pixels_is_torchtitans() -> None:
    from torchtitan.models.qwen3_5.config_registry import qwen35_debugmodel

    theirs = qwen35_debugmodel().dataloader
    ours = QwenVL().image_settings(max_pixels=theirs.max_pixels)
    assert ours.min_pixels == theirs.min_pixels
    assert (ours.patch_size, ours.temporal_patch_size, ours.merge_size) == \
        (theirs.patch_size, theirs.temporal_patch_size, theirs.spatial_merge_size)
