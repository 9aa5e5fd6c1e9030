"""One lane's run: its source, per-lane accumulators, combiner, and in-flight work.

Everything a lane decides (order, groupings into rows, drops) happens here,
in one thread, in the lane's element order. Workers only compute payloads.
A *snapshot* is taken after every `r`-th row: a consistent cut of the lane
(source counters, origins held or in flight at each stage, the combiner's
state, undelivered drops) from which `restore` rebuilds the exact continuation.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple

from zephon_core.common.hashing import derive
from zephon_core.data.sources import LaneSource
from zephon_core.engine.backlog import Backlog
from zephon_core.engine.batches import BatchSchedule
from zephon_core.engine.digest_book import DigestBook
from zephon_core.engine.kinds import StageKind
from zephon_core.engine.observe import DRIVER, Span, StageEvent, StageObserver
from zephon_core.engine.phases import PhaseGate
from zephon_core.engine.plan import Plan
from zephon_core.engine.runner_base import Runner
from zephon_core.engine.snapshot import PHASE_GATE, LaneSnapshot
from zephon_core.engine.stall import StallGuard
from zephon_core.errors import CheckpointError, ZephonError
from zephon_core.ops.contract import Accumulator, Combiner, Digested, Row
from zephon_core.records import Dropped, Element, Origin, drop_detail

_KEY_SALT = 0x454C454D


#: CPU seconds of work per group while warming (a group costs 1-2 ms to move: photos in
#: groups of one came 0.4 s later) and after (a lane keeps `prefetch` groups in flight:
#: whole groups of clips held 550 MB of frames for rows wanted steps later)
WARM_GROUP_CPU_S, GROUP_CPU_S = 0.02, 0.1


def payload_tokens(payload: Any) -> int:
    """Tokens a payload brings to the combiner (``mix_by = "tokens"`` counts these)."""
    tokens = payload.get("tokens") if isinstance(payload, dict) else None
    return len(tokens) if tokens is not None else 0


def element_key(seed: int, o: Origin) -> int:
    """Per-element randomness key: depends on the sample and epoch, not on lane or grouping."""
    return derive(seed, _KEY_SALT, o.dataset, o.shard, o.index, o.epoch)


class _Group:
    """A group submitted to a stage's runner; with an observer, `done` is when its future
    completed."""

    __slots__ = ("origins", "future", "submitted", "_done")

    def __init__(self, origins: list[Origin], future: Future, submitted: float,
                 observed: bool) -> None:
        self.origins = origins
        self.future = future
        self.submitted = submitted
        self._done: list[float] = []
        if observed:
            # the callback holds the list, not the group: a group -> future -> callback ->
            # group cycle would keep every answer (and its shared memory) alive until the
            # cyclic garbage collector happened to run
            done = self._done
            future.add_done_callback(lambda _: done.append(time.monotonic()))

    @property
    def done(self) -> float:
        return self._done[0] if self._done else 0.0


class _TransformState:
    __slots__ = ("waiting", "inflight")

    def __init__(self) -> None:
        self.waiting: deque[tuple[Origin, Any]] = deque()
        self.inflight: deque[_Group] = deque()

    def count(self) -> int:
        return len(self.waiting) + sum(len(g.origins) for g in self.inflight)

    def origins(self) -> list[Origin]:
        """Oldest first: submitted groups, then not yet submitted."""
        return [o for g in self.inflight for o in g.origins] + [o for o, _ in self.waiting]


class Taken(NamedTuple):
    """Rows a lane hands over, the drops they carry, and the snapshot after the last row
    (None unless it ends a step)."""

    rows: list[Row]
    drops: list[tuple[Origin, str]]
    snapshot: dict | None = None
    #: drops recorded after the last row, which no row carries (`leftover`, `take_rest`)
    after: tuple[tuple[Origin, str], ...] = ()


@dataclass(frozen=True)
class LaneStats:
    """What a lane shows the loader's stall report and tests: counts, never payloads."""

    lane: int
    #: rows made so far (over the whole run, restores included)
    rows_made: int
    #: rows made and not yet taken
    ready: int
    draws_since_row: int
    #: elements drawn from the source so far
    drawn: int
    #: drops so far, by reason
    dropped: dict[str, int]
    finished: bool


