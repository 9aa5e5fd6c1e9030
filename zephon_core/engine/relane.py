"""A new lane count on resume: an `L`-lane state re-dealt to `L2` lanes, as a pure function.

`change_lanes(state, recipe)` turns a checked global state of an `L`-lane run
into the global state of an `L2`-lane run (``recipe.num_lanes``) at the same
step, which then restores like any other (on any `D2` dividing `L2`). It
depends only on the *logical* content of the state, never on how far the
saving run's sources had drawn ahead: a snapshot's source counters, shuffle
buffers and in-flight lists differ with the execution knobs, but the set of
samples a lane had not yet handed to its combiner does not, and only that set
is used. The rules (docs/elastic-changes.md):

1. **Rows.** Every old lane's combiner rows (ready rows, then its open rows,
   closed as they are), in old lane order, are dealt round robin: row `i`
   to new lane ``i % L2``, where they are the first rows it delivers.
2. **Carried samples.** For each old lane, the samples drawn but not yet at
   its combiner (in flight, in accumulators) are rolled back into the
   undrawn stream as far as they form its tail (draws ``n .. draws-1`` all
   held); the rest, with their draw numbers, is sorted by (draw, old lane)
   over all lanes and dealt round robin. A new lane draws its share first,
   through its whole pipeline.
3. **Undrawn samples.** Per dataset, the positions of its order no old lane
   has drawn (after the roll-back) are the positions below the furthest old
   lane's next position that some lane had not reached (the *holes*, in
   increasing order), then every position from there on. New lane `k` takes
   items ``k, k + L2, ...`` of that sequence, chosen by the deficit rule of
   the mixture's weights from a fresh count (the weights apply from the change).

So every sample not delivered or dropped before the checkpoint is dealt to
exactly one new lane once. What a new lane holds is bounded by what the old
lanes buffered: the holes number the lanes' spread in draws per dataset
(pointers only, nothing is recomputed for them), the rows and the carried
samples are what the old lanes held.
"""

from __future__ import annotations

from typing import Any

from zephon_core.common.jsontext import is_count
from zephon_core.data.sources import Relaned, SourceState
from zephon_core.engine.batches import BatchSchedule
from zephon_core.engine.checkpoint import (
    LANES_KEY,
    check_state,
    lane_changes_of,
    make_state,
    migrate_state,
    resized_of,
)
from zephon_core.engine.snapshot import LaneSnapshot
from zephon_core.errors import CheckpointError, ConfigError
from zephon_core.ops.contract import AccumulatorOp, CombinerOp, StatefulOp
from zephon_core.records import Origin
from zephon_core.spec import Recipe


def change_lanes(state: Any, recipe: Recipe, sizes: list[list[int]] | None = None,
                 fingerprint: dict | None = None) -> dict:
    """The global state of `recipe` (``recipe.num_lanes`` lanes) that continues `state`, a
    global state of the same recipe with another lane count, at the same step.

    `state` is checked in full first (against `recipe` with the state's lane
    count). `sizes` (samples per shard, per dataset) and `fingerprint` default
    to the recipe's own. Refuses a mixture schedule, ``mix_by="tokens"`` and
    operators whose per-lane state cannot be re-dealt (e.g. balanced packing,
    whose groups are ``G / L`` rows), naming them.
    """
    state = migrate_state(state)
    _refuse_unsupported(state, recipe)
    fp = fingerprint if fingerprint is not None else recipe.fingerprint()
    L = _lanes(state)
    if not (is_count(L) and L > 0):
        raise CheckpointError(f"checkpoint is corrupt: num_lanes is {L!r}")
    resized = resized_of(state)
    G = recipe.global_batch_size
    old = BatchSchedule.build(L, G, recipe.batch_sizes(), resized)
    step = state.get("step") if isinstance(state, dict) else None
    check_state(state, {**fp, "num_lanes": L}, list(range(L)), recipe.ops,
                old.rows_before(step) if is_count(step) else None,
                [d.reader for d in recipe.datasets])
    step = int(state["step"])
    if sizes is None:
        from zephon_core.data.readers import shard_lengths

        sizes = [shard_lengths(d.reader) for d in recipe.datasets]
    held = _Held(len(recipe.datasets), L)
    for lane in range(L):
        held.add(lane, LaneSnapshot.from_json(state["lanes"][str(lane)]), recipe)
    limits = [None if recipe.epochs is None else recipe.epochs * sum(s) for s in sizes]
    new = BatchSchedule.build(recipe.num_lanes, G, recipe.batch_sizes(), resized)
    lanes = held.deal(recipe, limits, new.rows_before(step))
    return make_state(fp, step, lanes, recipe.num_lanes, resized,
                      [*lane_changes_of(state), (step, L, recipe.num_lanes)])


