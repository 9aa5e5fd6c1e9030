"""A lane's queues: where every element it drew is between the source and a row.

`LaneQueues` holds, per stage of the plan, the elements waiting for it and
(for a transform) the groups in flight at its runner, plus the per-lane
accumulators and the combiner. `engine.lane.LaneRun` moves elements between
these queues; this module only says where they are: what waits before a
stage, what is on its way to each stateful operator (the snapshot's
``pending``), what the lane still holds, and which futures to wait on.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from zephon_core.common.hashing import derive, derive_from
from zephon_core.engine.kinds import StageKind
from zephon_core.engine.lane_hooks import LaneHooks
from zephon_core.engine.plan import SMALL_OUTPUT_BYTES, Plan, sample_cap
from zephon_core.engine.runner_base import Runner
from zephon_core.engine.snapshot import LaneSnapshot
from zephon_core.errors import ZephonError
from zephon_core.ops.contract import Accumulator, Combiner, Digested, Row
from zephon_core.records import Dropped, Element, Origin, drop_detail

_KEY_SALT = 0x454C454D

#: CPU seconds of work per group while warming (a group costs 1-2 ms to move: photos in
#: groups of one came 0.4 s later) and after (a lane keeps `prefetch` groups in flight:
#: whole groups of clips held 550 MB of frames for rows wanted steps later)
WARM_GROUP_CPU_S, GROUP_CPU_S = 0.02, 0.1
#: the stages with per-lane state and an inbox (row stages come after the combiner and
#: have their own queue: `engine.row_queue`)
_STATEFUL = (StageKind.ACCUMULATOR, StageKind.COMBINER)


def payload_tokens(payload: Any) -> int:
    """Tokens a payload brings to the combiner (``mix_by = "tokens"`` counts these)."""
    tokens = payload.get("tokens") if isinstance(payload, dict) else None
    return len(tokens) if tokens is not None else 0


def element_key(seed: int, o: Origin) -> int:
    """Per-element randomness key: depends on the sample and epoch, not on lane or grouping."""
    return derive(seed, _KEY_SALT, o.dataset, o.shard, o.index, o.epoch)


def element_keys(seed: int) -> Callable[[Origin], int]:
    """`element_key` with `seed` bound: the seed and salt are hashed once, not per element
    (`derive_from`); the same keys."""
    start = derive(seed, _KEY_SALT)
    return lambda o: derive_from(start, o.dataset, o.shard, o.index, o.epoch)


class Group:
    """A group submitted to a stage's runner; when watched, `done` is when its future
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


def output_bytes(payload: Any) -> int:
    """Bytes of the arrays, bytes and text in `payload` (dicts, lists, tuples and
    dataclasses of them; a drop or a number: 0). Anything else (a tensor, an object of
    the user's) might hold anything: counted as larger than small."""
    if isinstance(payload, Digested):
        payload = payload.payload
    if isinstance(payload, (np.ndarray, memoryview)):
        return payload.nbytes
    if isinstance(payload, (bytes, bytearray, str)):
        return len(payload)
    if isinstance(payload, dict):
        return sum(output_bytes(v) for v in payload.values())
    if isinstance(payload, (list, tuple)):
        if payload and type(payload[0]) is int:  # token ids as a list: no walk per id
            return 8 * len(payload)
        return sum(output_bytes(v) for v in payload)
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        return sum(output_bytes(getattr(payload, f.name)) for f in dataclasses.fields(payload))
    if payload is None or isinstance(payload, (int, float, np.generic, Dropped)):
        return 0
    return SMALL_OUTPUT_BYTES + 1


class TransformQueue:
    """A transform stage's elements: waiting to be sent, then in flight, oldest first; and
    whether all it put out so far was small (None: nothing yet)."""

    __slots__ = ("waiting", "inflight", "small")

    def __init__(self) -> None:
        self.waiting: deque[tuple[Origin, Any]] = deque()
        self.inflight: deque[Group] = deque()
        self.small: bool | None = None

    def saw(self, outs: list[Any]) -> bool:
        """Note a group's outputs; True if that changed `small`. Once one output is
        large the stage is large for good, and nothing more is measured."""
        if self.small is False:
            return False
        small = all(output_bytes(out) <= SMALL_OUTPUT_BYTES for out in outs)
        changed = small is not self.small
        self.small = small
        return changed

    def count(self) -> int:
        return len(self.waiting) + sum(len(g.origins) for g in self.inflight)

    def origins(self) -> list[Origin]:
        """Oldest first: submitted groups, then not yet submitted."""
        return [o for g in self.inflight for o in g.origins] + [o for o, _ in self.waiting]

    def head(self) -> Origin:
        """The oldest element (the queue is not empty)."""
        return self.inflight[0].origins[0] if self.inflight else self.waiting[0][0]


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


