"""A lane concern is a hook (`zephon_core.extend.LaneHook`, docs/architecture.md "To add X,
touch Y"): one of the caller's own, given through `Loader(lane_hooks=...)` without touching
the lane, hears the lane's events in lane order, keeps its slice of the lane snapshot
across a resume at another D, and may hold draws back without changing a batch."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.core import DataSpec, Spec, World, run_digests
from zephon_core import CheckpointError
from zephon_core.engine.state_check import CHECKSUM_KEY, state_checksum
from zephon_core.extend import LaneHook, LaneView
from zephon_core.records import Origin

SPEC = Spec(datasets=(DataSpec((12, 7, 20), data_seed=1, bad_every=5), DataSpec((5, 9))),
            num_lanes=4, rows_per_lane=2, shuffle_pos="payloads", seq_len=32,
            on_error="drop")


class CountingHook(LaneHook):
    """Counts what its lane did: elements the combiner took, drops, rows made."""

    state_key = "counting"

    def __init__(self, lane: int) -> None:
        self.lane = lane
        self.counts = {"took": 0, "drops": 0, "rows": 0}
        self.restored: dict | None = None

    def took(self, origin: Origin) -> None:
        self.counts["took"] += 1

    def dropped(self, origin: Origin, reason: str) -> None:
        self.counts["drops"] += 1

    def row(self, lane: LaneView, row: Any) -> None:
        assert lane.lane == self.lane
        self.counts["rows"] += 1

    def state(self) -> dict:
        return dict(self.counts)

    def check_state(self, state: Any) -> None:
        if not (isinstance(state, dict) and set(state) == set(self.counts)):
            raise ValueError(f"is not {{{', '.join(self.counts)}}}")
        bad = sorted(k for k, v in state.items() if not (type(v) is int and v >= 0))
        if bad:
            raise ValueError(f"has {bad[0]} = {state[bad[0]]!r}, not a count")

    def restore(self, state: Any) -> None:
        self.counts = {k: int(v) for k, v in state.items()}
        self.restored = dict(self.counts)


class RowsSeen(LaneHook):
    """A second hook with state, before the counting one: it must not restore from a state
    whose counting slice is refused."""

    state_key = "rows_seen"

    def __init__(self) -> None:
        self.rows = 0
        self.restored = False

    def row(self, lane: LaneView, row: Any) -> None:
        self.rows += 1

    def state(self) -> int:
        return self.rows

    def check_state(self, state: Any) -> None:
        if not (type(state) is int and state >= 0):
            raise ValueError(f"is {state!r}, not a count")

    def restore(self, state: Any) -> None:
        self.rows, self.restored = state, True


class Hooks:
    """The `lane_hooks` factory: a `CountingHook` per lane, kept to read back."""

    def __init__(self) -> None:
        self.by_lane: dict[int, CountingHook] = {}

    def __call__(self, lane: int) -> list[LaneHook]:
        self.by_lane[lane] = CountingHook(lane)
        return [self.by_lane[lane]]


class OneInFlight(LaneHook):
    """Lets a lane draw only while fewer than two of its elements are in its transforms."""

    def __init__(self) -> None:
        self.vetoes = 0

    def may_draw(self, lane: LaneView) -> bool:
        allowed = lane.transforming < 2
        self.vetoes += not allowed
        return allowed


@pytest.mark.parametrize("D", [1, 2])
def test_a_counting_hook_sees_the_lane_and_changes_no_batch(D: int) -> None:
    hooks = Hooks()
    with World(SPEC, D, lane_hooks=hooks) as w:
        assert w.digests(4) == run_digests(SPEC, D=1, steps=4)
        state = w.state()
    assert sorted(hooks.by_lane) == list(range(SPEC.num_lanes))
    for lane, snap in state["lanes"].items():
        counted = snap["counting"]
        assert counted["rows"] == snap["rows"] == 4 * SPEC.rows_per_lane
        assert counted["drops"] == sum(snap["dropped"].values())
        assert counted["took"] > 0
        assert hooks.by_lane[int(lane)].counts["rows"] >= counted["rows"]
    assert sum(snap["counting"]["drops"] for snap in state["lanes"].values()) > 0


def test_the_hook_slice_resumes_at_another_d() -> None:
    with World(SPEC, 2, lane_hooks=Hooks()) as w:
        w.digests(2)
        state = w.state()
        after = w.digests(3)
    hooks = Hooks()
    with World(SPEC, 4, state=state, lane_hooks=hooks) as w:
        assert w.digests(3) == after
        resumed = w.state()
    for lane, snap in state["lanes"].items():
        assert hooks.by_lane[int(lane)].restored == snap["counting"]
        assert resumed["lanes"][lane]["counting"]["rows"] == 5 * SPEC.rows_per_lane


def test_a_state_without_the_hook_slice_is_refused() -> None:
    with World(SPEC, 1) as w:
        w.digests(2)
        state = w.state()
    with pytest.raises(CheckpointError, match="counting"):
        World(SPEC, 1, state=state, lane_hooks=Hooks())


class TwoHooks:
    """`RowsSeen` then `CountingHook` in every lane."""

    def __init__(self) -> None:
        self.by_lane: dict[int, tuple[RowsSeen, CountingHook]] = {}

    def __call__(self, lane: int) -> list[LaneHook]:
        self.by_lane[lane] = (RowsSeen(), CountingHook(lane))
        return list(self.by_lane[lane])


def tampered(state: dict, lane: str, counting: Any) -> dict:
    """`state` with lane `lane`'s counting slice replaced and the checksum made again: what a
    hook that wrote a bad slice (or an edit that re-signed the file) leaves."""
    bad = {**state, "lanes": {**state["lanes"]}}
    bad["lanes"][lane] = {**state["lanes"][lane], "counting": counting}
    bad[CHECKSUM_KEY] = state_checksum(bad)
    return bad


@pytest.mark.parametrize("counting, what", [
    ({"took": -3, "drops": 0, "rows": 4}, "has took = -3, not a count"),
    ({"took": 5, "drops": 0}, "is not {took, drops, rows}"),
    ("5 rows", "is not {took, drops, rows}"),
])
def test_a_tampered_hook_slice_is_refused_naming_its_key_before_any_hook_restores(
        counting: Any, what: str) -> None:
    """Before hooks checked their slices, the first two restored (the hook went on from a
    negative count, or from a slice without its rows) and the third failed as "corrupt or
    truncated (AttributeError: 'str' object has no attribute 'items')", naming no hook, after
    the lane's other hooks had restored theirs."""
    with World(SPEC, 2, lane_hooks=TwoHooks()) as w:
        w.digests(2)
        state = w.state()
    assert World(SPEC, 1, state=state, lane_hooks=TwoHooks()).close() is None  # intact: fine
    hooks = TwoHooks()
    with pytest.raises(CheckpointError) as refused:
        World(SPEC, 1, state=tampered(state, "2", counting), lane_hooks=hooks)
    message = str(refused.value)
    assert message.startswith("lane 2: the checkpoint's 'counting' (the state of lane hook "
                              "CountingHook) "), message
    assert what in message
    rows_seen, counting_hook = hooks.by_lane[2]
    assert not rows_seen.restored and counting_hook.restored is None


