"""Stage observers: where a lane's work happens and how long it takes, read-only.

An observer is any callable that takes a `StageEvent` (pass it as
`Loader(..., observer=...)`). The lanes call it in the thread that runs them
(the caller's, or the driver thread with ``background=True``), after they
have used the results the event describes, and give it only counts, times
and origins, never payloads: an observer cannot change a batch, only slow
the loader by its own cost. An exception it raises stops the loader like any
other error. Inside a lane an observer is a lane hook (`ObserverHook`), as is
the metrics' span log (`SpanHook`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from zephon_core.engine.lane_hooks import LaneHook
from zephon_core.records import Origin

DRIVER = "driver"

#: one observed group as the metrics keep it: (stage index, start, end, elements)
Span = tuple[int, float, float, int]


class StageEvent(NamedTuple):
    """One group of elements through one stage of one lane.

    For a transform stage, a group is what the lane submitted to the stage's
    runner at once: `start` is its submission and `end` the moment its results
    were ready, so the span includes waiting in the runner's queue. For an
    accumulator or the combiner, a group is the elements the driver pushed
    into it in one go, and the span is the driver's time on them (rows taken
    and snapshots included). Times are `time.monotonic()` seconds.

    A named tuple, not a dataclass: the lanes make one per group (hundreds per
    step), and a frozen dataclass costs three times as much to build
    (docs/observability.md, "What metrics cost").
    """

    lane: int
    stage: int  #: index in `Plan.stages`
    name: str  #: the stage's name (fused operators joined by "+")
    runner: str  #: "inline", "threads" or "processes"; "driver" for stateful stages
    start: float
    end: float
    origins: tuple[Origin, ...]  #: the group's elements, dropped ones included

    @property
    def elements(self) -> int:
        return len(self.origins)

    @property
    def seconds(self) -> float:
        return self.end - self.start


StageObserver = Callable[[StageEvent], None]


class ObserverHook(LaneHook):
    """Gives a `StageObserver` a `StageEvent` for every group through every stage."""

    watches = True

    def __init__(self, observer: StageObserver) -> None:
        self._observer = observer

    def stage_done(self, lane: int, stage: int, name: str, runner: str, start: float,
                   end: float, origins: list[Origin]) -> None:
        self._observer(StageEvent(lane, stage, name, runner, start, end, tuple(origins)))


class SpanHook(LaneHook):
    """Gives the metrics' event log a `Span` per group: cheaper than a `StageEvent`."""

    watches = True

    def __init__(self, spans: Callable[[Span], None]) -> None:
        self._spans = spans

    def stage_done(self, lane: int, stage: int, name: str, runner: str, start: float,
                   end: float, origins: list[Origin]) -> None:
        self._spans((stage, start, end, len(origins)))


@dataclass
class StageTotals:
    """What a `StageStats` counted for one stage, over all lanes."""

    name: str
    runner: str
    groups: int = 0
    elements: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        if not self.groups:
            return "observed: nothing yet"
        if self.runner == DRIVER:
            return (f"observed: {self.elements} elements in {self.groups} groups, "
                    f"{self.seconds:.3f} s of driver time")
        return (f"observed: {self.elements} elements in {self.groups} groups, "
                f"{1000 * self.seconds / self.groups:.1f} ms per group from submission to result")


class StageStats:
    """An observer that totals groups, elements and seconds per stage.

    `Loader.explain(stats)` prints them beside the plan. Safe to read from
    another thread while a background loader runs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[int, StageTotals] = {}

    def __call__(self, event: StageEvent) -> None:
        with self._lock:
            t = self._totals.get(event.stage)
            if t is None:
                t = self._totals[event.stage] = StageTotals(event.name, event.runner)
            t.groups += 1
            t.elements += event.elements
            t.seconds += event.seconds

    def totals(self) -> dict[int, StageTotals]:
        """A copy of the totals so far, by stage index."""
        with self._lock:
            return {i: StageTotals(t.name, t.runner, t.groups, t.elements, t.seconds)
                    for i, t in self._totals.items()}