class LaneDrops:
    """The drops a lane decided and no row carries yet, their details, and counts by reason.

    Exactly once: a drop rides on the next row the lane makes (`on_row`), or is in the
    snapshot until then; the `hooks` hear of each one (the stall guard counts them).
    """

    def __init__(self, hooks: LaneHooks) -> None:
        self._hooks = hooks
        self.pending: list[tuple[Origin, str]] = []
        #: the detail of a pending drop, by origin (`drop_detail`; the ledger shows it)
        self.details: dict[Origin, str] = {}
        #: drops so far, by reason
        self.counts: dict[str, int] = {}

    def record(self, origin: Origin, reason: str, detail: str = "") -> None:
        self.pending.append((origin, reason))
        if detail:
            self.details[origin] = drop_detail(detail)
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self._hooks.dropped(origin, reason)

    def on_row(self, row: Row) -> None:
        """The pending drops ride on `row`, with their details."""
        row.drops, self.pending = self.pending, []
        row.drop_details = [self.details.pop(o, "") for o, _ in row.drops]

    def restore(self, snap: LaneSnapshot) -> None:
        self.pending = list(snap.drops)
        self.details = dict(snap.drop_details)
        self.counts = dict(snap.dropped)


class LaneQueues:
    """Per stage: a `TransformQueue`, or an inbox before an accumulator or the combiner;
    the lane's accumulators and combiner. The transform side lives here too: sending
    groups to the stages' runners and taking their results back in submission order
    (`submit`, `collect`), and recomputing payloads on restore (`refill`); the lane's
    `hooks` see what comes back.

    A snapshot names stateful stages by their operator's position in the recipe
    (`position`), not by stage number: fusing transforms is an execution choice, so stage
    numbers differ between executions while operator positions never do.
    """

    def __init__(self, plan: Plan, lane: int, seed: int, runners: dict[int, Runner],
                 hooks: LaneHooks) -> None:
        self.lane = lane
        self._plan = plan
        self._seed = seed
        self._key = element_keys(seed)
        self._runners = runners
        self._hooks = hooks
        self.stages = plan.stages
        self.t = {s.index: TransformQueue() for s in self.stages
                  if s.kind is StageKind.TRANSFORM}
        self.inbox: dict[int, deque[tuple[Origin, Any]]] = {
            s.index: deque() for s in self.stages if s.kind in _STATEFUL}
        self.op_of_stage = {s.index: plan.ops.index(s.ops[0]) for s in self.stages
                            if s.kind in _STATEFUL}
        self.stage_of_op = {op: stage for stage, op in self.op_of_stage.items()}
        self.accs: dict[int, Accumulator] = {
            s.index: s.ops[0].make(lane, seed) for s in self.stages
            if s.kind is StageKind.ACCUMULATOR}
        self.combiner_index = plan.combiner_index
        self.combiner: Combiner = plan.combiner.make(lane, seed)
        #: elements waiting for or inside a transform stage (not yet finished documents),
        #: counted as they move: the backlog sums it over the lanes before every draw
        self.transforming = 0
        #: the most elements the lane may hold in transforms and inboxes (`in_flight`)
        self.budget = 0
        self._update_budget()

    def position(self, i: int) -> str:
        """Stateful stage `i` as the snapshot names it: its operator's position."""
        return str(self.op_of_stage[i])

    def to_stage(self, i: int, origin: Origin, payload: Any) -> None:
        """Append to stage `i`'s queue: queues are FIFO, so each stage sees the lane's
        element order."""
        if i in self.t:
            self.t[i].waiting.append((origin, payload))
            self.transforming += 1
        else:
            self.inbox[i].append((origin, payload))

    def in_flight(self) -> int:
        """Elements between the source and an accumulator's or the combiner's push."""
        return self.transforming + sum(len(b) for b in self.inbox.values())

    def empty_before(self, i: int) -> bool:
        """Nothing waits in or before stage `i`: what it holds is all it will get for now."""
        return all(
            (self.t[j].count() == 0) if j in self.t else not self.inbox[j]
            for j in range(i))

    def moving_heads(self) -> list[Origin]:
        """The oldest element of each queue between stages."""
        heads = [st.head() for st in self.t.values() if st.inflight or st.waiting]
        return heads + [box[0][0] for box in self.inbox.values() if box]

    def head_futures(self) -> list[Future]:
        """The oldest group in flight at each transform stage."""
        return [st.inflight[0].future for st in self.t.values() if st.inflight]

    def pending(self) -> dict[str, list[Origin]]:
        """Per accumulator/combiner position: origins on their way to it, oldest first."""
        out: dict[str, list[Origin]] = {}
        start = 0
        for s in self.stages:
            if s.kind not in _STATEFUL:
                continue
            origins = [o for o, _ in self.inbox[s.index]]
            for j in range(s.index - 1, start - 1, -1):
                origins += self.t[j].origins()
            out[self.position(s.index)] = origins
            start = s.index + 1
        return out

    def held_origins(self) -> list[Origin]:
        """Every element drawn from the source that has not reached a row or a drop yet."""
        pending = [o for origins in self.pending().values() for o in origins]
        held = [o for acc in self.accs.values() for o in acc.held_origins()]
        return pending + held + self.combiner.held_origins()

    # --- the transform side ------------------------------------------------
    def _update_budget(self) -> None:
        """`prefetch` groups in flight per stage, at the smallest stage's sample cap (a
        lane with no transform stage: `prefetch` groups of the cap for large outputs)."""
        ex = self._plan.execution
        cap = min((sample_cap(ex, bool(st.small)) for st in self.t.values()),
                  default=sample_cap(ex, small=False))
        self.budget = self._plan.prefetch * cap

    def group_size(self, i: int, warming: bool) -> int:
        """At most `sample_cap` samples, about `GROUP_CPU_S` (warming: `WARM_...`) of CPU."""
        per = self._runners[i].cpu_per_element()
        group_size = sample_cap(self._plan.execution, bool(self.t[i].small))
        if per is None:
            return 1 if warming else group_size
        target = WARM_GROUP_CPU_S if warming else GROUP_CPU_S
        return max(1, min(group_size, int(target / max(per, 1e-9))))

    def send(self, warming: bool, starving: bool) -> bool:
        """Send full groups to each transform stage's runner, up to `prefetch` in flight;
        `starving` (the source ended, or the lane may not draw now): part groups too, once
        nothing waits before the stage. True if any was sent."""
        sent = False
        for i, st in self.t.items():
            size = self.group_size(i, warming)
            while st.waiting and len(st.inflight) < self._plan.prefetch and (
                    len(st.waiting) >= size or (starving and self.empty_before(i))):
                self.submit(st, i, size)
                sent = True
        return sent

    def submit(self, st: TransformQueue, i: int, size: int) -> None:
        """Send the oldest waiting elements (up to `size`) to stage `i`'s runner. Each
        element's randomness key comes from its origin, never from the grouping."""
        n = min(size, len(st.waiting))
        take = [st.waiting.popleft() for _ in range(n)]
        elements = [Element(self._key(o), p, o) for o, p in take]
        observed = self._hooks.watched
        submitted = time.monotonic() if observed else 0.0
        group = Group([o for o, _ in take], self._runners[i].submit(elements), submitted,
                      observed)
        st.inflight.append(group)

    def collect(self) -> bool:
        """Take finished groups off the head of each transform stage (last stage first) and
        pass their outputs on in submission order; True if any was taken. A worker's error
        stops the run naming the group's first sample; its digests go to the hooks."""
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
                    raise RuntimeError(f"lane {self.lane}, stage {self.stages[i].name!r}, "
                                       f"group starting at {group.origins[0].where()}: "
                                       f"{exc}") from exc
                if self._plan.execution.group_size is None and st.saw(outs):
                    self._update_budget()  # a size the user set is kept: nothing to measure
                for o, out in zip(group.origins, outs, strict=True):
                    if isinstance(out, Digested):
                        self._hooks.digest(o, out.digest)
                        out = out.payload
                    if i + 1 not in self.t:
                        self._hooks.document(o, out)
                    self.to_stage(i + 1, o, out)
                if self._hooks.watched:
                    self.observe(i, self.stages[i].runner_kind, group.submitted,
                                 group.done or time.monotonic(), group.origins)
                moved = True
        return moved

    def observe(self, i: int, runner: str, start: float, end: float,
                origins: list[Origin]) -> None:
        """A group went through stage `i`: tell the hooks that watch."""
        self._hooks.stage_done(self.lane, i, self.stages[i].name, runner, start, end, origins)

    # --- restore -----------------------------------------------------------
    def recompute(self, origins: list[Origin], upto: int) -> list[Any]:
        """Payloads of `origins` as they reach stage `upto` (the hooks see each finished
        document, as when it came from a worker)."""
        fn = self._plan.prefix_fn(upto)
        if not fn.transforms:
            return [o.pointer for o in origins]
        fn.setup()
        outs = fn([Element(element_key(self._seed, o), o.pointer, o) for o in origins])
        if upto not in self.t:
            for o, out in zip(origins, outs, strict=True):
                self._hooks.document(o, out)
        return outs

    def refill(self, snap: LaneSnapshot) -> None:
        """Put the snapshot's pending elements back on their way, recomputed up to where
        they were, and restore each stateful operator."""
        start = 0
        for s in self.stages:
            if s.kind not in _STATEFUL:
                continue
            key = self.position(s.index)
            origins = snap.pending[key]
            entry = start if start < s.index else s.index
            for o, p in zip(origins, self.recompute(origins, entry), strict=True):
                self.to_stage(entry, o, p)
            if s.kind is StageKind.ACCUMULATOR:
                self.accs[s.index].restore(snap.accumulators[key],
                                           lambda os_, i=s.index: self.recompute(os_, i))
            start = s.index + 1
        self.combiner.restore(snap.combiner,
                              lambda os_: self.recompute(os_, self.combiner_index))
