"""`Transform.release`: the driver lets go of what an operator can load again once its
stage runs remotely (issue 22, item 6). The plan calls it on any transform, never
knowing the operator's type; a tokenizer is only one such thing."""

from __future__ import annotations

from typing import Any

import pytest

from zephon_core import Execution, Pack
from zephon_core.engine.plan import Plan
from zephon_core.engine.runner_base import Runner
from zephon_core.ops.contract import Transform
from zephon_core.ops.shuffle import Shuffle
from zephon_core.records import Element


class HoldsAModel(Transform):
    """Not a tokenizer: holds something heavy it reloads in `setup`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.model: Any = None
        self.releases = 0

    def setup(self) -> None:
        if self.model is None:
            self.model = object()

    def release(self) -> None:
        self.model = None
        self.releases += 1

    def process_many(self, elements: list[Element]) -> list[Any]:
        self.setup()
        return [e.payload for e in elements]


def _released(execution: Execution, forked: bool = False) -> dict[str, int]:
    ops = [HoldsAModel("a"), HoldsAModel("b")]
    for op in ops:
        op.setup()
    plan = Plan([*ops, Shuffle(4), Pack(16)], execution)
    runners = {s.index: Runner() for s in plan.stages}
    for r in runners.values():
        r.forked = forked
    plan.release_remote_operators(runners)
    return {op.name: op.releases for op in ops}


@pytest.mark.parametrize("runner", ["processes", "ray"])
def test_operators_of_remote_stages_are_released_in_the_driver(runner):
    assert _released(Execution(runner=runner, default_workers=2)) == {"a": 1, "b": 1}


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_operators_that_run_in_the_driver_keep_what_they_hold(runner):
    assert _released(Execution(runner=runner)) == {"a": 0, "b": 0}


def test_only_the_operators_whose_stage_runs_remotely_are_released():
    ex = Execution(runners={"a": "processes", "b": "threads"}, default_workers=2)
    assert _released(ex) == {"a": 1, "b": 0}



def test_operators_of_forked_workers_stay_loaded_in_the_driver():
    """Forked workers share the driver's copy: releasing it frees nothing and costs time."""
    ex = Execution(runner="processes", default_workers=2)
    assert _released(ex, forked=True) == {"a": 0, "b": 0}
