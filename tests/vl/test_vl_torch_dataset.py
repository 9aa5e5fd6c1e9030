"""`Loader.as_torch_dataset()` on the VLM pipeline: pixel batches under torchdata's
StatefulDataLoader, saved through its ``state_dict()`` on D=2 and resumed on D=4 with the
reference's global batches."""

from __future__ import annotations

import json

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.helpers.vl import LEAN, SCALAR_KEYS, STEPS, TENSOR_KEYS, reference
from zephon_core import Loader, batch_digest, merge_states


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference(tmp_path_factory)


def global_digest(local: list[dict[str, torch.Tensor]]) -> str:
    return batch_digest({**{k: torch.cat([b[k] for b in local]) for k in TENSOR_KEYS},
                         **{k: local[0][k] for k in SCALAR_KEYS}})


def ranks(recipe, D: int) -> tuple[list[Loader], list[StatefulDataLoader]]:
    loaders = [Loader(recipe, d, D, LEAN) for d in range(D)]
    return loaders, [StatefulDataLoader(ld.as_torch_dataset(), batch_size=None)
                     for ld in loaders]


def test_stateful_dataloader_saves_on_2_and_resumes_on_4(ref) -> None:
    k = 1
    loaders, dls = ranks(ref.recipe, 2)
    try:
        iters = [iter(dl) for dl in dls]
        assert [global_digest([next(it) for it in iters]) for _ in range(k)] == ref.digests[:k]
        states = [json.loads(json.dumps(dl.state_dict())) for dl in dls]
    finally:
        for loader in loaders:
            loader.close()
    # simulated ranks: merge their local states, as a real run's gather does
    merged = merge_states([json.loads(s["dataset_state"]["zephon_state"]) for s in states])
    state = {**states[0], "dataset_state": {"zephon_state": json.dumps(merged)}}
    loaders, dls = ranks(ref.recipe, 4)
    try:
        for dl in dls:
            dl.load_state_dict(state)
        iters = [iter(dl) for dl in dls]
        got = [global_digest([next(it) for it in iters]) for _ in range(k, STEPS)]
    finally:
        for loader in loaders:
            loader.close()
    assert got == ref.digests[k:]
