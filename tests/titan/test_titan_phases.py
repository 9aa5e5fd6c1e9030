"""A mixture schedule reaches TorchTitan's dataloader through a recipe file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

import transformers  # noqa: E402,F401  (before the torchvision stub; see zephon_vl.testing.titan_cpu)

from zephon_core import Phase, text_corpus  # noqa: E402
from zephon_vl.testing.titan_cpu import stub_torchvision  # noqa: E402
from zephon_vl.titan.dataloader import ZephonDataLoader  # noqa: E402

stub_torchvision()


def test_toml_phases_reach_the_torchtitan_recipe(tmp_path: Path) -> None:
    shards = [str(p) for p in text_corpus()]
    recipe = tmp_path / "phased.toml"
    recipe.write_text(
        f'kind = "text"\nmix_by = "tokens"\nphase_lag = 4\n'
        f'[[datasets]]\nname = "a"\nfiles = {json.dumps(shards[:2])}\n'
        f'[[datasets]]\nname = "b"\nfiles = {json.dumps(shards[3:])}\n'
        '[[phases]]\nstart_step = 2\nweights = { b = 1.0 }\n')
    cfg = ZephonDataLoader.Config(runner="inline", recipe=str(recipe), num_lanes=2,
                                  global_batch_size=2)
    dl = cfg.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=64, local_batch_size=2,
                   snapshot_every_n_steps=None)
    try:
        assert dl.recipe.phases == [Phase(2, {"b": 1.0})] and dl.recipe.mix_by == "tokens"
        it = iter(dl)
        for _ in range(3):
            next(it)
        assert dl.state_dict()  # a phased state is written and checked like any other
    finally:
        dl.close()
