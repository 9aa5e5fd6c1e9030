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
from typing import Any

from zephon_core.common.digest import sample_digest
from zephon_core.common.hashing import derive
from zephon_core.data.sources import LaneSource
from zephon_core.engine.backlog import Backlog
from zephon_core.engine.batches import BatchSchedule
from zephon_core.engine.observe import DRIVER, Span, StageEvent, StageObserver
from zephon_core.engine.phases import PhaseGate
from zephon_core.engine.plan import Plan
from zephon_core.engine.runners import Runner
from zephon_core.engine.snapshot import PHASE_GATE, LaneSnapshot
from zephon_core.errors import CheckpointError, NoRowsError, ZephonError
from zephon_core.ops.contract import Accumulator, Combiner, Digested, Row, Segment
from zephon_core.records import Dropped, Element, Origin, drop_detail

_KEY_SALT = 0x454C454D


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


class LaneRun:
    """The lane's state machine; `observer` (see `engine.observe`) and `spans` (the metrics'
    event log: ``(stage, start, end, elements)`` per group, cheaper than an event) only
    watch it."""

    def __init__(self, lane: int, plan: Plan, runners: dict[int, Runner], source: LaneSource,
                 seed: int, rows_per_step: int, observer: StageObserver | None = None,
                 backlog: Backlog | None = None, gate: PhaseGate | None = None,
                 batches: BatchSchedule | None = None,
                 spans: Callable[[Span], None] | None = None) -> None:
        self.lane = lane
        #: with a mixture schedule: decides in lane order when the source's next phase starts
        self.gate = gate
        self.backlog = backlog
        self.observer = observer
        self.spans = spans
        self.watched = observer is not None or spans is not None
        self.plan = plan
        self.stages = plan.stages
        self.runners = runners
        self.source = source
        self.seed = seed
        self.r = rows_per_step
        #: with a global batch size that changes: where steps begin (else every `r` rows)
        self.batches = batches
        ex = plan.execution
        self.group_size = ex.group_size
        self.prefetch = plan.prefetch
        self.budget = plan.prefetch * ex.group_size
        self.t = {s.index: _TransformState() for s in self.stages if s.kind == "transform"}
        self.inbox: dict[int, deque[tuple[Origin, Any]]] = {
            s.index: deque() for s in self.stages if s.kind != "transform"}
        # A snapshot names stateful stages by their operator's position in the recipe, not
        # by stage number: fusing transforms is an execution choice, so stage numbers
        # differ between executions while operator positions never do.
        self.op_of_stage = {s.index: plan.ops.index(s.ops[0]) for s in self.stages
                            if s.kind != "transform"}
        self.stage_of_op = {op: stage for stage, op in self.op_of_stage.items()}
        self.accs: dict[int, Accumulator] = {
            s.index: s.ops[0].make(lane, seed) for s in self.stages if s.kind == "accumulator"}
        self.combiner_index = self.stages[-1].index
        self.combiner: Combiner = plan.combiner.make(lane, seed)
        self.rows: deque[tuple[Row, dict | None]] = deque()
        self.rows_emitted = 0
        self.want_rows = 0
        self.pending_drops: list[tuple[Origin, str]] = []
        #: the detail of a pending drop, by origin (`drop_detail`; the ledger shows it)
        self.drop_details: dict[Origin, str] = {}
        self.dropped: dict[str, int] = {}
        self.source_done = False
        self.flushed: set[int] = set()
        self.finished = False
        self.draws_since_row = 0
        self.stall_limit = 4 * sum(o.total for o in source.orders) + 1024
        #: drops since the combiner last took an element, by reason (`Execution.stall_drops`)
        self.max_drops_in_a_row = plan.execution.stall_drops
        self.drops_in_a_row: dict[str, int] = {}
        #: with the ledger on (`plan.digests`): sample digests made by the workers, by
        #: origin, until the element's last segment is in a row
        self.digests: dict[Origin, dict[str, str]] | None = {} if plan.digests else None
        #: elements waiting for or inside a transform stage (not yet finished documents),
        #: counted as they move: the backlog sums it over the lanes before every draw
        self.transforming = 0

    # --- moving elements ---------------------------------------------------
    def _to_stage(self, i: int, origin: Origin, payload: Any) -> None:
        if i in self.t:
            self.t[i].waiting.append((origin, payload))
            self.transforming += 1
        else:
            self.inbox[i].append((origin, payload))

    def _record_drop(self, origin: Origin, reason: str, detail: str = "") -> None:
        self.pending_drops.append((origin, reason))
        if detail:
            self.drop_details[origin] = drop_detail(detail)
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        run = self.drops_in_a_row
        run[reason] = run.get(reason, 0) + 1
        limit = self.max_drops_in_a_row
        if limit is not None and sum(run.values()) >= limit:
            raise NoRowsError(self._all_dropped_message(origin))

    def drop_hints(self) -> list[str]:
        """What to change, from the reasons of the drops since the lane's last row."""
        run = self.drops_in_a_row
        hints = []
        seq_len = getattr(self.plan.combiner, "seq_len", None)
        if "over_length" in run:
            hints.append(f"seq_len {seq_len} is smaller than these samples: raise the context "
                         "length (TorchTitan: --training.seq_len), make images smaller "
                         "(max_pixels; --dataloader.max_pixels), or truncate long text "
                         "documents (overlong='truncate'; a document with images is never cut)"
                         if seq_len else
                         "the samples are longer than a row: raise the context length")
        other = sorted(set(run) - {"over_length"})
        if other:
            hints.append(f"check the data and the filters that drop {', '.join(other)} "
                         "(`zephon-vl ledger`/the drop records name every sample)")
        return hints

    def _all_dropped_message(self, origin: Origin) -> str:
        run = self.drops_in_a_row
        counts = ", ".join(f"{n} {r}" for r, n in sorted(run.items(), key=lambda x: -x[1]))
        hints = self.drop_hints()
        return (f"lane {self.lane} dropped every one of the last {sum(run.values())} samples "
                f"it drew ({counts}; last {origin.where()}) and made no row from them: "
                f"{'; '.join(hints)}. The limit is Execution.stall_drops "
                f"({self.max_drops_in_a_row}; TorchTitan: --dataloader.stall_drops)")

    def _drain(self) -> bool:
        moved = False
        for i, box in self.inbox.items():
            if not box:
                continue
            moved = True
            start = time.monotonic() if self.watched else 0.0
            seen: list[Origin] = []
            while box:
                origin, payload = box.popleft()
                seen.append(origin)
                if isinstance(payload, Dropped):
                    if i == self.combiner_index:
                        if self.gate is not None:
                            self.gate.at_combiner(origin, self.rows_emitted)
                        self._record_drop(origin, payload.reason, payload.detail)
                    else:
                        self._to_stage(i + 1, origin, payload)
                elif i == self.combiner_index:
                    if self.gate is not None:
                        self.gate.at_combiner(origin, self.rows_emitted, payload_tokens(payload))
                    refused = self.combiner.push(origin, payload)
                    if refused is None:
                        self.drops_in_a_row = {}
                    else:
                        if self.gate is not None:
                            self.gate.refused()
                        self._record_drop(origin, refused.reason, refused.detail)
                        if self.digests is not None:
                            self.digests.pop(origin, None)
                    self._take_rows()
                else:
                    if self.gate is not None:
                        for o, p in self.gate.cut(str(self.op_of_stage[i]), origin,
                                                  self.accs[i]):
                            self._to_stage(i + 1, o, p)
                    outs = self.accs[i].push((origin, payload))
                    if self.gate is not None:
                        self.gate.released(origin, outs)
                    for o, p in outs:
                        self._to_stage(i + 1, o, p)
            if self.watched:
                self._observe(i, DRIVER, start, time.monotonic(), seen)
        return moved

    def _observe(self, i: int, runner: str, start: float, end: float,
                 origins: list[Origin]) -> None:
        if self.spans is not None:
            self.spans((i, start, end, len(origins)))
        if self.observer is not None:
            self.observer(StageEvent(self.lane, i, self.stages[i].name, runner, start, end,
                                     tuple(origins)))

    def _take_rows(self) -> None:
        while (row := self.combiner.pop_row()) is not None:
            self.draws_since_row = 0
            row.drops, self.pending_drops = self.pending_drops, []
            row.drop_details = [self.drop_details.pop(o, "") for o, _ in row.drops]
            if self.digests is not None:
                row.digests = [self._segment_digest(s) for s in row.segments]
                if len(self.digests) > 4 * self.budget + 1024:
                    # a document cut by the combiner (truncated) never shows its last
                    # segment: forget digests of elements the lane no longer holds
                    held = set(self.held_origins())
                    self.digests = {o: d for o, d in self.digests.items() if o in held}
            self.rows_emitted += 1
            boundary = (self.rows_emitted % self.r == 0 if self.batches is None
                        else self.batches.step_at_rows(self.rows_emitted) is not None)
            snap = self.snapshot() if boundary else None
            self.rows.append((row, snap))

    def _segment_digest(self, s: Segment) -> dict[str, str]:
        """The worker's digest of the segment's sample; made here only for payloads
        recomputed on restore (or a pipeline without transforms)."""
        try:
            last = s.end >= len(s.payload["tokens"])
        except (TypeError, KeyError, IndexError):
            last = True
        digest = self.digests.pop(s.origin, None) if last else self.digests.get(s.origin)
        if digest is None:
            digest = sample_digest(s.payload)
            if not last:
                self.digests[s.origin] = digest
        return digest

    def _in_flight(self) -> int:
        return self.transforming + sum(len(b) for b in self.inbox.values())

    def _can_pull(self) -> bool:
        if (self.source_done or self.rows_emitted >= self.want_rows
                or self._in_flight() >= self.budget):
            return False
        if self.gate is not None and not self.gate.may_draw(self.source, self.rows_emitted,
                                                            self._lowest_moving()):
            return False
        return self.backlog is None or self.backlog.admits(self.transforming,
                                                           len(self.rows) < self.r)

    def _lowest_moving(self) -> int | None:
        """The smallest trigger among elements between stages (each queue is in trigger
        order, so only heads count)."""
        gate = self.gate
        assert gate is not None
        heads = [st.inflight[0].origins[0] if st.inflight else st.waiting[0][0]
                 for st in self.t.values() if st.inflight or st.waiting]
        heads += [box[0][0] for box in self.inbox.values() if box]
        return min((gate.trigger(o) for o in heads), default=None)

    def _empty_before(self, i: int) -> bool:
        return all(
            (self.t[j].count() == 0) if j in self.t else not self.inbox[j]
            for j in range(i))

    def _submit(self, i: int, st: _TransformState) -> None:
        n = min(self.group_size, len(st.waiting))
        take = [st.waiting.popleft() for _ in range(n)]
        elements = [Element(element_key(self.seed, o), p, o) for o, p in take]
        observed = self.watched
        submitted = time.monotonic() if observed else 0.0
        group = _Group([o for o, _ in take], self.runners[i].submit(elements), submitted, observed)
        st.inflight.append(group)

    def pump(self) -> bool:
        """Move everything that can move without waiting; True if anything did."""
        moved = False
        for i in sorted(self.t, reverse=True):
            st = self.t[i]
            while st.inflight and st.inflight[0].future.done():
                group = st.inflight.popleft()
                self.transforming -= len(group.origins)
                try:
                    outs = group.future.result()
                except ZephonError:
                    raise
                except Exception as exc:
                    raise RuntimeError(f"lane {self.lane}, stage {self.stages[i].name!r}, group "
                                       f"starting at {group.origins[0].where()}: {exc}") from exc
                for o, out in zip(group.origins, outs, strict=True):
                    if isinstance(out, Digested):
                        if self.digests is not None:
                            self.digests[o] = out.digest
                        out = out.payload
                    if self.backlog is not None and i + 1 not in self.t:
                        self.backlog.track(out)
                    self._to_stage(i + 1, o, out)
                if self.watched:
                    self._observe(i, self.stages[i].runner_kind, group.submitted,
                                  group.done or time.monotonic(), group.origins)
                moved = True
        moved |= self._drain()
        while self._can_pull():
            origin = self.source.next()
            moved = True
            self.draws_since_row += 1
            if self.draws_since_row > self.stall_limit:
                raise NoRowsError(
                    f"lane {self.lane} drew {self.draws_since_row} elements since its last row "
                    f"without making one (drops so far: {self.dropped}); every element is being "
                    "dropped: check the filters and the settings of the combiner "
                    f"{self.plan.combiner.name!r} (for Pack: seq_len, limits, overlong)")
            if origin is None:
                self.source_done = True
                break
            self._to_stage(0, origin, origin.pointer)
            self._drain()
        starving = self.source_done or not self._can_pull()
        for i, st in self.t.items():
            while st.waiting and len(st.inflight) < self.prefetch and (
                    len(st.waiting) >= self.group_size or (starving and self._empty_before(i))):
                self._submit(i, st)
                moved = True
        moved |= self._drain()
        return self._flush_if_done() or moved

    def _flush_if_done(self) -> bool:
        if not self.source_done or self.finished:
            return False
        moved = False
        for s in self.stages:
            if s.kind == "transform" or s.index in self.flushed:
                continue
            if not (self._empty_before(s.index) and not self.inbox[s.index]):
                break
            self.flushed.add(s.index)
            moved = True
            if s.index == self.combiner_index:
                self.combiner.flush()
                self._take_rows()
                self.finished = True
            else:
                for o, p in self.accs[s.index].flush():
                    self._to_stage(s.index + 1, o, p)
                self._drain()
        return moved

    def head_futures(self) -> list[Future]:
        return [st.inflight[0].future for st in self.t.values() if st.inflight]

    def stop_drawing(self) -> None:
        """Draw nothing more from the source: the lane ends with what it holds (`Loader.drain`)."""
        self.source_done = True

    # --- checkpoint --------------------------------------------------------
    def _pending(self) -> dict[str, list[Origin]]:
        """Per accumulator/combiner stage: origins on their way to it, oldest first."""
        out: dict[str, list[Origin]] = {}
        start = 0
        for s in self.stages:
            if s.kind == "transform":
                continue
            origins = [o for o, _ in self.inbox[s.index]]
            for j in range(s.index - 1, start - 1, -1):
                origins += self.t[j].origins()
            out[str(self.op_of_stage[s.index])] = origins
            start = s.index + 1
        return out

    def held_origins(self) -> list[Origin]:
        """Every element drawn from the source that has not reached a row or a drop yet."""
        pending = [o for origins in self._pending().values() for o in origins]
        held = [o for acc in self.accs.values() for o in acc.held_origins()]
        return pending + held + self.combiner.held_origins()

    def snapshot(self) -> dict:
        """The lane's state now, as JSON data (`LaneSnapshot`)."""
        return LaneSnapshot(
            source=self.source.state,
            source_done=self.source_done,
            rows=self.rows_emitted,
            pending=self._pending(),
            accumulators={str(self.op_of_stage[i]): a.state() for i, a in self.accs.items()},
            combiner=self.combiner.state(),
            flushed=sorted(self.op_of_stage[i] for i in self.flushed),
            drops=list(self.pending_drops),
            dropped=self.dropped,
            drop_details=self.drop_details,
            phase_gate=self.gate.state() if self.gate is not None else None,
        ).to_json()

    def _recompute(self, origins: list[Origin], upto: int) -> list[Any]:
        fn = self.plan.prefix_fn(upto)
        if not fn.transforms:
            return [o.pointer for o in origins]
        fn.setup()
        outs = fn([Element(element_key(self.seed, o), o.pointer, o) for o in origins])
        if self.backlog is not None and upto not in self.t:
            for out in outs:
                self.backlog.track(out)
        return outs

    def restore(self, state: dict) -> None:
        """Rebuild the lane from a snapshot; payloads are recomputed from origins."""
        try:
            snap = LaneSnapshot.from_json(state)
            self.source.set_state(snap.source)
            if self.gate is not None:
                if snap.phase_gate is None:
                    raise KeyError(PHASE_GATE)
                self.gate.restore(snap.phase_gate)
            if len(self.source.state.counts) != len(self.source.orders):
                raise ValueError(f"source.counts has {len(self.source.state.counts)} entries "
                                 f"for {len(self.source.orders)} datasets")
            self.source_done = snap.source_done
            self.rows_emitted = snap.rows
            self.flushed = {self.stage_of_op[i] for i in snap.flushed}
            self.pending_drops = list(snap.drops)
            self.drop_details = dict(snap.drop_details)
            self.dropped = dict(snap.dropped)
            start = 0
            for s in self.stages:
                if s.kind == "transform":
                    continue
                key = str(self.op_of_stage[s.index])
                origins = snap.pending[key]
                entry = start if start < s.index else s.index
                for o, p in zip(origins, self._recompute(origins, entry), strict=True):
                    self._to_stage(entry, o, p)
                if s.kind == "accumulator":
                    self.accs[s.index].restore(snap.accumulators[key],
                                               lambda os_, i=s.index: self._recompute(os_, i))
                start = s.index + 1
            self.combiner.restore(snap.combiner,
                                  lambda os_: self._recompute(os_, self.combiner_index))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise CheckpointError(
                f"lane {self.lane}: the checkpoint's lane state is corrupt or truncated "
                f"({type(exc).__name__}: {exc}); restore from an intact checkpoint file") from None
        self.finished = self.combiner_index in self.flushed
        self._take_rows()
