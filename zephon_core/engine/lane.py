"""One lane's run: its source, per-lane accumulators, combiner, and in-flight work.

Everything a lane decides (order, groupings into rows, drops) happens here,
in one thread, in the lane's element order. Workers only compute payloads.
A *snapshot* is taken after every `r`-th row: a consistent cut of the lane
(source counters, origins held or in flight at each stage, the combiner's
state, undelivered drops, its hooks' slices) from which `restore` rebuilds
the exact continuation.

The lane is a queue machine (`engine.lane_queues`); its optional concerns
(phase gate, backlog, digests, observers) and its stall guard are hooks
(`engine.lane_hooks`), told what happens at fixed points of the loop below.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from zephon_core.data.sources import LaneSource
from zephon_core.engine.batches import BatchSchedule
from zephon_core.engine.kinds import StageKind
from zephon_core.engine.lane_hooks import LaneHook, LaneHooks
from zephon_core.engine.lane_queues import (
    GROUP_CPU_S,
    WARM_GROUP_CPU_S,
    LaneDrops,
    LaneQueues,
    LaneStats,
    Taken,
    payload_tokens,
)
from zephon_core.engine.observe import DRIVER
from zephon_core.engine.plan import Plan
from zephon_core.engine.row_queue import RowQueue
from zephon_core.engine.runner_base import Runner
from zephon_core.engine.snapshot import LaneSnapshot
from zephon_core.engine.stall import StallGuard
from zephon_core.errors import CheckpointError
from zephon_core.records import Dropped, Origin

#: names other modules import from here (the group sizes are the lane's, kept beside its
#: queues in `engine.lane_queues`)
__all__ = ["GROUP_CPU_S", "WARM_GROUP_CPU_S", "LaneRun", "LaneStats", "Taken"]


class LaneRun:
    """The lane's state machine, behind a small API: the loader `request`s rows, `pump`s,
    `take`s a step's rows with their drops and snapshot, and reads `stats`; nothing else
    reads or writes the lane's fields.

    `hooks` (`engine.lane_hooks.LaneHook`) are the lane's optional concerns, called in
    their order at fixed points of the loop; the lane adds its `StallGuard` first. With a
    global batch size that changes, `batches` says where steps begin (else every
    `rows_per_step` rows).
    """

    def __init__(self, lane: int, plan: Plan, runners: dict[int, Runner], source: LaneSource,
                 seed: int, rows_per_step: int, hooks: Iterable[LaneHook] = (),
                 batches: BatchSchedule | None = None) -> None:
        self.lane = lane
        self._plan = plan
        self._source = source
        self._r = rows_per_step
        self._batches = batches
        # draws without a row: four times the data, plus what may be in flight (drawn, not
        # yet dropped or placed) and slack
        self._stall = StallGuard(lane, plan.combiner,
                                 4 * sum(o.total for o in source.orders)
                                 + plan.max_in_flight + 1024,
                                 plan.execution.stall_drops)
        self._hooks = LaneHooks([self._stall, *hooks])
        self._q = LaneQueues(plan, lane, seed, runners, self._hooks)
        #: rows made: at the row stages (`RowTransform`s), then ready to take, in order
        self._rows = RowQueue(plan, lane, seed, runners, self._hooks)
        self._rows_emitted = 0
        self._want_rows = 0
        self._warming = False
        self._drops = LaneDrops(self._hooks)
        self._source_done = False
        self._flushed: set[int] = set()
        self._finished = False

    # --- what hooks and the loader read (`engine.lane_hooks.LaneView`) ---------
    @property
    def transforming(self) -> int:
        """Elements waiting for or inside a transform stage (the backlog's in-flight count)."""
        return self._q.transforming

    @property
    def rows_made(self) -> int:
        """Rows made so far (restores included)."""
        return self._rows_emitted

    @property
    def dropped(self) -> Mapping[str, int]:
        """Drops so far, by reason (the row stages' as far as their rows have come back)."""
        late = self._rows.late
        if not late:
            return self._drops.counts
        return {k: self._drops.counts.get(k, 0) + late.get(k, 0)
                for k in {*self._drops.counts, *late}}

    @property
    def finished(self) -> bool:
        """The combiner has flushed and every row is back from the row stages: the lane
        makes no more rows."""
        return self._finished and not self._rows.in_flight()

    def needy(self) -> bool:
        """The next step still waits for this lane's rows (rows at the row stages are
        made: more draws would not bring them sooner)."""
        return self._rows.made() < self._r

    def moving_heads(self) -> list[Origin]:
        """The oldest element of each queue between stages."""
        return self._q.moving_heads()

    def held_origins(self) -> list[Origin]:
        """Every element drawn from the source that has not reached a row or a drop yet."""
        return self._q.held_origins()

    # --- the loader's API ----------------------------------------------------
    def ready(self) -> int:
        """Rows made, back from the row stages, and not yet taken."""
        return len(self._rows.ready)

    def request(self, rows: int, warming: bool = False) -> None:
        """Make rows until `rows` have been made in all (the lane draws nothing past that).

        `warming` (the loader's first step after it starts or restores): small groups. A
        worker serves groups in the order lanes sent them, so whole groups of costly samples
        would put the first lanes' spare work ahead of the last lanes' first samples.
        """
        self._want_rows = max(self._want_rows, rows)
        self._warming = warming

    def take(self, n: int) -> Taken:
        """The oldest `n` ready rows (``n <= ready()``), their drops, and the snapshot after
        the last of them: the state a checkpoint at that step boundary holds."""
        taken = [self._rows.ready.popleft() for _ in range(n)]
        rows = [row for row, _ in taken]
        return Taken(rows, [d for row in rows for d in row.drops], taken[-1][1])

    def leftover(self) -> Taken:
        """Without taking them: every row made with its drops (one still at a row stage as
        the combiner made it), and the drops recorded after the last row."""
        rows = self._rows.rows()
        return Taken(rows, [d for row in rows for d in row.drops], None,
                     tuple(self._drops.pending))

    def take_rest(self) -> Taken:
        """Take everything `leftover` shows (after `finish`: the lane's last rows)."""
        rest = self.leftover()
        self._rows.ready.clear()
        self._drops.pending = []
        return rest

    def finish(self, stop_drawing: bool) -> None:
        """Want every row the lane can make; `stop_drawing`: draw nothing more from the
        source, so the lane ends with what it holds (`Loader.drain` of endless data)."""
        if stop_drawing:
            self._source_done = True
        self._want_rows = 1 << 62

    def stats(self) -> LaneStats:
        """The lane's counts now."""
        return LaneStats(self.lane, self._rows_emitted, self.ready(),
                         self._stall.draws_since_row, self._source.state.draws,
                         dict(self.dropped), self.finished)

    def drop_hints(self) -> list[str]:
        """What to change, from the reasons of the drops since the lane's last row."""
        return self._stall.hints()

    def head_futures(self) -> list[Future]:
        """The oldest group in flight at each transform and row stage: what `pump` waits
        on next."""
        return self._q.head_futures() + self._rows.head_futures()

    # --- moving elements ---------------------------------------------------
    def _drain(self) -> bool:
        """Empty every accumulator's and the combiner's inbox, in stage order and each in
        element order, without waiting; True if anything moved.

        Ordering: an inbox is consumed head first, and what an accumulator releases goes to
        the tail of the next stage, so every stateful operator sees its elements in the
        lane's order. Exactly once: each element either reaches the next stage, is pushed
        into the combiner, or becomes a drop.
        """
        q, moved = self._q, False
        for i, box in q.inbox.items():
            if not box:
                continue
            moved = True
            start = time.monotonic() if self._hooks.watched else 0.0
            seen: list[Origin] = []
            while box:
                origin, payload = box.popleft()
                seen.append(origin)
                if isinstance(payload, Dropped):
                    if i == q.combiner_index:
                        self._hooks.reached_combiner(self, origin, 0)
                        self._drops.record(origin, payload.reason, payload.detail)
                    else:
                        q.to_stage(i + 1, origin, payload)
                elif i == q.combiner_index:
                    self._to_combiner(origin, payload)
                else:
                    self._to_accumulator(i, origin, payload)
            if self._hooks.watched:
                self._q.observe(i, DRIVER, start, time.monotonic(), seen)
        return moved

    def _to_combiner(self, origin: Origin, payload: Any) -> None:
        """Push one element into the combiner, record a refusal as a drop, take ready rows."""
        self._hooks.reached_combiner(self, origin, payload_tokens(payload))
        refused = self._q.combiner.push(origin, payload)
        if refused is None:
            self._hooks.took(origin)
        else:
            self._hooks.refused(origin)
            self._drops.record(origin, refused.reason, refused.detail)
        self._take_rows()

    def _to_accumulator(self, i: int, origin: Origin, payload: Any) -> None:
        """Push one element into stage `i`'s accumulator; what it releases (after what a
        hook's cut, such as a phase change, releases first) goes on, in its order."""
        acc = self._q.accs[i]
        for o, p in self._hooks.cut(self._q.position(i), origin, acc):
            self._q.to_stage(i + 1, o, p)
        outs = acc.push((origin, payload))
        self._hooks.released(origin, outs)
        for o, p in outs:
            self._q.to_stage(i + 1, o, p)

    def _take_rows(self) -> None:
        """Move every finished row out of the combiner, in its order, with the drops
        recorded since the previous row; after each step's last row, snapshot the lane.

        Rows and drops are numbered by the lane's element order alone, so every row and
        snapshot is the same at every `D`, runner and timing.
        """
        while (row := self._q.combiner.pop_row()) is not None:
            self._drops.on_row(row)
            self._hooks.row(self, row)
            self._rows_emitted += 1
            boundary = (self._rows_emitted % self._r == 0 if self._batches is None
                        else self._batches.step_at_rows(self._rows_emitted) is not None)
            snap = self.snapshot() if boundary else None
            self._rows.submit(row, snap)
        self._send_rows()

    def _send_rows(self) -> None:
        """Send the rows within those the loader asked for to the row stages (`RowQueue`)."""
        if self._rows.held:
            self._rows.send_held(self._want_rows - (self._rows_emitted - self._rows.held))

    def _can_pull(self) -> bool:
        """May the lane draw one more element now?

        Only while rows are wanted, the lane's in-flight budget has room and every hook
        allows it (the phase gate, the rank's backlog). None of these changes *what* is
        drawn, only when: the lane's stream is the source's order.
        """
        if (self._source_done or self._rows_emitted >= self._want_rows
                or self._q.in_flight() >= self._q.budget):
            return False
        return self._hooks.may_draw(self)

    def pump(self) -> bool:
        """Move everything that can move without waiting; True if anything did.

        Ordering: finished groups are taken only from the head of each stage's in-flight
        queue, so results pass on in submission order whatever order workers finish in;
        later stages are served first so their room frees before earlier stages fill it.
        Exactly once: every element drawn is in exactly one queue, group, accumulator,
        combiner bin, row or pending drop at any time (`held_origins` lists the in-between).
        Liveness: a call that returns False left nothing movable, so the caller waits on
        `head_futures`; when the data ends (or the lane is starved of draws) part groups
        are sent, and once every stage before it is empty each stateful stage is flushed in
        order, ending with the combiner (`finished`). A lane that only drops stops through
        its `StallGuard`, at a sample that depends only on the data.
        """
        self._send_rows()
        moved = self._rows.collect()
        moved |= self._q.collect()
        moved |= self._drain()
        while self._can_pull():
            origin = self._source.next()
            moved = True
            self._hooks.drew(self)
            if origin is None:
                self._source_done = True
                break
            self._q.to_stage(0, origin, origin.pointer)
            self._drain()
        starving = self._source_done or not self._can_pull()
        moved |= self._q.send(self._warming, starving)
        moved |= self._drain()
        moved |= self._flush_if_done()
        return self._rows.collect() or moved

    def _flush_if_done(self) -> bool:
        """After the source's end: flush each stateful stage, in stage order, once every
        stage before it is empty (so a flush never overtakes an element still on its way);
        flushing the combiner finishes the lane."""
        if not self._source_done or self._finished:
            return False
        q, moved = self._q, False
        for s in q.stages:
            if s.kind in (StageKind.TRANSFORM, StageKind.ROWS) or s.index in self._flushed:
                continue
            if not (q.empty_before(s.index) and not q.inbox[s.index]):
                break
            self._flushed.add(s.index)
            moved = True
            if s.index == q.combiner_index:
                q.combiner.flush()
                self._take_rows()
                self._finished = True
            else:
                for o, p in q.accs[s.index].flush():
                    q.to_stage(s.index + 1, o, p)
                self._drain()
        return moved

    # --- checkpoint --------------------------------------------------------
    def snapshot(self) -> dict:
        """The lane's state now, as JSON data (`LaneSnapshot`)."""
        q = self._q
        return LaneSnapshot(
            source=self._source.state,
            source_done=self._source_done,
            rows=self._rows_emitted,
            pending=q.pending(),
            accumulators={q.position(i): a.state() for i, a in q.accs.items()},
            combiner=q.combiner.state(),
            flushed=sorted(q.op_of_stage[i] for i in self._flushed),
            drops=list(self._drops.pending),
            dropped=self._drops.counts,
            drop_details=self._drops.details,
            hooks=self._hooks.state(),
        ).to_json()

    def restore(self, state: dict) -> None:
        """Rebuild the lane from a snapshot; payloads are recomputed from origins."""
        try:
            snap = LaneSnapshot.from_json(state)
            self._hooks.restore(snap.hooks, f"lane {self.lane}")
            self._source.set_state(snap.source)
            if len(self._source.state.counts) != len(self._source.orders):
                raise ValueError(f"source.counts has {len(self._source.state.counts)} entries "
                                 f"for {len(self._source.orders)} datasets")
            self._source_done = snap.source_done
            self._rows_emitted = snap.rows
            self._flushed = {self._q.stage_of_op[i] for i in snap.flushed}
            self._drops.restore(snap)
            self._q.refill(snap)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise CheckpointError(
                f"lane {self.lane}: the checkpoint's lane state is corrupt or truncated "
                f"({type(exc).__name__}: {exc}); restore from an intact checkpoint file") from None
        self._finished = self._q.combiner_index in self._flushed
        self._take_rows()