def _refuse_unsupported(state: Any, recipe: Recipe) -> None:
    """A mixture schedule and operators whose per-lane state cannot be re-dealt, named."""
    if any(p.weights is not None for p in recipe.phases):
        raise ConfigError("a lane-count change on resume is not supported with a mixture "
                          "schedule ([[phases]] with weights): each lane's phase gate counts "
                          "its own rows and settled draws from step 0, and no rule re-deals "
                          "that count over other lanes; resume with the checkpoint's lane "
                          f"count ({_lanes(state)})")
    if recipe.schedule() is not None:  # mix_by="tokens" without phases
        raise ConfigError("a lane-count change on resume is not supported with "
                          "mix_by='tokens': each lane's deficit rule counts the settled "
                          "tokens of its own draws from step 0, and no rule re-deals those "
                          "tallies over other lanes (a run whose lane count will change mixes "
                          "with mix_by='samples'); resume with the checkpoint's lane count "
                          f"({_lanes(state)})")
    comb = recipe.combiner
    if type(comb).rows_in_state is CombinerOp.rows_in_state:
        why = f": {comb.lane_change_refusal}" if comb.lane_change_refusal else ""
        raise ConfigError(f"the combiner {comb.name!r} ({type(comb).__name__}) does not support "
                          f"a lane-count change on resume{why}; resume with the checkpoint's "
                          f"lane count ({_lanes(state)})")
    for op in recipe.ops[:-1]:
        if isinstance(op, AccumulatorOp) and type(op).origins_in_state is \
                AccumulatorOp.origins_in_state:
            raise ConfigError(f"the operator {op.name!r} ({type(op).__name__}) does not support "
                              "a lane-count change on resume; resume with the checkpoint's "
                              f"lane count ({_lanes(state)})")


class _Held:
    """What the old lanes hold, gathered lane by lane (rules 1-3 of the module docstring)."""

    def __init__(self, nds: int, old_lanes: int) -> None:
        self.nds = nds
        self.old_lanes = old_lanes
        self.rows: list[tuple[int, list[list[int]]]] = []
        self.carry: list[tuple[tuple[int, int], tuple[int, int, int, int]]] = []
        self.nexts: list[list[int]] = [[] for _ in range(nds)]
        self.explicit: list[list[int]] = [[] for _ in range(nds)]
        self.stride = old_lanes

    def add(self, lane: int, snap: LaneSnapshot, recipe: Recipe) -> None:
        """Old lane `lane`'s rows, carried samples and next positions per dataset."""
        if snap.drops:
            raise CheckpointError(f"lane {lane}: the checkpoint's lane state holds drops not "
                                  "reported with a row, which zephon never saves; restore from "
                                  "an intact checkpoint file")
        src = snap.source
        rl = src.relaned
        held = [o for origins in snap.pending.values() for o in origins]
        for pos, acc_state in snap.accumulators.items():
            got = recipe.ops[int(pos)].origins_in_state(acc_state)  # type: ignore[attr-defined]
            held += [Origin(*o) for o in got]
        seqs = {o.seq for o in held}
        n = src.draws
        while n - 1 in seqs:
            n -= 1
        mixed_from = rl.mixed_from if rl is not None else 0
        counts = list(src.counts)
        for o in held:
            if o.seq >= max(n, mixed_from):
                counts[o.dataset] -= 1
        self.carry += [((o.seq, lane), (o.dataset, o.shard, o.index, o.epoch))
                       for o in held if o.seq < n]
        if rl is not None:
            self.carry += [((i, lane), rl.carry[i - rl.base]) for i in range(n, mixed_from)]
            self.stride = rl.stride
        for j in range(self.nds):
            c = counts[j]
            if rl is None:
                self.nexts[j].append(c * self.old_lanes + lane)
            else:
                e = rl.explicit[j]
                self.explicit[j] += e[c:]
                self.nexts[j].append(rl.start[j] + max(0, c - len(e)) * rl.stride)
        comb = recipe.combiner
        self.rows += [(lane, row) for row in comb.rows_in_state(snap.combiner)]  # type: ignore[union-attr]

    def deal(self, recipe: Recipe, limits: list[int | None], rows_before: int) -> dict[int, dict]:
        """The new lanes' snapshots: rows, carried samples and holes dealt round robin."""
        L2, nds = recipe.num_lanes, self.nds
        tops = [max(nx) for nx in self.nexts]
        holes = []
        for j in range(nds):
            found = self.explicit[j] + [p for nx in self.nexts[j]
                                        for p in range(nx, tops[j], self.stride)]
            holes.append(sorted(p for p in found if limits[j] is None or p < limits[j]))
        self.carry.sort()
        stateful = [str(i) for i, op in enumerate(recipe.ops) if isinstance(op, StatefulOp)]
        lanes: dict[int, dict] = {}
        for k in range(L2):
            numbering: dict[tuple[int, int], int] = {}
            mine = [[[numbering.setdefault((lane, seg[0]), len(numbering)), *seg[1:]]
                     for seg in row] for lane, row in self.rows[k::L2]]
            base = len(numbering)
            relaned = Relaned(base, [c for _, c in self.carry[k::L2]], [h[k::L2] for h in holes],
                              [tops[j] + (k - len(holes[j])) % L2 for j in range(nds)], L2)
            lanes[k] = LaneSnapshot(
                source=SourceState(base, [0] * nds, relaned=relaned),
                source_done=False,
                rows=rows_before,
                pending={pos: [] for pos in stateful},
                accumulators={str(i): op.make(k, recipe.seed).state()
                              for i, op in enumerate(recipe.ops)
                              if isinstance(op, AccumulatorOp)},
                combiner=recipe.combiner.state_of_rows(mine),
                flushed=[],
                drops=[],
                dropped={},
            ).to_json()
        return lanes
def _lanes(state: Any) -> Any:
    return state.get("num_lanes") if isinstance(state, dict) else None


__all__ = ["LANES_KEY", "change_lanes"]