def test_the_phase_gate_refuses_a_bad_slice_naming_its_field() -> None:
    from zephon_core.engine.phases import PhaseGate

    gate = PhaseGate.__new__(PhaseGate)
    gate.source = type("Source", (), {"orders": [0, 1]})()
    good = {"entries": [[0, 0, 0, 1, 3]], "tau": [[0, 1, 0, 2, 0, 0]], "start_draws": [0, 4],
            "acc_phase": {"1": 0}, "settled_tokens": [3, 0], "settled_samples": [1, 0]}
    gate.check_state(good)
    for field, value, named in [
            ("entries", [[0, 0, 0, 2, 3]], "'phase_gate'"),  # dataset 2 of 2
            ("settled_tokens", [3], "'phase_gate.settled_tokens'"),
            ("tau", [["x", 1, 0, 2, 0, 0]], "'phase_gate.tau'"),
            ("start_draws", [4, 0], "'phase_gate.start_draws'"),
            ("acc_phase", {"1": -1}, "'phase_gate.acc_phase'")]:
        with pytest.raises(ValueError, match=named):
            gate.check_state({**good, field: value})


def test_a_hook_that_holds_draws_back_changes_when_not_what() -> None:
    gates: list[OneInFlight] = []

    def one_in_flight(lane: int) -> list[LaneHook]:
        gates.append(OneInFlight())
        return [gates[-1]]

    with World(SPEC, 2, lane_hooks=one_in_flight) as w:
        assert w.digests(5) == run_digests(SPEC, D=1, steps=5)
    assert len(gates) == SPEC.num_lanes and all(g.vetoes > 0 for g in gates)
