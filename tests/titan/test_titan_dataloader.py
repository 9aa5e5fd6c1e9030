"""ZephonDataLoader built the way TorchTitan's trainer builds it; refusals; the qwen3_5 batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

from torchtitan.components.dataloader import BaseDataLoader  # noqa: E402

from zephon_core import CheckpointError, ConfigError, RetryPolicy, batch_digest
from zephon_core.internals import parse_workers
from zephon_vl.titan.dataloader import (  # noqa: E402
    ZephonDataLoader,
    next_global_step,
    step_rows,
)

# exactly the keyword arguments Trainer.__init__ passes to config.dataloader.build(...)
TRAINER_KW = ("dp_world_size", "dp_rank", "tokenizer", "seq_len", "local_batch_size",
              "snapshot_every_n_steps")


def build(cfg, *, dp_world_size=1, dp_rank=0, seq_len=64, local_batch_size=2):
    return cfg.build(dp_world_size=dp_world_size, dp_rank=dp_rank, tokenizer=object(),
                     seq_len=seq_len, local_batch_size=local_batch_size,
                     snapshot_every_n_steps=None)


def test_config_is_a_torchtitan_dataloader_config():
    assert issubclass(ZephonDataLoader, BaseDataLoader)
    assert issubclass(ZephonDataLoader.Config, BaseDataLoader.Config)
    names = {f.name for f in dataclasses.fields(ZephonDataLoader.Config)}
    assert not names & set(TRAINER_KW), "build() refuses Config fields named like runtime kwargs"
    assert "infinite" in names  # TorchTitan's validator replaces it
    dataclasses.replace(ZephonDataLoader.Config(runner="inline"), infinite=False)


def test_builds_with_trainer_kwargs_and_yields_batches():
    cfg = ZephonDataLoader.Config(runner="inline", recipe="text-demo", num_lanes=4,
                                  global_batch_size=8)
    dl = build(cfg, dp_world_size=2, dp_rank=1, local_batch_size=2)
    assert dl.microbatches == 2  # 8 rows / 2 ranks / 2 rows per micro-batch
    it = iter(dl)
    for _ in range(4):
        x, labels = next(it)
        assert set(x) == {"input", "positions"}
        assert x["input"].shape == x["positions"].shape == labels.shape == (2, 64)
        assert x["input"].dtype == labels.dtype == torch.int64
        assert (labels == -100).any() and (labels != -100).any()
        # positions restart at 0 at every document; within one they count up by 1
        pos = x["positions"]
        steps = pos[:, 1:] - pos[:, :-1]
        assert bool(((steps == 1) | (pos[:, 1:] == 0)).all())
    assert dl.step == 2
    dl.close()


def test_storage_settings_reach_execution_and_change_no_batch():
    base = ZephonDataLoader.Config(runner="inline", recipe="text-demo", num_lanes=4,
                                   global_batch_size=4)
    tuned = dataclasses.replace(base, retry_deadline=7.5, coalesce_max_bytes=0)
    got = {}
    for name, cfg in (("base", base), ("tuned", tuned)):
        dl = build(cfg, local_batch_size=4)
        got[name] = [batch_digest(next(dl.loader)) for _ in range(2)]
        got[name + "_ex"] = dl.execution
        dl.close()
    assert got["tuned_ex"].retry.deadline == 7.5 and got["tuned_ex"].coalesce.max_bytes == 0
    assert got["base_ex"].retry == RetryPolicy()  # the defaults are Execution's
    assert got["base"] == got["tuned"]


def test_registry_configs_build():
    from zephon_vl.titan import config_registry

    cfg = config_registry.zephon_llama3_debug()
    assert cfg.model_spec.model.vocab_size == config_registry.QWEN_VOCAB
    dl = build(cfg.dataloader, seq_len=cfg.training.seq_len,
               local_batch_size=cfg.training.local_batch_size, dp_world_size=4, dp_rank=3)
    x, labels = next(iter(dl))
    assert x["input"].shape == (cfg.training.local_batch_size, cfg.training.seq_len)
    assert int(x["input"].max()) < config_registry.QWEN_VOCAB
    dl.close()


def test_global_batch_is_the_same_for_every_dp():
    def global_digests(dp, steps=3):
        loaders = [build(ZephonDataLoader.Config(runner="inline", recipe="text-demo", num_lanes=4,
                                                 global_batch_size=8),
                         dp_world_size=dp, dp_rank=d, local_batch_size=8 // (dp * 2))
                   for d in range(dp)]
        its = [iter(dl) for dl in loaders]
        out = [batch_digest(step_rows(next_global_step(loaders, its))) for _ in range(steps)]
        for dl in loaders:
            dl.close()
        return out

    assert global_digests(1) == global_digests(2) == global_digests(4)


@pytest.mark.parametrize("kw, build_kw, match", [
    ({"num_lanes": 4}, {"dp_world_size": 3}, r"3 data-parallel ranks cannot share num_lanes=4"),
    ({"num_lanes": 4, "global_batch_size": 8}, {"dp_world_size": 2, "local_batch_size": 3},
     r"not divisible by local_batch_size x dp_world_size = 3 x 2"),
    ({"num_lanes": 4, "global_batch_size": 6}, {"local_batch_size": 2},
     r"global_batch_size=6 is not a multiple of num_lanes=4"),
    ({"num_lanes": 4, "model_format": "qwen3_5"}, {"local_batch_size": 4},
     r"needs a VLM recipe"),
    ({"num_lanes": 4, "model_format": "llava"}, {"local_batch_size": 4}, r"model_format"),
    ({"num_lanes": 4, "workers": "decode:2"}, {"local_batch_size": 4}, r"OP=N"),
    ({"num_lanes": 4, "recipe": "no-such-recipe"}, {"local_batch_size": 4}, r"unknown recipe"),
])
def test_wrong_combinations_are_refused(kw, build_kw, match):
    with pytest.raises(ConfigError, match=match):
        build(ZephonDataLoader.Config(runner="inline", **kw), **build_kw)


def test_parse_workers():
    assert parse_workers("decode=2, tokenize=1") == {"decode": 2, "tokenize": 1}
    assert parse_workers("") == {}
    assert parse_workers("auto") == "auto"


def test_workers_auto_sizes_the_process_stages():
    cfg = ZephonDataLoader.Config(runner="processes", recipe="text-demo", num_lanes=4,
                                  global_batch_size=4, workers="auto", default_workers=2)
    dl = build(cfg, local_batch_size=4)
    try:
        assert dl.execution.auto_workers and dl.loader.sizer is not None
        inputs, _ = next(iter(dl))
        assert inputs["input"].shape[0] == 4
    finally:
        dl.close()


def test_state_refused_mid_step_and_without_distributed():
    cfg = ZephonDataLoader.Config(runner="inline", num_lanes=4, global_batch_size=8)
    dl = build(cfg, local_batch_size=4)
    it = iter(dl)
    next(it)
    with pytest.raises(CheckpointError, match="micro-batches of the step not consumed"):
        dl.state_dict()
    next(it)
    state = dl.state_dict()
    assert set(state) == {"zephon_state"} and isinstance(state["zephon_state"], str)
    dl.close()
    dl2 = build(cfg, dp_world_size=2, local_batch_size=4)
    with pytest.raises(CheckpointError, match="cannot be gathered"):
        dl2.state_dict()
    dl2.close()


def test_state_round_trip_in_process():
    cfg = ZephonDataLoader.Config(runner="inline", num_lanes=4, global_batch_size=4)
    a = build(cfg, local_batch_size=4)
    it = iter(a)
    next(it)
    state = a.state_dict()
    want = batch_digest({"x": next(it)[0]["input"]})
    b = build(cfg, local_batch_size=4)
    b.load_state_dict(state)
    assert batch_digest({"x": next(iter(b))[0]["input"]}) == want
    other = build(dataclasses.replace(cfg, seed=1), local_batch_size=4)
    with pytest.raises(CheckpointError, match="seed"):
        other.load_state_dict(state)
    for dl in (a, b, other):
        dl.close()


def test_vision_patches_reach_the_metrics():
    """``zephon/vision_patches_per_s``: the encoder's input rows the trainer received, the
    patch rows of the converted micro-batches (counted again here from their grids)."""
    from zephon_vl.titan.metrics import titan_scalars

    cfg = ZephonDataLoader.Config(runner="inline", recipe="vlm-demo", num_lanes=2,
                                  global_batch_size=2, model_format="qwen3_5",
                                  image_preset="qwen3_5", max_pixels=200_000)
    dl = build(cfg, seq_len=1024, local_batch_size=1)

    def patches_of(micro: int) -> int:
        seen = 0
        for _ in range(micro):
            x, _ = next(it)
            for grid in ("grid_thw", "grid_thw_videos"):
                if x.get(grid) is not None:
                    seen += int(x[grid].prod(-1).sum())
        return seen

    try:
        it = iter(dl)
        seen = patches_of(4)
        assert seen > 0 and dl.take_vision_patches() == seen
        assert patches_of(2) > 0 and titan_scalars(dl)["zephon/vision_patches_per_s"] > 0
        assert dl.take_vision_patches() == 0
    finally:
        dl.close()
