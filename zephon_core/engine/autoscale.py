"""`Execution(workers="auto")`: a rank's worker budget split over its process stages by
what each is measured to cost, and split again when the mix of samples changes.

The costs are the stage observer's: each stage's busy worker-seconds over a
window (`MetricsRecorder.stage_metrics`, the numbers `Loader.metrics()` and
`zephon-vl profile` report). In a chain every stage handles the same samples,
so a stage's busy seconds over the window are its cost per sample times the
samples that went through, whether or not it was the bottleneck: splitting
the workers in proportion to them gives every stage the same time per sample,
the best split for that window's mix.

Limits: at least one worker per stage; the workers of all sized stages
together never exceed the budget (unless there are more stages than that);
a new split is applied only when it shortens the slowest stage's time per
sample by `AUTO_GAIN`, and the window after a change (workers starting) is
not measured, so noise and start-up never make it thrash.

Only the worker count changes, never a group or its order: the lanes consume
every stage's results in submission order (`engine/runners.py`), so a batch
is the same under any split, fixed or auto.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from zephon_core.engine.kinds import Resizable, RunnerKind

log = logging.getLogger(__name__)

#: seconds of observation behind one decision
AUTO_WINDOW_S = 2.0
#: a window is used only when every sized stage finished this many groups in it
AUTO_MIN_GROUPS = 4
#: a new split must cut the slowest stage's time per sample by at least this share
AUTO_GAIN = 0.15
#: weight of the newest window in the running cost estimate (the rest: the older ones)
AUTO_SMOOTHING = 0.5


def split_workers(weights: Mapping[str, float], cores: int) -> dict[str, int]:
    """`cores` workers in proportion to `weights`, at least one each: a stage whose share
    is under one gets one and the others share the rest, again by weight; what flooring
    leaves goes to the largest remainders. Equal shares when no weight is positive."""
    if not weights:
        return {}
    cores = max(cores, len(weights))
    w = {k: max(0.0, v) for k, v in weights.items()}
    if not sum(w.values()) > 0:
        w = dict.fromkeys(w, 1.0)
    pinned: set[str] = set()
    while True:  # ends: the free stages' mean share is >= 1, so one always stays free
        free = [k for k in w if k not in pinned]
        room, total = cores - len(pinned), sum(w[k] for k in free)
        share = {k: room * w[k] / total if total > 0 else room / len(free) for k in free}
        low = {k for k, x in share.items() if x < 1}
        if not low:
            break
        pinned |= low
    split = dict.fromkeys(pinned, 1) | {k: math.floor(x) for k, x in share.items()}
    left = cores - sum(split.values())
    for k in sorted(share, key=lambda k: share[k] - math.floor(share[k]), reverse=True)[:left]:
        split[k] += 1
    return split


def slowest_time(costs: Mapping[str, float], split: Mapping[str, int]) -> float:
    """The time per unit of work of the slowest stage: max over stages of cost / workers."""
    return max((c / split[k] for k, c in costs.items()), default=0.0)


class AutoWorkers:
    """Sizes one loader's process stages; `after_step` is called with each delivered step.

    `stages`: ``{stage index: runner}`` of the stages to size (their runners
    have ``resize``); `recorder`: the loader's `MetricsRecorder`; `budget`:
    the workers of all of them together. `changes` lists ``(step, {stage
    name: workers})`` for every split applied, the first one included.
    """

    def __init__(self, stages: Mapping[int, Any], names: Mapping[int, str], recorder: Any,
                 budget: int, on_change: Any = None) -> None:
        self.runners = dict(stages)
        self.names = dict(names)
        self.recorder = recorder
        self.budget = budget
        self.on_change = on_change
        self.split = {i: int(r.workers) for i, r in self.runners.items()}
        self.costs: dict[int, float] = {}
        self.changes: list[tuple[int, dict[str, int]]] = [(0, self._named(self.split))]
        self._lo: float | None = None
        self._cursor = 0
        self._settling = False

    def _named(self, split: Mapping[int, int]) -> dict[str, int]:
        return {self.names[i]: n for i, n in split.items()}

    def after_step(self, step: int, now: float) -> None:
        """Step `step` was delivered at `now`; decide when a window is complete. The first
        step (workers starting) only opens the first window."""
        if self._lo is None or step < 1:
            self._lo, self._cursor = now, self.recorder.events.cursor()
            return
        if now - self._lo < AUTO_WINDOW_S:
            return
        events, self._cursor = self.recorder.events.since(self._cursor)
        metrics = self.recorder.stage_metrics(events, self._lo, now)
        self._lo = now
        if self._settling:  # the window of a change: new workers were starting
            self._settling = False
            return
        if any(metrics[i].groups < AUTO_MIN_GROUPS for i in self.runners):
            return
        for i in self.runners:
            new = metrics[i].busy_s
            old = self.costs.get(i)
            self.costs[i] = new if old is None else \
                AUTO_SMOOTHING * new + (1 - AUTO_SMOOTHING) * old
        self.decide(step)

    def decide(self, step: int) -> bool:
        """Apply the split the current costs ask for, if it is worth a change."""
        costs = {str(i): c for i, c in self.costs.items()}
        target = {int(k): n for k, n in split_workers(costs, self.budget).items()}
        if target == self.split:
            return False
        now_t = slowest_time(costs, {str(i): n for i, n in self.split.items()})
        new_t = slowest_time(costs, {str(i): n for i, n in target.items()})
        if not new_t < (1 - AUTO_GAIN) * now_t:
            return False
        for i, n in target.items():
            if n != self.split[i]:
                self.runners[i].resize(n)
                if self.on_change is not None:
                    self.on_change(i, n)
        log.info("zephon: workers=auto at step %d: %s -> %s (busy seconds per window: %s)",
                 step, self._named(self.split), self._named(target),
                 {self.names[i]: round(c, 3) for i, c in self.costs.items()})
        self.split = target
        self.changes.append((step, self._named(target)))
        self._settling = True
        return True


def sizer_for(execution: Any, plan: Any, runners: Mapping[int, Any],
              recorder: Any) -> AutoWorkers | None:
    """The sizer of a loader's `plan` and `runners`, or None when `execution` does not ask
    for one or the plan has no process stage to size."""
    if not execution.auto_workers:
        return None
    stages = {s.index: runners[s.index] for s in plan.stages
              if s.runner_kind is RunnerKind.PROCESSES
              and isinstance(runners.get(s.index), Resizable)}
    if not stages:
        return None
    by_index = {s.index: s for s in plan.stages}

    def changed(i: int, n: int) -> None:
        recorder.set_workers(i, n)
        by_index[i].workers = n

    return AutoWorkers(stages, {i: by_index[i].name for i in stages}, recorder,
                       execution.worker_budget(), changed)
