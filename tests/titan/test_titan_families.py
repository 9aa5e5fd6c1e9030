"""kimi_k2_5 and muse_glimmer against TorchTitan's code: geometry, conversion, model checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

import transformers  # noqa: E402,F401  (before the torchvision stub; see zephon_vl.testing.titan_cpu)

from zephon_core import load_tokenizer  # noqa: E402
from zephon_vl import ImageSettings, get_family, kimi_tokenizer_dir  # noqa: E402
from zephon_vl.media.image import patch_budget_resize, patchify  # noqa: E402
from zephon_vl.testing.titan_cpu import stub_torchvision  # noqa: E402
from zephon_vl.titan.dataloader import ZephonDataLoader  # noqa: E402

stub_torchvision()
from torchtitan.hf_datasets.multimodal.utils.image import (  # noqa: E402
    resize_to_patch_budget,
    vision_to_patches,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9000), st.integers(1, 9000), st.sampled_from([14, 16]),
       st.integers(1, 20000), st.integers(1, 600))
def test_patch_budget_resize_is_torchtitans(h, w, patch, max_patches, per_side) -> None:
    got = patch_budget_resize(h, w, patch, max_patches, per_side)
    want = resize_to_patch_budget(h, w, patch_size=patch, merge_size=2, max_patches=max_patches,
                                  max_patches_per_side=per_side)
    assert got == want[:2]


@pytest.mark.parametrize("order", ["block", "raster"])
@pytest.mark.parametrize("temporal", [1, 2])
def test_patch_order_is_torchtitans(order, temporal) -> None:
    frames = np.random.default_rng(1).integers(0, 256, (temporal, 56, 84, 3), dtype=np.uint8)
    ours = patchify(frames, ImageSettings(patch_size=14, temporal_patch_size=temporal,
                                          patch_order=order))
    theirs, grid = vision_to_patches(torch.from_numpy(frames), 14, temporal, 2,
                                     patch_order=order)
    assert grid.tolist() == [1, 4, 6] and np.array_equal(ours, theirs.numpy())


def test_presets_are_torchtitans_debug_dataloaders() -> None:
    from torchtitan.models.kimi_k2_7.config_registry import kimi_k2_5_debugmodel
    from torchtitan.models.muse_glimmer.config_registry import muse_glimmer_debugmodel_mm

    for family, cfg in (("kimi_k2_5", kimi_k2_5_debugmodel), ("muse_glimmer",
                                                             muse_glimmer_debugmodel_mm)):
        theirs = cfg().dataloader
        ours = get_family(family).image_settings(theirs.max_pixels)
        assert (ours.patch_size, ours.temporal_patch_size, ours.merge_size, ours.patch_order,
                ours.min_pixels, ours.image_mean, ours.image_std) == \
            (theirs.patch_size, theirs.temporal_patch_size, theirs.spatial_merge_size,
             theirs.patch_order, theirs.min_pixels, tuple(theirs.image_mean),
             tuple(theirs.image_std)), family
        assert ours.resize == {"resize_to_patch_budget": "patches",
                               "resize_to_pixel_budget": "pixels"}[theirs.resize_fn.__name__]
        if ours.resize == "patches":
            assert (ours.max_patches, ours.max_patches_per_side) == \
                (theirs.max_patches, theirs.max_patches_per_side)


@pytest.mark.parametrize("name", ["zephon_kimi_debug", "zephon_muse_debug"])
def test_registry_config_builds_its_dataloader_and_covers_the_vocabulary(name) -> None:
    from torchtitan.components.tokenizer import MultiModalTokenizer  # noqa: F401

    from zephon_vl.titan import config_registry

    cfg = getattr(config_registry, name)()
    family = get_family(cfg.dataloader.model_format)
    assert cfg.dataloader.image_preset == family.name
    tok = cfg.tokenizer.build(tokenizer_path=cfg.hf_assets_path)
    assert tok.get_vocab_size() <= cfg.model_spec.model.vocab_size
    assert cfg.model_spec.model.lm_head.out_features == cfg.model_spec.model.vocab_size
    dl = cfg.dataloader.build(dp_world_size=8, dp_rank=7, tokenizer=tok,
                              seq_len=cfg.training.seq_len,
                              local_batch_size=cfg.training.local_batch_size,
                              snapshot_every_n_steps=None)
    x, labels = next(iter(dl))
    dl.close()
    assert labels.shape == (1, cfg.training.seq_len)
    assert int(x["input"].max()) < tok.get_vocab_size()
    family.check_model_inputs(x)
    assert "mrope_positions" not in x


def test_kimi_tokenizer_is_qwens_plus_kimis_tokens() -> None:
    from torchtitan.models.kimi_k2_7 import KIMI_K2_5_SPECIAL_TOKENS

    from zephon_core import qwen_tokenizer_dir
    from zephon_vl.families.kimi import KIMI_VISION_TOKENS

    assert KIMI_VISION_TOKENS == KIMI_K2_5_SPECIAL_TOKENS
    kimi, qwen = load_tokenizer(kimi_tokenizer_dir()), load_tokenizer(qwen_tokenizer_dir())
    assert len(kimi) == len(qwen) + 8
    text = "A cat on a mat, 12 times."
    assert kimi(text)["input_ids"] == qwen(text)["input_ids"]
    ids = kimi.convert_tokens_to_ids(sorted(set(KIMI_K2_5_SPECIAL_TOKENS.values())))
    assert min(ids) >= len(qwen) and kimi.pad_token_id == kimi.convert_tokens_to_ids(["[PAD]"])[0]


def _kimi_inputs():
    """A valid kimi batch: two images of grids (1, 4, 6) and (1, 2, 2) in one row."""
    fam = get_family("kimi_k2_5")
    sp = {"image_id": 9, "video_id": 9, "vision_start_id": 7, "vision_end_id": 8, "pad_id": 0}
    row = [1, 7] + [9] * 6 + [8, 2, 7, 9, 8, 3]
    x = {"input": torch.tensor([row + [0] * (20 - len(row))]),
         "positions": torch.arange(20)[None], "pixel_values": torch.zeros(2, 24, 588),
         "grid_thw": torch.tensor([[1, 4, 6], [1, 2, 2]]), "special_tokens": sp}
    fam.check_model_inputs(x)
    return fam, x


@pytest.mark.parametrize("change, match", [
    (lambda x: x["input"].__setitem__((0, 3), 1), "Multimodal misalignment"),
    (lambda x: x.__setitem__("grid_thw", torch.tensor([[1, 4, 6], [1, 2, 3]])), "merge kernel"),
    (lambda x: x.__setitem__("pixel_values", torch.zeros(2, 24, 1176)), "588"),
    (lambda x: x.__setitem__("pixel_values", torch.zeros(2, 20, 588)), "does not fit"),
    (lambda x: x["special_tokens"].__setitem__("video_id", 10), "image_id == video_id"),
    (lambda x: [x.pop("pixel_values"), x.pop("grid_thw")], "no pixel_values"),
])
def test_kimi_model_checks_name_the_problem(change, match) -> None:
    fam, x = _kimi_inputs()
    change(x)
    with pytest.raises(ValueError, match=match):
        fam.check_model_inputs(x)


def test_kimi_model_check_is_the_models_own_locator() -> None:
    """A row that the model's get_vision_positions accepts passes; two items that share one
    run (no start/end tokens between them) are refused as the model would refuse them."""
    fam, x = _kimi_inputs()
    x["input"][0, 10:13] = torch.tensor([9, 9, 9])  # the 2nd image's run grows into text
    with pytest.raises(ValueError, match="kimi_k2_5: Multimodal misalignment"):
        fam.check_model_inputs(x)


def _muse_inputs():
    fam = get_family("muse_glimmer")
    sp = {"image_id": 9, "video_id": 10, "vision_start_id": 7, "vision_end_id": 8, "pad_id": 0}
    row = [1, 7, 9, 9, 9, 9, 8, 7, 9, 8, 2]
    x = {"input": torch.tensor([row]), "positions": torch.arange(len(row))[None],
         "pixel_values": torch.zeros(2, 16, 1176),
         "grid_thw": torch.tensor([[1, 4, 4], [1, 2, 2]]), "special_tokens": sp}
    fam.check_model_inputs(x)
    return fam, x


@pytest.mark.parametrize("change, match", [
    (lambda x: x["input"].__setitem__((0, 2), 1), "4 image_id placeholders but the encoder "
                                                   "gives 5"),
    (lambda x: x.__setitem__("grid_thw", torch.tensor([[2, 4, 4], [1, 2, 2]])), "== 1 only"),
    (lambda x: x.__setitem__("grid_thw", torch.tensor([[1, 4, 4], [1, 2, 3]])), "divisible"),
    (lambda x: x.__setitem__("pixel_values_videos", torch.zeros(1, 4, 1176)), "videos"),
    (lambda x: x.__setitem__("pixel_values", torch.zeros(2, 16, 588)), "1176"),
])
def test_muse_model_checks_name_the_problem(change, match) -> None:
    fam, x = _muse_inputs()
    change(x)
    with pytest.raises(ValueError, match=match):
        fam.check_model_inputs(x)


def test_muse_gets_a_video_as_one_image_per_temporal_patch() -> None:
    from zephon_vl.families.muse import to_muse_glimmer

    VS, VE, IMG, VID = 7, 8, 9, 10
    frame = [VS, VID, VID, VID, VID, VE]
    batch = {"input": torch.tensor([[1, VS, IMG, VE] + frame * 3 + [2]]),
             "positions": torch.arange(23)[None],
             "pixel_values": torch.arange(4 + 3 * 16, dtype=torch.float32)[:, None]
             .expand(-1, 1176).contiguous(),
             "grid_thw": torch.tensor([[1, 2, 2], [3, 4, 4]]),
             "image_token_id": torch.tensor(IMG), "video_token_id": torch.tensor(VID),
             "vision_start_token_id": torch.tensor(VS), "vision_end_token_id": torch.tensor(VE)}
    x = to_muse_glimmer(batch, 0)
    assert x["grid_thw"].tolist() == [[1, 2, 2]] + [[1, 4, 4]] * 3
    assert not (x["input"] == VID).any() and int((x["input"] == IMG).sum()) == 13
    assert x["pixel_values"].shape == (4, 16, 1176)
    assert x["pixel_values"][1, :, 0].tolist() == list(range(4, 20))  # frame 0 of the video
    assert x["pixel_values"][3, :, 0].tolist() == list(range(36, 52))  # its last frame
    assert not x["pixel_values"][0, 4:].any()
    get_family("muse_glimmer").check_model_inputs(x)


def test_kimi_video_is_one_run_the_encoder_pools_over_time() -> None:
    fam = get_family("kimi_k2_5")
    assert fam.item_tokens([5, 4, 6], 2) == 6 == fam.item_tokens([1, 4, 6], 2)
    from zephon_vl.families.kimi import KimiTokens

    sp = KimiTokens(1, 2, 3, 4, 5, 6, 7, 8, 9, 0)
    from zephon_vl import VisionPatches

    video = VisionPatches(np.zeros((120, 588), np.uint8), np.array([5, 4, 6]))
    assert fam.placeholder(sp, video, 2, video=True).tolist() == [1] + [3] * 6 + [2]


def test_image_preset_builds_the_recipe_for_the_family() -> None:
    cfg = ZephonDataLoader.Config(runner="inline", recipe="vlm-demo", num_lanes=2,
                                  global_batch_size=2, model_format="kimi_k2_5",
                                  image_preset="kimi_k2_5", max_patches=300)
    dl = cfg.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=512,
                   local_batch_size=2, snapshot_every_n_steps=None)
    try:
        image = dl.recipe.collate.image
        assert (image.patch_order, image.resize, image.max_patches) == ("raster", "patches", 300)
        assert dl.recipe.collate.family.name == "kimi_k2_5"
        x, _ = next(iter(dl))
        for _, h, w in x["grid_thw"].tolist():  # padding to 28 pixels adds < 2 patches a side
            assert h % 2 == w % 2 == 0 and (h - 2) * (w - 2) < 300
    finally:
        dl.close()


@pytest.mark.parametrize("family", ["kimi_k2_5", "muse_glimmer"])
def test_the_models_own_forward_takes_zephon_batches_with_videos(family, tmp_path_factory):
    """TorchTitan's debug model (1 layer, 1 vision block, 2,048 folded ids) runs forward and
    backward on zephon batches of the demo data, videos included, after the family's
    check_model_inputs passed them."""
    from tests.helpers.vl import demo_shards
    from zephon_core import Execution, Loader
    from zephon_vl import TitanOptions, VideoSettings, vlm_recipe
    from zephon_vl.testing.tiny_model import build_model, fold_vocab, loss_sum

    fam = get_family(family)
    image = fam.image_settings(3136, 784, max_patches=64 if family == "kimi_k2_5" else None)
    recipe = vlm_recipe(demo_shards(tmp_path_factory), fam.tokenizer_dir(), seq_len=512,
                        global_batch_size=2, num_lanes=1, image=image, family=family,
                        video=VideoSettings(fps=1, min_frames=2, max_frames=4,
                                            max_pixels_per_frame=3136))
    model = build_model(family, vocab_size=2048, layers=1, vision_layers=1)
    videos = 0
    with Loader(recipe, 0, 1, Execution(runner="inline")) as loader:
        for _ in range(40):
            batch = next(loader)
            if not (batch["grid_thw"][:, 0] > 1).any():
                continue
            videos += 1
            x = fam.titan_inputs({k: v for k, v in batch.items() if k != "labels"},
                                 recipe.collate, TitanOptions())
            fam.check_model_inputs(x)
            (x, labels), = fold_vocab([(x, batch["labels"])], 2048)
            loss = loss_sum(model, x, labels, torch.device("cpu"))
            loss.backward()
            assert torch.isfinite(loss) and loss > 0
            if videos == 2:
                break
    assert videos, "no batch with a video in the steps read"


def test_a_recipe_file_without_tokenizer_takes_the_familys(tmp_path) -> None:
    """A ``kind = "vlm"`` file that names no tokenizer gets the family's (Kimi's special
    tokens for kimi_k2_5); naming the plain Qwen vocabulary for kimi is refused, naming the
    missing tokens (CI caught the old default, which was always Qwen's)."""
    from tests.helpers.formats import recipe_toml, write_llava
    from zephon_core import load_recipe

    llava, images, _ = write_llava(tmp_path / "llava", records=10)
    datasets = [{"name": "llava", "format": "llava", "files": [str(llava)],
                 "image_folder": str(images)}]
    kimi = get_family("kimi_k2_5")
    image = kimi.image_settings(50176, 3136, max_patches=300)
    recipe = load_recipe(str(recipe_toml(tmp_path / "mine.toml", datasets)),
                         family="kimi_k2_5", image=image)
    assert recipe.collate.family.name == "kimi_k2_5"  # built: the family's check found its tokens
    qwen = recipe_toml(tmp_path / "qwen.toml", datasets, tokenizer="qwen")
    with pytest.raises(Exception, match="media_begin"):
        load_recipe(str(qwen), family="kimi_k2_5", image=image)
