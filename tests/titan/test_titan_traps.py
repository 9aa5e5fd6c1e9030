"""Trainer-level traps, each refused or handled when the dataloader is built (issue 11, item 6).

Batch sizes that disagree with the trainer's, TorchTitan's dataset flags, a
default global batch that would change with D, presets and formats that do
not fit the recipe, a trainer tokenizer that is not the recipe's, and a lane
that drops every sample.
"""

from __future__ import annotations

import json
import types

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

import transformers  # noqa: E402,F401  (before the torchvision stub; see zephon_vl.testing.titan_cpu)

from zephon_core import ConfigError, NoRowsError, qwen_tokenizer_dir  # noqa: E402
from zephon_vl.testing.titan_cpu import stub_torchvision  # noqa: E402
from zephon_vl.titan.dataloader import ZephonDataLoader  # noqa: E402

stub_torchvision()
from torchtitan.config import ConfigManager  # noqa: E402

QWEN_VOCAB_SIZE = 248077  # the bundled Qwen tokenizer's vocabulary, added tokens included


def build(cfg, *, dp_world_size=1, dp_rank=0, seq_len=64, local_batch_size=2, tokenizer=None):
    return cfg.build(dp_world_size=dp_world_size, dp_rank=dp_rank, tokenizer=tokenizer,
                     seq_len=seq_len, local_batch_size=local_batch_size,
                     snapshot_every_n_steps=None)


def text(**kw) -> ZephonDataLoader.Config:
    return ZephonDataLoader.Config(runner="inline", recipe="text-demo", num_lanes=4, **kw)


# --- (2) batch sizes ------------------------------------------------------------------
@pytest.mark.parametrize("trainer, dp, match", [
    (16, 1, r"takes 16 rows \(training.global_batch_size=16\) but dataloader.global_batch_size "
            r"is 8; each trainer step would take 2 zephon steps"),
    (4, 1, r"takes 4 rows .* would not end on zephon step boundaries"),
    (-1, 2, r"local_batch_size x D = 2 x 2 = 4\) but dataloader.global_batch_size is 8"),
])
def test_trainer_batch_size_mismatch_is_refused_at_build(trainer, dp, match):
    with pytest.raises(ConfigError, match=match) as err:
        build(text(global_batch_size=8, trainer_global_batch_size=trainer), dp_world_size=dp)
    assert "--training.global_batch_size 8" in str(err.value)


def test_matching_trainer_batch_size_builds():
    dl = build(text(global_batch_size=8, trainer_global_batch_size=8), dp_world_size=2)
    assert dl.microbatches == 2
    dl.close()
    dl = build(text(global_batch_size=4, trainer_global_batch_size=-1), dp_world_size=2)
    dl.close()


def test_ready_config_links_the_trainers_batch_size_through_the_command_line():
    """The stock ConfigManager path: a --training.global_batch_size override reaches zephon."""
    args = ["--module", "zephon_vl.titan", "--config", "zephon_llama3_debug"]
    cfg = ConfigManager().parse_args(args + ["--training.global_batch_size", "16"])
    assert cfg.dataloader.trainer_global_batch_size == 16
    with pytest.raises(ConfigError, match="takes 16 rows"):
        build(cfg.dataloader, seq_len=cfg.training.seq_len,
              local_batch_size=cfg.training.local_batch_size, dp_world_size=2)
    ok = ConfigManager().parse_args(args)
    assert ok.dataloader.trainer_global_batch_size == ok.dataloader.global_batch_size == 8


# --- (3) a lane that drops everything ------------------------------------------------------
def test_seq_len_smaller_than_every_sample_stops_with_the_reason(tmp_path):
    docs = tmp_path / "long.jsonl"
    docs.write_text("".join(json.dumps({"text": f"document {i}: " + "many words " * 40}) + "\n"
                            for i in range(30)))
    recipe = tmp_path / "long.toml"
    recipe.write_text('kind = "text"\noverlong = "drop"\n[[datasets]]\nname = "long"\n'
                      'files = ["long.jsonl"]\n')
    cfg = ZephonDataLoader.Config(runner="inline", recipe=str(recipe), num_lanes=2,
                                  global_batch_size=2, stall_drops=40)
    dl = build(cfg, seq_len=16)
    with pytest.raises(NoRowsError, match=r"40 over_length.*seq_len 16 is smaller"):
        next(iter(dl))
    dl.close()


