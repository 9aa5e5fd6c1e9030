"""Item 2 of issue 12: the background loader collates in the driver or in a thread of its
own, optionally into pinned memory; none of it changes a batch, and a collate failure
stops the loader (the step it was making cannot be delivered)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.helpers.core import Spec, build_recipe, reference_digests
from zephon_core import Execution, Loader, batch_digest

SPEC = Spec(num_lanes=2, rows_per_lane=2)


class FailsOnThirdCall:
    """The recipe's collate, raising on its third call (a bad batch)."""

    def __init__(self, collate) -> None:
        self.collate = collate
        self.calls = 0

    def settings(self) -> dict:
        return self.collate.settings()

    def __call__(self, rows):
        self.calls += 1
        if self.calls == 3:
            raise ValueError("synthetic collate failure")
        return self.collate(rows)


@pytest.mark.parametrize("collate_in", ["driver", "thread"])
def test_collate_failure_reaches_the_consumer_and_stops_the_loader(collate_in):
    recipe = build_recipe(SPEC)
    recipe = dataclasses.replace(recipe, collate=FailsOnThirdCall(recipe.collate))
    ex = Execution(runner="inline", collate_in=collate_in)
    with Loader(recipe, execution=ex, background=True) as loader:
        it = iter(loader)
        assert [batch_digest(next(it)) for _ in range(2)] == reference_digests(SPEC, 2)
        with pytest.raises(ValueError, match="synthetic collate failure"):
            next(it)
        with pytest.raises(RuntimeError, match="stopped on an error"):
            next(it)


@pytest.mark.parametrize("background", [True, False])
def test_pin_memory_keeps_the_batches(background):
    """Pinned where CUDA is (written there by a collate that `pins`, else copied), pageable
    with a warning where it is not: the same bytes either way."""
    import torch

    ex = Execution(runner="inline", pin_memory=True, collate_in="thread")
    with Loader(build_recipe(SPEC), execution=ex, background=background) as loader:
        it = iter(loader)
        batches = [next(it) for _ in range(3)]
    assert [batch_digest(b) for b in batches] == reference_digests(SPEC, 3)
    pinned = {t.is_pinned() for b in batches for t in b.values()}
    assert pinned == {torch.cuda.is_available()}


def test_bad_collate_place_is_refused():
    from zephon_core import ConfigError

    with pytest.raises(ConfigError, match="collate_in"):
        Execution(collate_in="worker")
