"""The users' formats through TorchTitan's dataloader config, as a TorchTitan user runs
them: a recipe file naming each dataset's ``format``, read with no conversion step, gives
the same global batches at every D and across a resume on another D (issue 21)."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

from tests.helpers.formats import format_datasets, recipe_toml  # noqa: E402
from zephon_core import batch_digest  # noqa: E402
from zephon_vl.titan.check import load_titan_config  # noqa: E402
from zephon_vl.titan.dataloader import (  # noqa: E402
    ZephonDataLoader,
    merged_state,
    next_global_step,
    step_rows,
)

G, L, SEQ = 8, 4, 1024


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> ZephonDataLoader.Config:
    root = tmp_path_factory.mktemp("formats")
    made = format_datasets(root)
    recipe = recipe_toml(root / "mine.toml", [made[n][0] for n in ("llava", "parquet", "obelics")],
                         global_batch_size=G, num_lanes=L)
    base = load_titan_config("zephon_qwen35_debug").dataloader
    return dataclasses.replace(base, recipe=str(recipe), num_lanes=L, global_batch_size=G,
                               runner="inline", background=False)


def ranks(config, dp: int) -> list[ZephonDataLoader]:
    return [config.build(dp_world_size=dp, dp_rank=d, tokenizer=None, seq_len=SEQ,
                         local_batch_size=G // dp // 2, snapshot_every_n_steps=None)
            for d in range(dp)]


def global_steps(loaders: list[ZephonDataLoader], steps: int) -> list[str]:
    """Each step's global batch digest: every rank's micro-batches in rank order."""
    its = [iter(dl) for dl in loaders]
    return [batch_digest(step_rows(next_global_step(loaders, its))) for _ in range(steps)]


def closed(loaders: list[ZephonDataLoader]) -> None:
    for dl in loaders:
        dl.close()


def test_formats_give_the_same_batches_at_every_d_and_across_a_resume(config) -> None:
    runs = {}
    for dp in (1, 2, 4):
        loaders = ranks(config, dp)
        try:
            runs[dp] = global_steps(loaders, 4)
        finally:
            closed(loaders)
    assert runs[1] == runs[2] == runs[4]
    saved = ranks(config, 2)
    try:
        assert global_steps(saved, 2) == runs[1][:2]
        state = merged_state(saved)
    finally:
        closed(saved)
    for dp in (1, 4):
        resumed = ranks(config, dp)
        try:
            for dl in resumed:
                dl.load_state_dict(state)
            assert global_steps(resumed, 2) == runs[1][2:], f"resumed at D={dp}"
        finally:
            closed(resumed)