class LaneRun:
    """The lane's state machine, behind a small API: the loader `request`s rows, `pump`s,
    `take`s a step's rows with their drops and snapshot, and reads `stats`; nothing else
    reads or writes the lane's fields.

    `observer` (see `engine.observe`) and `spans` (the metrics' event log: ``(stage, start,
    end, elements)`` per group, cheaper than an event) only watch it.
    """

    def __init__(self, lane: int, plan: Plan, runners: dict[int, Runner], source: LaneSource,
                 seed: int, rows_per_step: int, observer: StageObserver | None = None,
                 backlog: Backlog | None = None, gate: PhaseGate | None = None,
                 batches: BatchSchedule | None = None,
                 spans: Callable[[Span], None] | None = None) -> None:
        self.lane = lane
        #: with a mixture schedule: decides in lane order when the source's next phase starts
        self._gate = gate
        self._backlog = backlog
        self._observer = observer
        self._spans = spans
        self._watched = observer is not None or spans is not None
        self._plan = plan
        self._stages = plan.stages
        self._runners = runners
        self._source = source
        self._seed = seed
        self._r = rows_per_step
        #: with a global batch size that changes: where steps begin (else every `r` rows)
        self._batches = batches
        self._group_size = plan.execution.group_size
        self._prefetch = plan.prefetch
        self._budget = plan.prefetch * plan.execution.group_size
        self._t = {s.index: _TransformState() for s in self._stages
                   if s.kind is StageKind.TRANSFORM}
        self._inbox: dict[int, deque[tuple[Origin, Any]]] = {
            s.index: deque() for s in self._stages if s.kind is not StageKind.TRANSFORM}
        # A snapshot names stateful stages by their operator's position in the recipe, not
        # by stage number: fusing transforms is an execution choice, so stage numbers
        # differ between executions while operator positions never do.
        self._op_of_stage = {s.index: plan.ops.index(s.ops[0]) for s in self._stages
                             if s.kind is not StageKind.TRANSFORM}
        self._stage_of_op = {op: stage for stage, op in self._op_of_stage.items()}
        self._accs: dict[int, Accumulator] = {
            s.index: s.ops[0].make(lane, seed) for s in self._stages
            if s.kind is StageKind.ACCUMULATOR}
        self._combiner_index = self._stages[-1].index
        self._combiner: Combiner = plan.combiner.make(lane, seed)
        self._rows: deque[tuple[Row, dict | None]] = deque()
        self._rows_emitted = 0
        self._want_rows = 0
        self._warming = False
        self._pending_drops: list[tuple[Origin, str]] = []
        #: the detail of a pending drop, by origin (`drop_detail`; the ledger shows it)
        self._drop_details: dict[Origin, str] = {}
        self._dropped: dict[str, int] = {}
        self._source_done = False
        self._flushed: set[int] = set()
        self._finished = False
        self._stall = StallGuard(lane, plan.combiner,
                                 4 * sum(o.total for o in source.orders) + 1024,
                                 plan.execution.stall_drops)
        #: with the ledger on (`plan.digests`): the workers' sample digests
        self._digests = DigestBook(self._budget) if plan.digests else None
        #: elements waiting for or inside a transform stage (not yet finished documents),
        #: counted as they move: the backlog sums it over the lanes before every draw
        self._transforming = 0

    # --- the loader's API ----------------------------------------------------
    @property
    def transforming(self) -> int:
        """Elements waiting for or inside a transform stage (the backlog's in-flight count)."""
        return self._transforming

    @property
    def finished(self) -> bool:
        """The combiner has flushed: the lane makes no more rows."""
        return self._finished

    @property
    def phase_of(self) -> Callable[[Origin], int] | None:
        """With a mixture schedule: the phase of an element, for the ledger (else None)."""
        return self._gate.phase_of if self._gate is not None else None

    def ready(self) -> int:
        """Rows made and not yet taken."""
        return len(self._rows)

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
        taken = [self._rows.popleft() for _ in range(n)]
        rows = [row for row, _ in taken]
        return Taken(rows, [d for row in rows for d in row.drops], taken[-1][1])

    def leftover(self) -> Taken:
        """Without taking them: every ready row with its drops, and the drops recorded
        after the last row."""
        rows = [row for row, _ in self._rows]
        return Taken(rows, [d for row in rows for d in row.drops], None,
                     tuple(self._pending_drops))

    def take_rest(self) -> Taken:
        """Take everything `leftover` shows (after `finish`: the lane's last rows)."""
        rest = self.leftover()
        self._rows.clear()
        self._pending_drops = []
        return rest

    def finish(self, stop_drawing: bool) -> None:
        """Want every row the lane can make; `stop_drawing`: draw nothing more from the
        source, so the lane ends with what it holds (`Loader.drain` of endless data)."""
        if stop_drawing:
            self._source_done = True
        self._want_rows = 1 << 62

    def stats(self) -> LaneStats:
        """The lane's counts now."""
        return LaneStats(self.lane, self._rows_emitted, len(self._rows),
                         self._stall.draws_since_row, self._source.state.draws,
                         dict(self._dropped), self._finished)

    def drop_hints(self) -> list[str]:
        """What to change, from the reasons of the drops since the lane's last row."""
        return self._stall.hints()

    def head_futures(self) -> list[Future]:
        """The oldest group in flight at each transform stage: what `pump` waits on next."""
        return [st.inflight[0].future for st in self._t.values() if st.inflight]

    # --- moving elements ---------------------------------------------------
    def _to_stage(self, i: int, origin: Origin, payload: Any) -> None:
        """Append to stage `i`'s queue: queues are FIFO, so each stage sees the lane's
        element order."""
        if i in self._t:
            self._t[i].waiting.append((origin, payload))
            self._transforming += 1
        else:
            self._inbox[i].append((origin, payload))

    def _record_drop(self, origin: Origin, reason: str, detail: str = "") -> None:
        """A drop decided by the lane (exactly once: the drop rides on the next row, or is
        in the snapshot until then)."""
        self._pending_drops.append((origin, reason))
        if detail:
            self._drop_details[origin] = drop_detail(detail)
        self._dropped[reason] = self._dropped.get(reason, 0) + 1
        self._stall.dropped(origin, reason)

    def _drain(self) -> bool:
        """Empty every accumulator's and the combiner's inbox, in stage order and each in
        element order, without waiting; True if anything moved.

        Ordering: an inbox is consumed head first, and what an accumulator releases goes to
        the tail of the next stage, so every stateful operator sees its elements in the
        lane's order. Exactly once: each element either reaches the next stage, is pushed
        into the combiner, or becomes a drop.
        """
        moved = False
        for i, box in self._inbox.items():
            if not box:
                continue
            moved = True
            start = time.monotonic() if self._watched else 0.0
            seen: list[Origin] = []
            while box:
                origin, payload = box.popleft()
                seen.append(origin)
                if isinstance(payload, Dropped):
                    if i == self._combiner_index:
                        if self._gate is not None:
                            self._gate.at_combiner(origin, self._rows_emitted)
                        self._record_drop(origin, payload.reason, payload.detail)
                    else:
                        self._to_stage(i + 1, origin, payload)
                elif i == self._combiner_index:
                    self._to_combiner(origin, payload)
                else:
                    self._to_accumulator(i, origin, payload)
            if self._watched:
                self._observe(i, DRIVER, start, time.monotonic(), seen)
        return moved

    def _to_combiner(self, origin: Origin, payload: Any) -> None:
        """Push one element into the combiner, record a refusal as a drop, take ready rows."""
        if self._gate is not None:
            self._gate.at_combiner(origin, self._rows_emitted, payload_tokens(payload))
        refused = self._combiner.push(origin, payload)
        if refused is None:
            self._stall.took()
        else:
            if self._gate is not None:
                self._gate.refused()
            self._record_drop(origin, refused.reason, refused.detail)
            if self._digests is not None:
                self._digests.forget(origin)
        self._take_rows()

    def _to_accumulator(self, i: int, origin: Origin, payload: Any) -> None:
        """Push one element into stage `i`'s accumulator; what it releases (after what a
        phase cut releases first) goes on, in its order."""
        if self._gate is not None:
            for o, p in self._gate.cut(str(self._op_of_stage[i]), origin, self._accs[i]):
                self._to_stage(i + 1, o, p)
        outs = self._accs[i].push((origin, payload))
        if self._gate is not None:
            self._gate.released(origin, outs)
        for o, p in outs:
            self._to_stage(i + 1, o, p)

    def _observe(self, i: int, runner: str, start: float, end: float,
                 origins: list[Origin]) -> None:
        if self._spans is not None:
            self._spans((i, start, end, len(origins)))
        if self._observer is not None:
            self._observer(StageEvent(self.lane, i, self._stages[i].name, runner, start, end,
                                      tuple(origins)))

    def _take_rows(self) -> None:
        """Move every finished row out of the combiner, in its order, with the drops
        recorded since the previous row; after each step's last row, snapshot the lane.

        Rows and drops are numbered by the lane's element order alone, so every row and
        snapshot is the same at every `D`, runner and timing.
        """
        while (row := self._combiner.pop_row()) is not None:
            self._stall.row()
            row.drops, self._pending_drops = self._pending_drops, []
            row.drop_details = [self._drop_details.pop(o, "") for o, _ in row.drops]
            if self._digests is not None:
                row.digests = self._digests.of_row(row, self.held_origins)
            self._rows_emitted += 1
            boundary = (self._rows_emitted % self._r == 0 if self._batches is None
                        else self._batches.step_at_rows(self._rows_emitted) is not None)
            snap = self.snapshot() if boundary else None
            self._rows.append((row, snap))

    def _in_flight(self) -> int:
        return self._transforming + sum(len(b) for b in self._inbox.values())

    def _can_pull(self) -> bool:
        """May the lane draw one more element now?

        Only while rows are wanted, the lane's in-flight budget has room, the phase gate
        allows it and the rank's backlog admits it. None of these changes *what* is drawn,
        only when: the lane's stream is the source's order.
        """
        if (self._source_done or self._rows_emitted >= self._want_rows
                or self._in_flight() >= self._budget):
            return False
        if self._gate is not None and not self._gate.may_draw(self._source, self._rows_emitted,
                                                              self._lowest_moving()):
            return False
        return self._backlog is None or self._backlog.admits(self._transforming,
                                                             len(self._rows) < self._r)

    def _lowest_moving(self) -> int | None:
        """The smallest trigger among elements between stages (each queue is in trigger
        order, so only heads count)."""
        gate = self._gate
        assert gate is not None
        heads = [st.inflight[0].origins[0] if st.inflight else st.waiting[0][0]
                 for st in self._t.values() if st.inflight or st.waiting]
        heads += [box[0][0] for box in self._inbox.values() if box]
        return min((gate.trigger(o) for o in heads), default=None)

    def _empty_before(self, i: int) -> bool:
        """Nothing waits in or before stage `i`: what it holds is all it will get for now."""
        return all(
            (self._t[j].count() == 0) if j in self._t else not self._inbox[j]
            for j in range(i))

    def _group_size_now(self, i: int) -> int:
        """At most `group_size` samples, about `GROUP_CPU_S` (warming: `WARM_...`) of CPU."""
        per = self._runners[i].cpu_per_element()
        if per is None:
            return 1 if self._warming else self._group_size
        target = WARM_GROUP_CPU_S if self._warming else GROUP_CPU_S
        return max(1, min(self._group_size, int(target / max(per, 1e-9))))

    def _submit(self, i: int, st: _TransformState, size: int) -> None:
        """Send the oldest waiting elements (up to `size`) to stage `i`'s runner. Each
        element's randomness key comes from its origin, never from the grouping."""
        n = min(size, len(st.waiting))
        take = [st.waiting.popleft() for _ in range(n)]
        elements = [Element(element_key(self._seed, o), p, o) for o, p in take]
        observed = self._watched
        submitted = time.monotonic() if observed else 0.0
        group = _Group([o for o, _ in take], self._runners[i].submit(elements), submitted,
                       observed)
        st.inflight.append(group)

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
        moved = self._collect()
        moved |= self._drain()
        while self._can_pull():
            origin = self._source.next()
            moved = True
            self._stall.drew(self._dropped)
            if origin is None:
                self._source_done = True
                break
            self._to_stage(0, origin, origin.pointer)
            self._drain()
        starving = self._source_done or not self._can_pull()
        for i, st in self._t.items():
            size = self._group_size_now(i)
            while st.waiting and len(st.inflight) < self._prefetch and (
                    len(st.waiting) >= size or (starving and self._empty_before(i))):
                self._submit(i, st, size)
                moved = True
        moved |= self._drain()
        return self._flush_if_done() or moved

    def _collect(self) -> bool:
        """Take finished groups off the head of each transform stage (last stage first) and
        pass their outputs on in submission order; True if any was taken. A worker's error
        stops the run naming the group's first sample; its digests go to the book."""
        moved = False
        for i in sorted(self._t, reverse=True):
            st = self._t[i]
            while st.inflight and st.inflight[0].future.done():
                group = st.inflight.popleft()
                self._transforming -= len(group.origins)
                try:
                    outs = group.future.result()
                except ZephonError:
                    raise
                except Exception as exc:
                    raise RuntimeError(f"lane {self.lane}, stage {self._stages[i].name!r}, "
                                       f"group starting at {group.origins[0].where()}: "
                                       f"{exc}") from exc
                for o, out in zip(group.origins, outs, strict=True):
                    if isinstance(out, Digested):
                        if self._digests is not None:
                            self._digests.record(o, out.digest)
                        out = out.payload
                    if self._backlog is not None and i + 1 not in self._t:
                        self._backlog.track(out)
                    self._to_stage(i + 1, o, out)
                if self._watched:
                    self._observe(i, self._stages[i].runner_kind, group.submitted,
                                  group.done or time.monotonic(), group.origins)
                moved = True
        return moved

    def _flush_if_done(self) -> bool:
        """After the source's end: flush each stateful stage, in stage order, once every
        stage before it is empty (so a flush never overtakes an element still on its way);
        flushing the combiner finishes the lane."""
        if not self._source_done or self._finished:
            return False
        moved = False
        for s in self._stages:
            if s.kind is StageKind.TRANSFORM or s.index in self._flushed:
                continue
            if not (self._empty_before(s.index) and not self._inbox[s.index]):
                break
            self._flushed.add(s.index)
            moved = True
            if s.index == self._combiner_index:
                self._combiner.flush()
                self._take_rows()
                self._finished = True
            else:
                for o, p in self._accs[s.index].flush():
                    self._to_stage(s.index + 1, o, p)
                self._drain()
        return moved

    # --- checkpoint --------------------------------------------------------
    def _pending(self) -> dict[str, list[Origin]]:
        """Per accumulator/combiner stage: origins on their way to it, oldest first."""
        out: dict[str, list[Origin]] = {}
        start = 0
        for s in self._stages:
            if s.kind is StageKind.TRANSFORM:
                continue
            origins = [o for o, _ in self._inbox[s.index]]
            for j in range(s.index - 1, start - 1, -1):
                origins += self._t[j].origins()
            out[str(self._op_of_stage[s.index])] = origins
            start = s.index + 1
        return out

    def held_origins(self) -> list[Origin]:
        """Every element drawn from the source that has not reached a row or a drop yet."""
        pending = [o for origins in self._pending().values() for o in origins]
        held = [o for acc in self._accs.values() for o in acc.held_origins()]
        return pending + held + self._combiner.held_origins()

    def snapshot(self) -> dict:
        """The lane's state now, as JSON data (`LaneSnapshot`)."""
        return LaneSnapshot(
            source=self._source.state,
            source_done=self._source_done,
            rows=self._rows_emitted,
            pending=self._pending(),
            accumulators={str(self._op_of_stage[i]): a.state() for i, a in self._accs.items()},
            combiner=self._combiner.state(),
            flushed=sorted(self._op_of_stage[i] for i in self._flushed),
            drops=list(self._pending_drops),
            dropped=self._dropped,
            drop_details=self._drop_details,
            phase_gate=self._gate.state() if self._gate is not None else None,
        ).to_json()

    def _recompute(self, origins: list[Origin], upto: int) -> list[Any]:
        fn = self._plan.prefix_fn(upto)
        if not fn.transforms:
            return [o.pointer for o in origins]
        fn.setup()
        outs = fn([Element(element_key(self._seed, o), o.pointer, o) for o in origins])
        if self._backlog is not None and upto not in self._t:
            for out in outs:
                self._backlog.track(out)
        return outs

    def restore(self, state: dict) -> None:
        """Rebuild the lane from a snapshot; payloads are recomputed from origins."""
        try:
            snap = LaneSnapshot.from_json(state)
            self._source.set_state(snap.source)
            if self._gate is not None:
                if snap.phase_gate is None:
                    raise KeyError(PHASE_GATE)
                self._gate.restore(snap.phase_gate)
            if len(self._source.state.counts) != len(self._source.orders):
                raise ValueError(f"source.counts has {len(self._source.state.counts)} entries "
                                 f"for {len(self._source.orders)} datasets")
            self._source_done = snap.source_done
            self._rows_emitted = snap.rows
            self._flushed = {self._stage_of_op[i] for i in snap.flushed}
            self._pending_drops = list(snap.drops)
            self._drop_details = dict(snap.drop_details)
            self._dropped = dict(snap.dropped)
            start = 0
            for s in self._stages:
                if s.kind is StageKind.TRANSFORM:
                    continue
                key = str(self._op_of_stage[s.index])
                origins = snap.pending[key]
                entry = start if start < s.index else s.index
                for o, p in zip(origins, self._recompute(origins, entry), strict=True):
                    self._to_stage(entry, o, p)
                if s.kind is StageKind.ACCUMULATOR:
                    self._accs[s.index].restore(snap.accumulators[key],
                                               lambda os_, i=s.index: self._recompute(os_, i))
                start = s.index + 1
            self._combiner.restore(snap.combiner,
                                  lambda os_: self._recompute(os_, self._combiner_index))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise CheckpointError(
                f"lane {self.lane}: the checkpoint's lane state is corrupt or truncated "
                f"({type(exc).__name__}: {exc}); restore from an intact checkpoint file") from None
        self._finished = self._combiner_index in self._flushed
        self._take_rows()