# --- (4) TorchTitan's dataset flags --------------------------------------------------------
@pytest.mark.parametrize("field", ["dataset", "dataset_path"])
def test_torchtitan_dataset_flags_are_refused(field):
    with pytest.raises(ConfigError, match=rf"--dataloader.{field} 'c4'.*--dataloader.recipe"):
        build(text(global_batch_size=8, **{field: "c4"}))


# --- (5) the default global batch does not depend on D ---------------------------------------
def test_default_global_batch_is_the_recipes_and_resumes_on_another_dp():
    a = build(text(), dp_world_size=1, local_batch_size=4)
    b = build(text(), dp_world_size=2, local_batch_size=4)
    assert a.recipe.global_batch_size == b.recipe.global_batch_size == 16
    it = iter(a)
    for _ in range(a.microbatches):
        next(it)
    b.load_state_dict(a.state_dict())  # refused when G was local x D (4 vs 8)
    assert b.step == 1
    a.close()
    b.close()


# --- (6) presets, formats and tokenizers that do not fit the recipe ----------------------------
def test_image_preset_on_a_text_recipe_is_a_clear_error():
    with pytest.raises(ConfigError, match="image_preset='qwen3_5'.*takes no images"):
        build(text(global_batch_size=8, image_preset="qwen3_5"))
    with pytest.raises(ConfigError, match="image_preset='qwen3_5' on recipe 'text-demo'"):
        build(text(global_batch_size=8, image_preset="qwen3_5", model_format="qwen3_5"))


def test_text_format_on_a_vlm_recipe_is_refused():
    cfg = ZephonDataLoader.Config(runner="inline", recipe="vlm-demo", num_lanes=2,
                                  global_batch_size=4, model_format="text")
    with pytest.raises(ConfigError, match="VLM recipe.*model_format='qwen3_5'"):
        build(cfg, seq_len=256)


def titan_tokenizer():
    from torchtitan.components.tokenizer import MultiModalTokenizer
    from torchtitan.models.qwen3_5 import QWEN3_5_SPECIAL_TOKENS

    return MultiModalTokenizer.Config(**QWEN3_5_SPECIAL_TOKENS).build(
        tokenizer_path=str(qwen_tokenizer_dir()))


def vlm(**kw) -> ZephonDataLoader.Config:
    return ZephonDataLoader.Config(runner="inline", recipe="vlm-demo", num_lanes=2,
                                   global_batch_size=4, model_format="qwen3_5",
                                   image_preset="qwen3_5", **kw)


def test_the_trainers_own_tokenizer_is_accepted():
    tok = titan_tokenizer()
    build(vlm(), seq_len=256, tokenizer=tok).close()
    build(text(global_batch_size=8), tokenizer=tok).close()


@pytest.mark.parametrize("recipe, change, match", [
    ("text", {"get_vocab_size": lambda: 2048}, rf"vocabulary size 2048 != {QWEN_VOCAB_SIZE}"),
    ("text", {"eos_id": 0}, r"eos_id 0 != 248044"),
    ("vlm", {"image_id": 7, "vision_end_id": 1},
     r"image_id 7 != 248056, vision_end_id 1 != 248054"),
])
def test_a_different_trainer_tokenizer_is_refused(recipe, change, match):
    real = titan_tokenizer()
    fields = {name: getattr(real, name) for name in
              ("eos_id", "image_id", "video_id", "vision_start_id", "vision_end_id")}
    fake = types.SimpleNamespace(**{"get_vocab_size": real.get_vocab_size, **fields, **change})
    with pytest.raises(ConfigError, match=rf"trainer's tokenizer differs.*{match}.*hf_assets_path"):
        if recipe == "vlm":
            build(vlm(), seq_len=256, tokenizer=fake)
        build(text(global_batch_size=8), tokenizer=fake)


def test_workers_for_an_operator_the_recipe_lacks_are_refused():
    cfg = ZephonDataLoader.Config(runner="inline", recipe="text-demo", num_lanes=2,
                                  global_batch_size=2, workers="decod=2")
    with pytest.raises(ConfigError, match=r"\['decod'\], which this recipe does not run.*"
                       r"--dataloader.workers"):
        build(cfg)
