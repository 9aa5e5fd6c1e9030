"""The stage observer: it sees every element at every stage, once, and changes no batch."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.helpers.core import DataSpec, Spec, World
from tests.helpers.ledger import lane_streams
from zephon_core import Execution, StageEvent, StageStats

FINITE = Spec(datasets=(DataSpec((25, 18, 30), max_len=50, data_seed=7, bad_every=11),),
              num_lanes=4, rows_per_lane=2, epochs=1, shuffle_pos="pointers", shuffle_buffer=5,
              seq_len=32, on_error="drop")


def all_digests(world: World) -> list[str]:
    out = []
    while (rows := world.step()) is not None:
        out.append(world.digest(rows))
    return out


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_observer_sees_each_element_once_per_stage_and_changes_nothing(runner):
    with World(FINITE, 1) as w:
        reference = all_digests(w)
    events: list[StageEvent] = []
    stats = StageStats()

    def observer(event: StageEvent) -> None:
        events.append(event)
        stats(event)

    ex = Execution(runner=runner, default_workers=2, group_size=3, fuse=False)
    with World(FINITE, 2, ex, observer=observer) as w:
        assert all_digests(w) == reference
        for loader in w.loaders:
            loader.drain()
        stages = w.loaders[0].plan.stages
        explained = w.loaders[0].explain(stats)
    assert len(stages) == 5  # shuffle, read, tokens, keep, pack
    everything = Counter((lane, o) for lane, s in lane_streams(FINITE).items() for o in s)
    totals = stats.totals()
    for s in stages:
        mine = [e for e in events if e.stage == s.index]
        assert {e.name for e in mine} == {s.name}
        want = s.runner_kind if s.kind == "transform" else "driver"
        assert {e.runner for e in mine} == {want}
        assert all(e.start <= e.end and e.elements == len(e.origins) > 0 for e in mine)
        seen = Counter((e.lane, o) for e in mine for o in e.origins)
        assert seen == everything, s.name  # dropped elements travel on as markers
        assert totals[s.index].elements == sum(everything.values())
        assert totals[s.index].groups == len(mine)
        if s.kind == "transform":
            assert max(e.elements for e in mine) <= ex.group_size
    assert explained.count("observed: ") == len(stages)


def test_observer_errors_stop_the_loader():
    def observer(event: StageEvent) -> None:
        if event.stage == 1:
            raise ValueError("observer bug")

    with World(FINITE, 1, observer=observer) as w:
        with pytest.raises(ValueError, match="observer bug"):
            w.step()
        with pytest.raises(RuntimeError, match="stopped on an error"):
            w.step()


def test_explain_without_stats_has_no_observations():
    with World(FINITE, 1) as w:
        loader = w.loaders[0]
        assert "observed" not in loader.explain()
        explained = loader.explain(StageStats())
        assert explained.count("observed: nothing yet") == len(loader.plan.stages)
