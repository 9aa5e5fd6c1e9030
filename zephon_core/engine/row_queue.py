"""A lane's rows on their way through the row stages (`RowTransform`s after the combiner).

The combiner makes a row; the lane hands it here at once (`submit`), and it goes
to the row stages as soon as it is within the rows the loader asked the lane for
(`send_held`), so the row stages of step t+1 run while the trainer works on step
t. A row made past them (the combiner makes rows as the samples already drawn
arrive) waits here undecoded: the rows of the first step are not queued behind
the lanes' spare rows, and a row's stage output (decoded pixels) exists only for
the rows the loader will take soon. Each row is one group at each row stage's runner;
results are taken back only from the head of each stage's queue (`collect`), so
rows come out in the order they were made whatever order workers finish in.

The snapshot the lane took when it made a row rides with the row, unchanged but
for its drop counts: a row stage may record drops of its row's own samples
(`Row.drops`), and the counts in a snapshot must be those of an uninterrupted
run at every `D`, runner and timing. So the drops the row stages record are
counted apart, in row order, and a row's snapshot gets those of every row up to
it (`_finish`): rows finish in order, so that is the count when it finishes. On
restore the lane's counts start from the snapshot's (which hold them), and this
count starts at zero again.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future
from typing import Any, NamedTuple

from zephon_core.engine.lane_hooks import LaneHooks
from zephon_core.engine.lane_queues import Group, element_key
from zephon_core.engine.plan import Plan
from zephon_core.engine.runner_base import Runner
from zephon_core.engine.snapshot import DROPPED
from zephon_core.errors import ZephonError
from zephon_core.ops.contract import Row
from zephon_core.ops.row_transform import row_layout
from zephon_core.records import Element, drop_detail

#: the answer of a row whose part was None: it passes the stage unchanged
_PASS = object()


class _InFlight(NamedTuple):
    made: Row  #: the row as the combiner made it (for `leftover` and the layout check)
    given: Row  #: the row as this stage got it (what its answer finishes)
    snapshot: dict | None
    group: Group


class RowQueue:
    """Rows made and not yet taken: in flight at the row stages, then ready, in order.

    Without row stages a row is ready as soon as it is made.
    """

    def __init__(self, plan: Plan, lane: int, seed: int, runners: dict[int, Runner],
                 hooks: LaneHooks) -> None:
        self.lane = lane
        self._seed = seed
        self._stages = plan.row_stages
        #: each row stage's operators: the lane sends a row's part and finishes the answer
        self._fns = [plan.row_stage_fn(s) for s in self._stages]
        self._runners = runners
        self._hooks = hooks
        self._queues: list[deque[_InFlight]] = [deque() for _ in self._stages]
        #: rows made past those the loader asked for, not yet sent, with their snapshots
        self._held: deque[tuple[Row, dict | None]] = deque()
        #: finished rows with the snapshot after each (None where no step ends)
        self.ready: deque[tuple[Row, dict | None]] = deque()
        #: drops the row stages recorded since the lane started or restored, by reason
        self.late: dict[str, int] = {}

    def in_flight(self) -> int:
        """Rows at the row stages or waiting to be sent there."""
        return sum(len(q) for q in self._queues) + len(self._held)

    @property
    def held(self) -> int:
        """Rows made and not yet sent to the row stages."""
        return len(self._held)

    def made(self) -> int:
        """Rows made and not yet taken: ready or in flight."""
        return len(self.ready) + self.in_flight()

    def rows(self) -> list[Row]:
        """Every row not yet taken, in order: ready ones, then in-flight ones as made."""
        return [r for r, _ in self.ready] + [e.made for q in reversed(self._queues)
                                             for e in q] + [r for r, _ in self._held]

    def head_futures(self) -> list[Future]:
        """The oldest row in flight at each row stage."""
        return [q[0].group.future for q in self._queues if q]

    def submit(self, row: Row, snapshot: dict | None) -> None:
        """A row the combiner made, with the snapshot after it (held until `send_held`)."""
        if not self._stages:
            self.ready.append((row, snapshot))
            return
        self._held.append((row, snapshot))

    def send_held(self, n: int) -> None:
        """Send up to `n` held rows, oldest first, to the first row stage."""
        for _ in range(min(n, len(self._held))):
            row, snapshot = self._held.popleft()
            self._send(0, row, row, snapshot)

    def _send(self, k: int, row: Row, made: Row, snapshot: dict | None) -> None:
        first = made.segments[0].origin if made.segments else None
        key = element_key(self._seed, first) if first is not None else 0
        observed = self._hooks.watched
        part = self._fns[k].part(row)
        if part is None:  # nothing to do for this row: it passes the stage in its turn
            future: Future = Future()
            future.set_result([_PASS])
        else:
            future = self._runners[self._stages[k].index].submit([Element(key, part, first)])
        group = Group([s.origin for s in made.segments], future,
                      time.monotonic() if observed else 0.0, observed)
        self._queues[k].append(_InFlight(made, row, snapshot, group))

    def collect(self) -> bool:
        """Take finished rows off the head of each row stage (last stage first) and pass
        them on in order; True if any was taken."""
        moved = False
        for k in range(len(self._queues) - 1, -1, -1):
            q, stage = self._queues[k], self._stages[k]
            while q and q[0].group.future.done():
                entry = q.popleft()
                out = self._result(k, entry)
                if self._hooks.watched:
                    g = entry.group
                    self._hooks.stage_done(self.lane, stage.index, stage.name,
                                           stage.runner_kind, g.submitted,
                                           g.done or time.monotonic(), g.origins)
                if k + 1 < len(self._queues):
                    self._send(k + 1, out, entry.made, entry.snapshot)
                else:
                    self._finish(out, entry)
                moved = True
        return moved

    def _result(self, k: int, entry: _InFlight) -> Row:
        """Stage `k`'s row, checked: the same segments in the same order, and the drops it
        adds name samples of the row."""
        stage = self._stages[k].name
        where = (entry.made.segments[0].origin.where() if entry.made.segments else "an empty "
                 "row")
        try:
            (answer,) = entry.group.future.result()
            out = entry.given if answer is _PASS else self._fns[k].finish(entry.given, answer)
        except ZephonError:
            raise
        except Exception as exc:
            raise RuntimeError(f"lane {self.lane}, row stage {stage!r}, row starting at "
                               f"{where}: {exc}") from exc
        made = entry.made
        if not isinstance(out, Row) or row_layout(out) != row_layout(made) \
                or out.drops[:len(made.drops)] != made.drops:
            raise RuntimeError(f"lane {self.lane}, row stage {stage!r}, row starting at "
                               f"{where}: a row transform must return the row's segments and "
                               "drops unchanged (it may change payloads and add drops)")
        mine = {s.origin for s in made.segments}
        if any(o not in mine for o, _ in out.drops[len(made.drops):]):
            raise RuntimeError(f"lane {self.lane}, row stage {stage!r}, row starting at "
                               f"{where}: a row transform may drop only its row's samples")
        return out

    def _finish(self, out: Row, entry: _InFlight) -> None:
        made = len(entry.made.drops)
        for _, reason in out.drops[made:]:
            self.late[reason] = self.late.get(reason, 0) + 1
        details = [*out.drop_details, *[""] * (len(out.drops) - len(out.drop_details))]
        out.drop_details = details[:made] + [drop_detail(d) for d in details[made:]]
        snap = entry.snapshot
        if snap is not None and self.late:
            counts: dict[str, Any] = dict(snap[DROPPED])
            for reason, n in self.late.items():
                counts[reason] = counts.get(reason, 0) + n
            snap = {**snap, DROPPED: dict(sorted(counts.items()))}
        self.ready.append((out, snap))
