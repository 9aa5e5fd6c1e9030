"""The combiner seam: a recipe may end with any `CombinerOp`, not only `Pack`.

`PairRows`, defined here, puts at most two whole documents in a row, in the
lane's order, and holds one document between rows, so its checkpointed state
is not empty. The engine runs it with no change: rows as the combiner makes
them, every element once, and elastic resume across rank counts.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from tests.helpers.core import DataSpec, Spec, World, build_recipe, reference_digests
from tests.helpers.ledger import Ledger, check_ledger, lane_streams, owners
from zephon_core import (
    CheckpointError,
    ConfigError,
    Dropped,
    Execution,
    Loader,
    Map,
    Origin,
    Pack,
    Recipe,
)
from zephon_core.engine.plan import Plan
from zephon_core.extend import Combiner, CombinerOp, Row, Segment
from zephon_core.internals import combiner_state
from zephon_core.ops.contract import Recompute


class PairRows(CombinerOp):
    """At most two whole documents per row; a document longer than a row is dropped."""

    def __init__(self, seq_len: int, pad_id: int = 0) -> None:
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.name = "pairs"

    def settings(self) -> dict:
        return {"seq_len": self.seq_len, "pad_id": self.pad_id}

    def make(self, lane: int, seed: int) -> Pairs:
        return Pairs(self.seq_len)


class Pairs(Combiner):
    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len
        self.held: Segment | None = None
        self.ready: deque[Row] = deque()

    def push(self, origin: Origin, payload: Any) -> Dropped | None:
        n = len(payload["tokens"])
        if n == 0:
            return Dropped("empty")
        if n > self.seq_len:
            return Dropped("over_length", f"{n} > {self.seq_len}")
        seg = Segment(origin, payload, 0, n)
        if self.held is None:
            self.held = seg
        elif self.held.length + n <= self.seq_len:
            self.ready.append(Row([self.held, seg]))
            self.held = None
        else:
            self.ready.append(Row([self.held]))
            self.held = seg
        return None

    def pop_row(self) -> Row | None:
        return self.ready.popleft() if self.ready else None

    def flush(self) -> None:
        if self.held is not None:
            self.ready.append(Row([self.held]))
            self.held = None

    def state(self) -> dict:
        def seg(s: Segment) -> list[int]:
            return [*s.origin, s.start, s.end]

        return {"held": None if self.held is None else seg(self.held),
                "ready": [[seg(s) for s in row.segments] for row in self.ready]}

    def held_origins(self) -> list[Origin]:
        segs = [s for row in self.ready for s in row.segments]
        return [s.origin for s in segs] + ([self.held.origin] if self.held else [])

    def restore(self, state: dict, recompute: Recompute) -> None:
        raw = [r for row in state["ready"] for r in row]
        if state["held"] is not None:
            raw.append(state["held"])
        origins = [Origin(*r[:5]) for r in raw]
        payloads = {o: p for o, p in zip(origins, recompute(origins), strict=True)}

        def seg(r: list[int]) -> Segment:
            return Segment(Origin(*r[:5]), payloads[Origin(*r[:5])], int(r[5]), int(r[6]))

        self.ready = deque(Row([seg(r) for r in row]) for row in state["ready"])
        self.held = None if state["held"] is None else seg(state["held"])


SPEC = Spec(datasets=(DataSpec((30, 17, 25), max_len=40, data_seed=4),
                      DataSpec((11, 9), max_len=20, data_seed=6, weight=0.5)),
            num_lanes=4, rows_per_lane=2, shuffle_pos="payloads", shuffle_buffer=6,
            seq_len=32, overlong="drop", combiner=PairRows(32))
FINITE = SPEC.but(epochs=1, combiner=PairRows(32, pad_id=5))


def test_rows_are_what_the_combiner_makes_and_every_element_is_there_once():
    streams = lane_streams(FINITE)
    owner = owners(streams)
    ledger = Ledger()
    pairs = 0
    with World(FINITE, 2, Execution(group_size=3)) as w:
        for loader in w.loaders:  # each rank to its own end of the data
            while (rows := loader.next_rows()) is not None:
                meta = loader.last_meta
                ledger.add_rows(meta.lanes, meta.rows, FINITE.rows_per_lane)
                ledger.add_drops(owner, meta.drops)
                batch = w.recipe.collate(rows)
                for i, row in enumerate(rows):
                    lengths = [len(s.payload["tokens"]) for s in row.segments]
                    assert 1 <= len(row.segments) <= 2
                    assert [(s.start, s.end) for s in row.segments] == [(0, n) for n in lengths]
                    assert sum(lengths) <= FINITE.seq_len
                    pairs += len(row.segments) == 2
                    # the default collate pads with the combiner's pad_id
                    assert (batch["input"][i, row.num_tokens:] == 5).all()
            ledger.add_drained(loader.drain(), owner)
    check_ledger(FINITE, streams, ledger)
    assert pairs > 0 and any(ledger.drops.values())


@pytest.mark.parametrize(("D", "D2", "k"), [(1, 4, 3), (2, 1, 5), (4, 2, 1)])
def test_resume_across_rank_counts(D, D2, k):
    steps = 8
    ref = reference_digests(SPEC, steps)
    with World(SPEC, D, Execution(runner="threads", default_workers=2, group_size=2)) as w:
        assert w.digests(k) == ref[:k]
        state = w.state()
    held = [combiner_state(lane)["held"] for lane in state["lanes"].values()]
    assert any(h is not None for h in held)  # the combiner's own state went through JSON
    with World(SPEC, D2, state=state) as w2:
        assert w2.digests(steps - k) == ref[k:]


def test_pack_checkpoint_refused_by_a_pair_recipe():
    """The combiner's type and settings are in the fingerprint."""
    with World(SPEC.but(combiner=None), 1) as w:
        w.digests(2)
        state = w.state()
    with World(SPEC, 1) as w2, pytest.raises(CheckpointError, match="operators"):
        w2.loaders[0].load_state_dict(state)


def test_a_pipeline_needs_one_combiner_at_its_end():
    recipe = build_recipe(SPEC)
    ops = recipe.ops
    with pytest.raises(ConfigError, match="must end with a CombinerOp"):
        Recipe(recipe.datasets, [*ops, Map(len, name="len")], 8, 4)
    with pytest.raises(ConfigError, match="must end with a CombinerOp"):
        Plan(ops[:-1], Execution())
    with pytest.raises(ConfigError, match=r"only the last operator .*\['first'\]"):
        Plan([*ops[:-1], Pack(32, name="first"), ops[-1]], Execution())
    with pytest.raises(ConfigError, match="'pairs' must set seq_len"):
        build_recipe(SPEC.but(combiner=PairRows(0)))


def test_loader_explains_the_combiner():
    with Loader(build_recipe(SPEC)) as loader:
        last = loader.plan.stages[-1]
        assert last.kind == "combiner" and last.ops == [SPEC.combiner]
        assert f"stage {last.index}: pairs [combiner" in loader.explain()
