"""Every family's samples equal TorchTitan's own ``MMDataLoader`` pipeline, sample by sample.

The same shards go through zephon (shard -> decode -> resize -> patchify ->
tokenize -> collate -> the family's ``titan_inputs``) and through TorchTitan's
``_process_mm_sample`` (``mm_datasets.py``: its resize rule, padding,
normalization, placeholders, tokenizer, labels) and ``MultiModalCollator``
(its patch order, padding, MRoPE), configured as TorchTitan's own debug
config of that model configures its dataloader. Token ids, labels, positions,
grids, pixels and (qwen3_5) MRoPE positions must agree.

Pixels: TorchTitan decodes and resizes with torchvision, whose CUDA wheels do
not load on this CPU-only torch; ``pil_torchvision`` stands in with PIL's
bicubic (zephon's resampler), so the pixels of resized images are compared
through the same resampler, and images TorchTitan's rule keeps at their size
(kimi's patch budget pads, never upscales) are compared with no stand-in in
the way. Videos: TorchTitan 0.3.0's datasets (cc12m, obelics) take no video,
so no sample-level video comparison exists (tests/titan/test_titan_qwen_video.py
compares qwen3_5's video layout with its collator).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

import transformers  # noqa: E402,F401  (before the torchvision stub; see zephon_vl.testing.titan_cpu)

from zephon_core import Execution, Loader  # noqa: E402
from zephon_vl import TitanOptions, get_family, vlm_recipe, write_shards  # noqa: E402
from zephon_vl.testing.titan_cpu import pil_torchvision  # noqa: E402

STAND_IN = pil_torchvision()
from torchtitan.components.tokenizer import MultiModalTokenizer  # noqa: E402
from torchtitan.hf_datasets.multimodal.mm_collator import MultiModalCollator  # noqa: E402
from torchtitan.hf_datasets.multimodal.mm_datasets import _process_mm_sample  # noqa: E402

SEQ_LEN = 1024
CAPTION = "A cat lies on a red blanket and looks at the camera.  \n"
PARTS = ["Two photos follow.", None, "The first is a cat;", None, "the second a cup. "]


def _photo(name: str) -> bytes:
    import skimage
    from PIL import Image

    with Image.open(Path(skimage.__file__).parent / "data" / name) as img:
        out = io.BytesIO()
        img.convert("RGB").save(out, format="PNG")
    return out.getvalue()


def titan_setup(family: str) -> tuple[dict, str]:
    """TorchTitan's own dataloader config of the family's debug model, and its tokens."""
    if family == "kimi_k2_5":
        from torchtitan.models.kimi_k2_7 import KIMI_K2_5_SPECIAL_TOKENS as tokens
        from torchtitan.models.kimi_k2_7.config_registry import kimi_k2_5_debugmodel as cfg
    elif family == "muse_glimmer":
        from torchtitan.models.muse_glimmer.config_registry import (
            MUSE_GLIMMER_SPECIAL_TOKENS as tokens,
        )
        from torchtitan.models.muse_glimmer.config_registry import (
            muse_glimmer_debugmodel_mm as cfg,
        )
    else:
        pytest.importorskip("fla", reason="qwen3_5 needs fla-core (scripts/setup.sh installs it)")
        from torchtitan.models.qwen3_5 import QWEN3_5_SPECIAL_TOKENS as tokens
        from torchtitan.models.qwen3_5.config_registry import qwen35_debugmodel as cfg
    return cfg().dataloader, tokens


def theirs(family: str, texts: list, images: list, **limits) -> dict:
    dl, tokens = titan_setup(family)
    for key, value in limits.items():
        setattr(dl, key, value)
    tok = MultiModalTokenizer.Config(**tokens).build(
        tokenizer_path=str(get_family(family).tokenizer_dir()))
    sample = _process_mm_sample(
        list(texts), list(images), tok, patch_size=dl.patch_size,
        temporal_patch_size=dl.temporal_patch_size, spatial_merge_size=dl.spatial_merge_size,
        min_pixels=dl.min_pixels, max_pixels=dl.max_pixels, image_mean=dl.image_mean,
        image_std=dl.image_std, resize_fn=dl.resize_fn, max_patches=dl.max_patches,
        max_patches_per_side=dl.max_patches_per_side)
    assert sample is not None, "TorchTitan dropped the sample"
    collator = MultiModalCollator(
        batch_size=1, seq_len=SEQ_LEN, max_images_per_batch=dl.max_images_per_batch,
        patch_size=dl.patch_size, temporal_patch_size=dl.temporal_patch_size,
        spatial_merge_size=dl.spatial_merge_size, tokenizer=tok,
        build_mrope_positions=dl.build_mrope_positions, patch_order=dl.patch_order)
    x, labels = collator([sample])
    return {**x, "labels": labels}


def ours(family: str, sample: dict, tmp: Path, **limits) -> dict:
    fam = get_family(family)
    dl, _ = titan_setup(family)
    for key, value in limits.items():
        setattr(dl, key, value)
    image = fam.image_settings(dl.max_pixels, dl.min_pixels,
                               max_patches=limits.get("max_patches"))
    shards = write_shards([sample], tmp, samples_per_shard=1)
    recipe = vlm_recipe([str(s) for s in shards], fam.tokenizer_dir(), seq_len=SEQ_LEN,
                        global_batch_size=1, num_lanes=1, image=image, shuffle_buffer=0,
                        epochs=1, pack={"image_every_row": False}, family=family)
    with Loader(recipe, 0, 1, Execution(runner="inline")) as loader:
        batch = next(iter(loader))
    x = fam.titan_inputs({k: v for k, v in batch.items() if k != "labels"}, recipe.collate,
                         TitanOptions(video_mode="split"))
    fam.check_model_inputs(x)
    return {**x, "labels": batch["labels"]}


def assert_same(a: dict, b: dict, resized: bool) -> None:
    n = int(b["positions"][0].argmax()) + 1  # the document; the rest is padding
    assert n > 10
    for key in ("input", "positions", "labels"):
        assert torch.equal(a[key][:, :n], b[key][:, :n]), key
    assert int((a["input"][:, n:] != b["input"][:, n:]).sum()) == 0, "padding ids"
    assert torch.equal(a["grid_thw"], b["grid_thw"])
    assert a["special_tokens"] == b["special_tokens"]
    if "mrope_positions" in b:
        assert torch.equal(a["mrope_positions"][:, :n], b["mrope_positions"][:, :n])
    else:
        assert "mrope_positions" not in a
    assert a["pixel_values"].shape == b["pixel_values"].shape
    if STAND_IN or not resized:
        assert torch.allclose(a["pixel_values"], b["pixel_values"], atol=1e-6, rtol=0)


FAMILIES = ["qwen3_5", "kimi_k2_5", "muse_glimmer"]


@pytest.mark.parametrize("family", FAMILIES)
def test_image_caption_sample_equals_torchtitans(family, tmp_path) -> None:
    png = _photo("chelsea.png")  # 451 x 300: kimi pads it to 476 x 308 and resizes nothing
    sample = {"__key__": "cat", "png": png, "txt": CAPTION}
    a, b = ours(family, sample, tmp_path), theirs(family, [None, CAPTION], [png, None])
    assert_same(a, b, resized=family != "kimi_k2_5")
    if family == "kimi_k2_5":
        assert a["grid_thw"].tolist() == [[1, 22, 34]]


@pytest.mark.parametrize("family", FAMILIES)
def test_interleaved_sample_equals_torchtitans(family, tmp_path) -> None:
    images = [_photo("chelsea.png"), _photo("coffee.png")]
    sample = {"__key__": "two", "0.png": images[0], "1.png": images[1],
              "json": {"text": PARTS}}
    titan_images = [None, images[0], None, images[1], None]
    a = ours(family, sample, tmp_path)
    b = theirs(family, PARTS, titan_images)
    assert_same(a, b, resized=family != "kimi_k2_5")
    assert a["grid_thw"].shape[0] == 2


def test_kimi_patch_budget_scales_down_then_pads_as_torchtitan(tmp_path) -> None:
    png = _photo("coffee.png")  # 600 x 400 = 1200 patches > 256: scaled down, then padded
    sample = {"__key__": "cup", "png": png, "txt": CAPTION}
    a = ours("kimi_k2_5", sample, tmp_path, max_patches=256)
    b = theirs("kimi_k2_5", [None, CAPTION], [png, None], max_patches=256)
    assert_same(a, b, resized=True)
    t, h, w = a["grid_thw"][0].tolist()
    assert h * w >= 256 and h % 2 == 0 and w % 2 == 0 and h * w < 1200


def test_caption_whitespace_is_stripped_as_torchtitan_does(tmp_path) -> None:
    """zephon used to keep a caption's trailing whitespace; TorchTitan strips it."""
    a = ours("muse_glimmer", {"__key__": "c", "png": _photo("chelsea.png"), "txt": CAPTION},
             tmp_path)
    tok = transformers.AutoTokenizer.from_pretrained(str(get_family("qwen3_5").tokenizer_dir()))
    ids = a["input"][0].tolist()
    end = ids.index(a["special_tokens"]["vision_end_id"])
    eos = ids.index(tok.eos_token_id, end)
    assert ids[end + 1:eos] == tok(CAPTION.rstrip(), add_special_tokens=False)["input_ids"]
    assert ids[end + 1:eos] != tok(CAPTION, add_special_tokens=False)["input_ids"]
