"""`Loader.as_torch_dataset()`: a Loader under torch's DataLoader and torchdata's
StatefulDataLoader, checkpointed through the DataLoader's own ``state_dict()`` and resumed
on another rank count with the batches of the uninterrupted run (guarantees 4 and 6)."""

from __future__ import annotations

import json
from itertools import islice
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.helpers import core as helpers
from tests.helpers.core import DataSpec, Spec, reference_digests
from zephon_core import (
    CheckpointError,
    ConfigError,
    Execution,
    Loader,
    LoaderDataset,
    batch_digest,
    merge_states,
)

# state everywhere: a payload shuffle and open packer bins, two datasets
SPEC = Spec(datasets=(DataSpec((30, 17, 25), max_len=50, data_seed=1),
                      DataSpec((11, 9), max_len=20, data_seed=2, weight=0.5)),
            num_lanes=4, rows_per_lane=2, shuffle_pos="payloads", shuffle_buffer=6,
            seq_len=32, max_open_bins=5)
INLINE = Execution(runner="inline")
STEPS = 7


def global_digest(parts: list[dict[str, torch.Tensor]]) -> str:
    """The global batch of ranks' local batches (rank order, rows along dim 0)."""
    return batch_digest({name: torch.cat([p[name] for p in parts]) for name in parts[0]})


def stateful_loaders(D: int, state: dict | None = None,
                     **loader_args: Any) -> tuple[list[Loader], list[StatefulDataLoader]]:
    recipe = helpers.build_recipe(SPEC)
    loaders = [Loader(recipe, d, D, INLINE, **loader_args) for d in range(D)]
    dls = [StatefulDataLoader(ld.as_torch_dataset(), batch_size=None, num_workers=0)
           for ld in loaders]
    if state is not None:
        for dl in dls:
            dl.load_state_dict(state)
    return loaders, dls


def close(loaders: list[Loader]) -> None:
    for loader in loaders:
        loader.close()


def zephon_states(node: Any) -> list[str]:
    """Every ``zephon_state`` value inside a framework's state dict, wherever it put it."""
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k == "zephon_state"]
        return found + [s for k, v in node.items() if k != "zephon_state"
                        for s in zephon_states(v)]
    return []


def with_zephon_state(node: Any, text: str) -> Any:
    if isinstance(node, dict):
        return {k: text if k == "zephon_state" else with_zephon_state(v, text)
                for k, v in node.items()}
    return node


def merged_framework_state(states: list[dict]) -> dict:
    """Simulated ranks have no torch.distributed to gather over: each rank's DataLoader state
    holds its own lanes. Merge them (`merge_states`) into the state every real rank saves."""
    local = [json.loads(text) for s in states for text in zephon_states(s)]
    assert len(local) == len(states)
    return with_zephon_state(states[0], json.dumps(merge_states(local), sort_keys=True))


@pytest.mark.parametrize(("D", "D2"), [(1, 2), (2, 4), (4, 1)])
def test_stateful_dataloader_resumes_on_another_rank_count(D, D2):
    k = 3
    ref = reference_digests(SPEC, STEPS)
    loaders, dls = stateful_loaders(D)
    try:
        iters = [iter(dl) for dl in dls]
        assert [global_digest([next(it) for it in iters]) for _ in range(k)] == ref[:k]
        # the framework's own checkpoint call, through JSON (no pickle needed)
        states = [json.loads(json.dumps(dl.state_dict())) for dl in dls]
        # the uninterrupted run goes on unchanged after the save
        assert [global_digest([next(it) for it in iters]) for _ in range(STEPS - k)] == ref[k:]
    finally:
        close(loaders)
    state = merged_framework_state(states)
    assert json.loads(zephon_states(state)[0])["step"] == k
    loaders, dls = stateful_loaders(D2, state)
    try:
        iters = [iter(dl) for dl in dls]
        got = [global_digest([next(it) for it in iters]) for _ in range(STEPS - k)]
    finally:
        close(loaders)
    assert got == ref[k:]


def test_state_before_the_first_batch_restores_step_zero():
    ref = reference_digests(SPEC, 3)
    loaders, dls = stateful_loaders(1)
    try:
        state = json.loads(json.dumps(dls[0].state_dict()))
    finally:
        close(loaders)
    assert json.loads(zephon_states(state)[0])["step"] == 0
    loaders, dls = stateful_loaders(1, state)
    try:
        assert [global_digest([b]) for b in islice(dls[0], 3)] == ref
    finally:
        close(loaders)


