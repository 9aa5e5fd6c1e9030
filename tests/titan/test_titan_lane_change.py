"""TorchTitan's dataloader resumes a checkpoint of another lane count only when asked."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

from zephon_core import CheckpointError, Execution, Loader, batch_digest  # noqa: E402
from zephon_core.recipes.text import text_demo  # noqa: E402
from zephon_vl.titan.dataloader import ZephonDataLoader  # noqa: E402


def build(cfg, local_batch_size=8):
    return cfg.build(dp_world_size=1, dp_rank=0, tokenizer=object(), seq_len=512,
                     local_batch_size=local_batch_size, snapshot_every_n_steps=None)


def test_allow_lane_change_resumes_with_the_core_loaders_batches():
    cfg = ZephonDataLoader.Config(runner="inline", recipe="text-demo", num_lanes=4,
                                  global_batch_size=8)
    a = build(cfg)
    it = iter(a)
    for _ in range(3):
        next(it)
    state = a.state_dict()
    a.close()
    refused = build(dataclasses.replace(cfg, num_lanes=8))
    with pytest.raises(CheckpointError, match="num_lanes"):
        refused.load_state_dict(state)
    refused.close()
    b = build(dataclasses.replace(cfg, num_lanes=8, allow_lane_change=True))
    b.load_state_dict(state)
    got = [batch_digest({"x": next(iter(b))[0]["input"]}) for _ in range(3)]
    b.close()
    core_state = json.loads(state["zephon_state"])["zephon"]
    with Loader(text_demo(num_lanes=8, global_batch_size=8), 0, 1,
                Execution(runner="inline")) as ld:
        ld.load_state_dict(core_state, allow_lane_change=True)
        full = [batch_digest({"x": ld.recipe.collate(ld.next_rows())["input"]})
                for _ in range(3)]
    assert got == full
