"""Model families: the registry, the Qwen family's layout, and a family added by a test.

`TinyFamily` below is what adding a family takes: one class and one
`register_family` call. Its placeholder is a bare run of ``<|image_pad|>``
(no start/end markers) and its turns are ``role: ...`` lines, so every batch
it shapes differs from the Qwen ones; the tests follow it through the
pipeline (recipe, tokenize, pack, collate, fingerprint) and through
TorchTitan's dataloader with a recipe file that names it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.vl import (
    IGNORE,
    LEAN,
    MERGE,
    STEPS,
    demo_shards,
    make_recipe,
    reference,
    special,
    text_ids,
    tokenizer_dir,
)
from zephon_core import ConfigError, Loader, batch_digest
from zephon_vl import (
    QwenVL,
    TitanOptions,
    VisionFamily,
    VisionPatches,
    family_names,
    get_family,
    recipe_family,
    register_family,
    unregister_family,
    vision_family,
)
from zephon_vl.families.qwen import SPECIAL_KEYS


@dataclass(frozen=True)
class TinyTokens:
    image: int
    video: int
    eos: int
    pad: int


class TinyFamily(VisionFamily):
    """N x <|image_pad|> (<|video_pad|> for videos) per item; ``role: `` ... ``\\n`` turns."""

    name = "tiny-vl"

    def special_tokens(self, tokenizer: Any) -> TinyTokens:
        image, video = tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>"])
        eos = tokenizer.eos_token_id
        return TinyTokens(image, video, eos, tokenizer.pad_token_id or eos)

    def placeholder(self, special: TinyTokens, patches: VisionPatches, merge_size: int,
                    video: bool) -> np.ndarray:
        return np.full(patches.num_tokens(merge_size), special.video if video else special.image,
                       dtype=np.int64)

    def chat_turn(self, special: TinyTokens, role: str, encode) -> tuple[list[int], list[int]]:
        return encode(f"{role}: "), encode("\n")

    def batch_token_ids(self, special: TinyTokens) -> dict[str, int]:
        return {"image_token_id": special.image, "video_token_id": special.video}

    def vision_token_ids(self, special: TinyTokens) -> tuple[int, ...]:
        return (special.image, special.video)

    def titan_inputs(self, batch: dict[str, Any], collate: Any,
                     options: TitanOptions) -> dict[str, Any]:
        return {k: batch[k] for k in ("input", "positions", "pixel_values", "grid_thw")}


@pytest.fixture
def tiny():
    family = TinyFamily()
    register_family(family)
    yield family
    unregister_family(family.name)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference(tmp_path_factory)


def test_registry_knows_the_builtins_and_refuses_mistakes(tiny) -> None:
    assert {"text", "qwen3_5", "tiny-vl"} <= set(family_names())
    assert get_family("tiny-vl") is tiny and vision_family("tiny-vl") is tiny
    assert isinstance(get_family("qwen3_5"), QwenVL) and not get_family("text").vision
    with pytest.raises(ConfigError, match=r"unknown model family 'llava'; known: .*qwen3_5"):
        get_family("llava")
    with pytest.raises(ConfigError, match="already registered"):
        register_family(TinyFamily())
    register_family(TinyFamily(), replace=True)
    assert get_family("tiny-vl") is not tiny
    with pytest.raises(ConfigError, match="takes no images"):
        vision_family("text")
    with pytest.raises(ConfigError, match="ModelFamily instance"):
        register_family("tiny-vl")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown model family"):
        unregister_family("llava")


def test_registration_is_explicit() -> None:
    assert "tiny-vl" not in family_names()  # the fixture of the test above took it out again
    with pytest.raises(ConfigError, match="unknown model family 'tiny-vl'"):
        make_recipe(["unused.tar"], family="tiny-vl")


def test_qwen_family_layout() -> None:
    qwen, sp = get_family("qwen3_5"), special()
    patches = VisionPatches(np.zeros((24, 3 * 14 * 14), np.uint8), np.array([1, 4, 6]))
    image = qwen.placeholder(sp, patches, 2, video=False)
    assert image.tolist() == [sp.vision_start] + [sp.image_pad] * 6 + [sp.vision_end]
    video = qwen.placeholder(sp, patches, 2, video=True)
    assert video.tolist() == [sp.vision_start] + [sp.video_pad] * 6 + [sp.vision_end]
    opening, closing = qwen.chat_turn(sp, "user", text_ids)
    assert opening == [sp.im_start] + text_ids("user\n") and closing == [sp.im_end, *text_ids("\n")]
    assert list(qwen.batch_token_ids(sp)) == list(SPECIAL_KEYS)
    preset = qwen.image_settings(64 * 32 * 32)
    assert (preset.patch_size, preset.temporal_patch_size, preset.merge_size) == (16, 2, 2)
    assert preset.image_mean == preset.image_std == (0.5, 0.5, 0.5)
    assert preset.max_pixels == 64 * 32 * 32


def test_a_registered_family_shapes_every_batch(tiny, tmp_path_factory, ref) -> None:
    recipe = make_recipe(demo_shards(tmp_path_factory), family="tiny-vl")
    assert recipe_family(recipe) is tiny and recipe_family(ref.recipe).name == "qwen3_5"
    fingerprint = recipe.fingerprint()
    assert fingerprint["collate"]["family"] == "tiny-vl"
    assert [o["family"] for o in fingerprint["operators"] if "family" in o] == ["tiny-vl"]
    assert fingerprint != ref.recipe.fingerprint()
    ids, qwen_ids = recipe.collate.special, special()
    opening = text_ids("user: ")
    with Loader(recipe, 0, 1, LEAN) as loader:
        batches = [next(loader) for _ in range(STEPS)]
    saw_turn = False
    for step, batch in enumerate(batches):
        assert set(batch) == {"input", "labels", "positions", "pixel_values", "grid_thw",
                              "image_token_id", "video_token_id"}
        assert int(batch["image_token_id"]) == ids.image
        tokens, labels = batch["input"].numpy(), batch["labels"].numpy()
        for banned in (qwen_ids.vision_start, qwen_ids.vision_end, qwen_ids.im_start):
            assert not (tokens == banned).any(), (step, banned)
        vision = (tokens == ids.image) | (tokens == ids.video)
        assert not np.isin(labels, [ids.image, ids.video]).any()  # never a target
        assert (labels[:, :-1][vision[:, 1:]] == IGNORE).all()
        # items follow the rows' placeholder runs in order, N = t*h*w / merge^2 each
        per_item = (batch["grid_thw"].prod(-1) // MERGE ** 2).tolist()
        assert sum(per_item) == int(vision.sum())
        assert batch["pixel_values"].shape[0] == int(batch["grid_thw"].prod(-1).sum())
        k = 0
        for r, row in enumerate(vision):
            want = int(row.sum())
            while want > 0:
                want -= per_item[k]
                k += 1
            assert want == 0, f"step {step} row {r}: an item's placeholders cross rows"
        saw_turn |= any(_contains(row.tolist(), opening) for row in tokens)
    assert saw_turn, "no conversation turn in the steps checked"
    assert [batch_digest(b) for b in batches] != ref.digests


def _contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_a_registered_family_through_torchtitan(tiny, tmp_path_factory, tmp_path) -> None:
    pytest.importorskip("torchtitan", reason="torchtitan is not installed")
    from zephon_vl.titan.dataloader import ZephonDataLoader

    recipe_file = tmp_path / "tiny.toml"
    recipe_file.write_text("\n".join([
        'kind = "vlm"', 'family = "tiny-vl"', "max_images = 5",
        "[image]", "max_pixels = 100352",
        "[[datasets]]", 'name = "demo"', f"files = {json.dumps(demo_shards(tmp_path_factory))}",
    ]))

    def build(model_format: str) -> ZephonDataLoader:
        cfg = ZephonDataLoader.Config(recipe=str(recipe_file), model_format=model_format,
                                      num_lanes=2, global_batch_size=4)
        return cfg.build(dp_world_size=2, dp_rank=1, tokenizer=None, seq_len=512,
                         local_batch_size=2)

    dl = build("tiny-vl")
    x, labels = next(iter(dl))
    dl.close()
    assert set(x) == {"input", "positions", "pixel_values", "grid_thw"}
    assert x["input"].shape == labels.shape == (2, 512)
    assert x["pixel_values"].dtype == torch.float32 and x["grid_thw"].shape[1] == 3
    with pytest.raises(ConfigError, match="VLM recipe .*model_format='tiny-vl'"):
        build("text")  # a text model would never see the images
    with pytest.raises(ConfigError, match="built for model family 'tiny-vl', not 'qwen3_5'"):
        build("qwen3_5")


class TinyPatchFamily(TinyFamily):
    """A test family with a geometry of its own: patch 8, one frame per patch, raster
    order, a budget of 64 patches with padding. The class attributes are all it takes."""

    name = "tiny-patches"
    preset = {"patch_size": 8, "temporal_patch_size": 1, "merge_size": 2,
              "patch_order": "raster", "resize": "patches", "max_patches": 64,
              "max_patches_per_side": 16}


@pytest.fixture
def tiny_patches():
    family = TinyPatchFamily()
    register_family(family)
    yield family
    unregister_family(family.name)


def test_a_family_owns_its_geometry(tiny_patches, tmp_path_factory) -> None:
    image = tiny_patches.image_settings(max_pixels=100352)
    assert (image.patch_size, image.temporal_patch_size, image.patch_order, image.resize,
            image.max_patches) == (8, 1, "raster", "patches", 64)
    recipe = make_recipe(demo_shards(tmp_path_factory), family="tiny-patches", image=image)
    fingerprint = json.dumps(recipe.fingerprint())
    assert '"patch_order": "raster"' in fingerprint and '"resize": "patches"' in fingerprint
    tiny_patches.check_recipe(recipe)
    with Loader(recipe, 0, 1, LEAN) as loader:
        batch = next(loader)
    grid = batch["grid_thw"]
    assert batch["pixel_values"].shape[1] == 3 * 1 * 8 * 8
    assert (grid[:, 1:] % 2 == 0).all() and (grid[:, 0] > 1).any()  # videos: frame by frame
    # every frame scaled down to <= 64 patches, then padded by < 16 pixels (2 patches) a side
    assert ((grid[:, 1] - 2) * (grid[:, 2] - 2) < 64).all() and (grid[:, 1:] <= 18).all()
    assert (grid[:, 1] * grid[:, 2] > 64).any()  # the padding, not the budget
    # a recipe with another encoder geometry is refused, naming the preset
    other = make_recipe(demo_shards(tmp_path_factory), family="tiny-patches")
    with pytest.raises(ConfigError, match="image_preset tiny-patches"):
        tiny_patches.check_recipe(other)


def test_new_image_settings_keep_old_fingerprints() -> None:
    from zephon_vl import ImageSettings

    old = ImageSettings().settings()
    assert not {"patch_order", "resize", "max_patches", "max_patches_per_side"} & set(old)
    raster = ImageSettings(patch_order="raster").settings()
    assert raster["patch_order"] == "raster" and raster != old
    with pytest.raises(ConfigError, match="patch_order"):
        ImageSettings(patch_order="zigzag")
    with pytest.raises(ConfigError, match="resize"):
        ImageSettings(resize="crop")


def test_kimi_and_muse_layouts() -> None:
    from zephon_core import load_tokenizer
    from zephon_vl import kimi_tokenizer_dir

    kimi = get_family("kimi_k2_5")
    tok = load_tokenizer(kimi_tokenizer_dir())
    sp = kimi.special_tokens(tok)
    ids = dict(zip(["<|media_begin|>", "<|media_pad|>", "<|media_end|>", "[PAD]", "<|im_user|>",
                    "<|im_middle|>", "<|im_end|>"],
                   tok.convert_tokens_to_ids(["<|media_begin|>", "<|media_pad|>",
                                              "<|media_end|>", "[PAD]", "<|im_user|>",
                                              "<|im_middle|>", "<|im_end|>"]), strict=True))
    patches = VisionPatches(np.zeros((24, 3 * 14 * 14), np.uint8), np.array([1, 4, 6]))
    assert kimi.placeholder(sp, patches, 2, video=False).tolist() == \
        [ids["<|media_begin|>"]] + [ids["<|media_pad|>"]] * 6 + [ids["<|media_end|>"]]
    assert sp.pad == ids["[PAD]"] and kimi.vision_token_ids(sp) == (ids["<|media_pad|>"],)
    encode = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    opening, closing = kimi.chat_turn(sp, "user", encode)
    assert opening == [ids["<|im_user|>"], *encode("user"), ids["<|im_middle|>"]]
    assert closing == [ids["<|im_end|>"]]
    with pytest.raises(ConfigError, match="lacks Kimi's special tokens"):
        kimi.special_tokens(load_tokenizer(get_family("qwen3_5").tokenizer_dir()))
    muse, qsp = get_family("muse_glimmer"), special()
    video = VisionPatches(np.zeros((48, 3 * 2 * 14 * 14), np.uint8), np.array([2, 4, 6]))
    run = [qsp.vision_start] + [qsp.video_pad] * 6 + [qsp.vision_end]
    assert muse.placeholder(qsp, video, 2, video=True).tolist() == run * 2
    assert muse.preset["patch_order"] == "raster" and muse.tokenizer_dir() == tokenizer_dir()
