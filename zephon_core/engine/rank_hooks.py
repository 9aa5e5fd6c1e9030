"""The hooks a rank's loader gives each of its lanes, in the order the lanes call them.

A lane's optional concerns are hooks (`engine.lane_hooks`); which of them a
lane has depends on the run (a mixture schedule, a ledger, metrics, an
observer, the caller's own), so the loader says it once here rather than in
the lane's loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from zephon_core.engine.backlog import Backlog
from zephon_core.engine.digest_book import DigestBook
from zephon_core.engine.lane_hooks import LaneHook
from zephon_core.engine.observe import ObserverHook, Span, SpanHook, StageObserver
from zephon_core.engine.phases import PhaseGate

#: the caller's own hooks for one lane, by its number (`Loader(lane_hooks=...)`)
LaneHookFactory = Callable[[int], Iterable[LaneHook]]


@dataclass
class RankHooks:
    """What every lane of a rank shares or gets one of."""

    #: the rank's finished documents (one for all its lanes)
    backlog: Backlog
    #: with a ledger: the lane's in-flight bound, which sizes its digest book (None: none)
    digest_budget: int | None = None
    #: the metrics' span log (None: stages unobserved)
    spans: Callable[[Span], None] | None = None
    observer: StageObserver | None = None
    extra: LaneHookFactory | None = None

    def for_lane(self, lane: int, gate: PhaseGate | None) -> list[LaneHook]:
        """Lane `lane`'s hooks: its phase gate first (it decides draws in lane order), the
        backlog, the digest book, the span log, the observer, then the caller's."""
        hooks: list[LaneHook] = [] if gate is None else [gate]
        hooks.append(self.backlog)
        if self.digest_budget is not None:
            hooks.append(DigestBook(self.digest_budget))
        if self.spans is not None:
            hooks.append(SpanHook(self.spans))
        if self.observer is not None:
            hooks.append(ObserverHook(self.observer))
        return hooks + list(self.extra(lane) if self.extra is not None else ())