@pytest.mark.parametrize("D", [1, 2])
def test_plain_dataloader_yields_the_loaders_local_batches(D):
    recipe = helpers.build_recipe(SPEC)
    direct = [Loader(recipe, d, D, INLINE) for d in range(D)]
    viewed = [Loader(recipe, d, D, INLINE) for d in range(D)]
    try:
        want = [[next(ld) for _ in range(4)] for ld in direct]
        iters = [iter(DataLoader(ld.as_torch_dataset(), batch_size=None, num_workers=0))
                 for ld in viewed]
        got = [[next(it) for _ in range(4)] for it in iters]
    finally:
        close(direct + viewed)
    for d in range(D):
        for w, g in zip(want[d], got[d], strict=True):
            assert w.keys() == g.keys()
            assert all(torch.equal(w[n], g[n]) for n in w)
    assert [global_digest([got[d][t] for d in range(D)]) for t in range(4)] \
        == reference_digests(SPEC, 4)


def test_a_new_epoch_of_the_dataloader_continues_the_stream():
    """A DataLoader's next ``iter()`` goes on from the last step; it does not restart."""
    ref = reference_digests(SPEC, 4)
    with Loader(helpers.build_recipe(SPEC), 0, 1, INLINE) as loader:
        dl = DataLoader(loader.as_torch_dataset(), batch_size=None)
        first = [global_digest([b]) for b in islice(dl, 2)]
        second = [global_digest([b]) for b in islice(dl, 2)]
    assert first + second == ref


def test_microbatches_are_items_and_state_is_taken_at_step_boundaries():
    ref = reference_digests(SPEC, 3)
    loaders, dls = stateful_loaders(1, microbatches=2)
    try:
        it = iter(dls[0])
        step0 = [next(it), next(it)]
        assert all(b["input"].shape[0] == SPEC.global_batch_size // 2 for b in step0)
        assert global_digest(step0) == ref[0]
        half = next(it)
        with pytest.raises(CheckpointError, match="1 of 2 micro-batches of step 1"):
            dls[0].state_dict()
        assert global_digest([half, next(it)]) == ref[1]
        state = json.loads(json.dumps(dls[0].state_dict()))
    finally:
        close(loaders)
    loaders, dls = stateful_loaders(2, state, microbatches=2)
    try:
        iters = [iter(dl) for dl in dls]
        # rank order, each rank's two micro-batches in order: the global batch
        parts = [next(it) for it in iters for _ in range(2)]
        assert [b["input"].shape[0] for b in parts] == [SPEC.global_batch_size // 4] * 4
    finally:
        close(loaders)
    assert global_digest(parts) == ref[2]


@pytest.mark.parametrize("make", [
    lambda ds: DataLoader(ds, batch_size=None, num_workers=1),
    lambda ds: StatefulDataLoader(ds, batch_size=None, num_workers=1),
    lambda ds: DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn"),
], ids=["DataLoader", "StatefulDataLoader", "spawn"])
def test_worker_processes_are_refused_saying_why(make):
    with Loader(helpers.build_recipe(SPEC), 0, 1, INLINE) as loader:
        dl = make(loader.as_torch_dataset())
        with pytest.raises(ConfigError, match=r"num_workers > 0.*own processes") as err:
            next(iter(dl))
    assert "num_workers=0" in str(err.value)


@pytest.mark.parametrize("make", [
    lambda ds: DataLoader(ds),  # torch's default batch_size is 1
    lambda ds: DataLoader(ds, batch_size=4),
    lambda ds: StatefulDataLoader(ds, batch_size=2),
], ids=["default", "DataLoader-4", "StatefulDataLoader-2"])
def test_a_dataloader_batch_size_is_refused_saying_why(make):
    with Loader(helpers.build_recipe(SPEC), 0, 1, INLINE) as loader:
        with pytest.raises(ConfigError, match="batch_size=None.*already a collated"):
            next(iter(make(loader.as_torch_dataset())))


def test_a_plain_for_loop_over_the_dataset_works():
    with Loader(helpers.build_recipe(SPEC), 0, 1, INLINE) as loader:
        ds = loader.as_torch_dataset()
        assert isinstance(ds, torch.utils.data.IterableDataset)
        assert isinstance(ds, LoaderDataset)
        got = [global_digest([b]) for b in islice(ds, 2)]
    assert got == reference_digests(SPEC, 2)


def test_a_state_that_is_not_zephons_is_refused():
    with Loader(helpers.build_recipe(SPEC), 0, 1, INLINE) as loader:
        ds = loader.as_torch_dataset()
        with pytest.raises(CheckpointError, match="no 'zephon_state'.*found \\['epoch'\\]"):
            ds.load_state_dict({"epoch": 3})
        with pytest.raises(CheckpointError, match="not valid JSON"):
            ds.load_state_dict({"zephon_state": "{truncated"})
