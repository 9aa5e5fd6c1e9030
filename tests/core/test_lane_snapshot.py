"""A lane snapshot has one schema (`LaneSnapshot`): its JSON round-trips, the combiner's key
is written once, and states written with the old key ("packer") restore the same batches."""

from __future__ import annotations

import json

import pytest

from tests.helpers.core import DataSpec, Spec, World
from zephon_core import BalancedPack, CheckpointError, Pack
from zephon_core.engine.checkpoint import migrate_state
from zephon_core.engine.snapshot import COMBINER
from zephon_core.engine.state_check import CHECKSUM_KEY, state_checksum
from zephon_core.internals import LaneSnapshot, combiner_state
from zephon_core.records import Origin

SPEC = Spec(datasets=(DataSpec((12, 7, 20), data_seed=1), DataSpec((5, 9), weight=0.5)),
            num_lanes=4, rows_per_lane=2, shuffle_pos="payloads", seq_len=32)


@pytest.fixture(scope="module")
def saved() -> tuple[dict, list[str]]:
    """A global state at step 2 and the digests of steps 2..4 that follow it."""
    with World(SPEC, 2) as w:
        w.digests(2)
        state = w.state()
        return state, w.digests(3)


#: the combiner's key in the states 0.1 to 0.3 wrote (checkpoint version 2)
OLD_COMBINER = "packer"


def _rekeyed(state: dict, fn, version: int | None = None) -> dict:
    copy = json.loads(json.dumps(state))
    for snap in copy["lanes"].values():
        fn(snap)
    if version is not None:
        copy["version"] = version
    copy[CHECKSUM_KEY] = state_checksum(copy)
    return copy


def test_snapshot_json_round_trips(saved) -> None:
    state, _ = saved
    for snap in state["lanes"].values():
        assert COMBINER in snap and OLD_COMBINER not in snap
        assert LaneSnapshot.from_json(snap).to_json() == snap


def test_old_combiner_key_restores_the_same_batches(saved) -> None:
    """A version-2 state (0.1 to 0.3) holds the combiner under "packer"; the one migration
    table renames it (`checkpoint.MIGRATIONS`), so no other code reads the old key."""
    state, after = saved
    old = _rekeyed(state, lambda s: s.__setitem__(OLD_COMBINER, s.pop(COMBINER)), version=2)
    migrated = migrate_state(old)
    for lane, snap in migrated["lanes"].items():
        assert OLD_COMBINER not in snap
        assert combiner_state(snap) == old["lanes"][lane][OLD_COMBINER]
    with World(SPEC, 1, state=old) as w:
        assert w.digests(3) == after


def test_the_old_combiner_key_is_refused_in_a_current_state(saved) -> None:
    state, _ = saved
    current = _rekeyed(state, lambda s: s.__setitem__(OLD_COMBINER, s.pop(COMBINER)))
    with pytest.raises(CheckpointError, match="'combiner' is missing"):
        World(SPEC, 1, state=current)


def test_both_combiner_keys_are_refused(saved) -> None:
    state, _ = saved
    both = _rekeyed(state, lambda s: s.__setitem__(OLD_COMBINER, s[COMBINER]), version=2)
    with pytest.raises(CheckpointError, match="'packer' .* is set beside 'combiner'"):
        World(SPEC, 1, state=both)


def test_a_damaged_version_2_state_is_still_refused_by_its_checksum(saved) -> None:
    state, _ = saved
    old = _rekeyed(state, lambda s: s.__setitem__(OLD_COMBINER, s.pop(COMBINER)), version=2)
    old["lanes"]["0"]["dropped"] = {"edited": 1}  # after the checksum was made
    with pytest.raises(CheckpointError, match="does not match its SHA-256"):
        World(SPEC, 1, state=old)


def test_no_combiner_key_is_refused(saved) -> None:
    state, _ = saved
    none = _rekeyed(state, lambda s: s.pop(COMBINER))
    with pytest.raises(CheckpointError, match="'combiner' is missing"):
        World(SPEC, 1, state=none)


def _doc(i: int, n: int, costly: int = 0) -> dict:
    return {"tokens": list(range(i, i + n)), "costs": {"image": costly} if costly else {}}


@pytest.mark.parametrize("op", [Pack(16, {"max_open_bins": 2}),
                                BalancedPack(16, cost="image", balance={"budget": 2},
                                             rows_per_group=1)],
                         ids=["pack", "balanced"])
def test_combiner_segments_restore_from_their_codec(op) -> None:
    docs = {i: _doc(i, 3 + i % 11, costly=i % 3 == 0) for i in range(12)}
    first = op.make(0, 0)
    for i, payload in docs.items():
        first.push(Origin(i, 0, 0, i, 0), payload)
    assert first.held_origins()
    saved = json.loads(json.dumps(first.state()))
    second = op.make(0, 0)
    second.restore(saved, lambda origins: [docs[o.seq] for o in origins])
    assert second.state() == saved
    assert second.held_origins() == first.held_origins()
    first.flush()
    second.flush()
    rows = [[(s.origin, s.start, s.end) for s in r.segments]
            for r in iter(first.pop_row, None)]
    assert rows and rows == [[(s.origin, s.start, s.end) for s in r.segments]
                             for r in iter(second.pop_row, None)]
