"""The lane's optional concerns as hooks: one protocol, one dispatcher.

`engine.lane.LaneRun` is a queue machine: it draws, moves elements through
its stages in the lane's order, makes rows and snapshots them. Everything
else a lane may have to do -- wait for a mixture's next phase
(`engine.phases.PhaseGate`), hold back while the rank's finished documents
are over their bound (`engine.backlog.Backlog`), keep the workers' sample
digests for the ledger (`engine.digest_book.DigestBook`), stop a lane that
only drops (`engine.stall.StallGuard`), tell observers where the time goes
(`engine.observe`) -- is a `LaneHook`: it is told what happened at fixed
points of the lane's loop and may veto a draw. A new concern is a new hook,
not a new branch in the loop.

Every event comes in the lane's element order, in the lane's thread, so a
hook that decides something (the phase gate, the stall guard) decides it
the same way at every `D`, runner and timing. Hooks are called in the order
the lane was given them.

A hook with per-lane state names its slice of the lane snapshot
(`state_key`) and gives it as JSON data (`state`, `restore`): the key sits
beside the code that reads it, and the lane saves and restores every slice
the same way. A slice comes back from a file that may be damaged or edited,
so the hook checks it (`check_state`) before anything is restored: a restore
refuses a missing or bad slice naming its key and what is wrong, and no hook
restores unless every hook's slice passed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from zephon_core.errors import CheckpointError
from zephon_core.ops.contract import Row
from zephon_core.records import Origin


class LaneView(Protocol):
    """What a hook may read of its lane (never write): counts and origins, no payloads."""

    #: the lane's number
    lane: int

    @property
    def rows_made(self) -> int:
        """Rows the lane has made so far (restores included)."""
        ...

    @property
    def transforming(self) -> int:
        """Elements waiting for or inside a transform stage."""
        ...

    @property
    def dropped(self) -> Mapping[str, int]:
        """The lane's drops so far, by reason."""
        ...

    def needy(self) -> bool:
        """The next step still waits for this lane's rows."""
        ...

    def moving_heads(self) -> list[Origin]:
        """The oldest element of each queue between stages (each queue is in lane order)."""
        ...

    def held_origins(self) -> list[Origin]:
        """Every element drawn that has not reached a row or a drop yet."""
        ...


class LaneHook:
    """One optional concern of a lane. Every method is a no-op here: a hook overrides only
    the events it cares about (in its class), and the lane calls only those (`LaneHooks`).

    Events, in the order a lane meets them for one element: `may_draw` (before each
    draw; False: not now), `drew`, `digest` and `document` (a transform's output),
    `cut` and `released` (around an accumulator's push), `reached_combiner`, then
    `took` or `refused`, `dropped` (any drop the lane records), `row` (a row made, before
    its snapshot), and `stage_done` (a group through a stage, for hooks that `watches`).
    """

    #: the hook's slice of the lane snapshot (None: it keeps no state across a restore)
    state_key: str | None = None
    #: the hook wants `stage_done` (the lane reads the clock only when one does)
    watches: bool = False

    def may_draw(self, lane: LaneView) -> bool:
        """May the lane draw its next element now? Deciding *when*, never *what*: the
        lane's stream is its source's order whatever the answer."""
        return True

    def drew(self, lane: LaneView) -> None:
        """The lane drew (also the draw that found the source's end)."""

    def digest(self, origin: Origin, digest: dict[str, str]) -> None:
        """A worker's digest of a finished element (`Plan.digests`)."""

    def document(self, origin: Origin, payload: Any) -> None:
        """A payload left its last transform for an accumulator or the combiner (and each
        payload recomputed there on restore)."""

    def cut(self, position: str, pushed: Origin, acc: Any) -> list[tuple[Origin, Any]]:
        """What accumulator `position` must release before it takes `pushed` (it goes on
        first, in order); `acc` is the accumulator."""
        return []

    def released(self, pushed: Origin, outs: list[tuple[Origin, Any]]) -> None:
        """An accumulator took `pushed` and released `outs`."""

    def reached_combiner(self, lane: LaneView, origin: Origin, tokens: int) -> None:
        """An element reached the combiner (`tokens` it brings; 0 for a drop)."""

    def took(self, origin: Origin) -> None:
        """The combiner took the element."""

    def refused(self, origin: Origin) -> None:
        """The combiner refused the element (the lane records it as a drop next)."""

    def dropped(self, origin: Origin, reason: str) -> None:
        """The lane recorded a drop."""

    def row(self, lane: LaneView, row: Row) -> None:
        """The lane made `row` (a hook may annotate it: the digest book sets its digests)."""

    def stage_done(self, lane: int, stage: int, name: str, runner: str, start: float,
                   end: float, origins: list[Origin]) -> None:
        """A group went through stage `stage` (see `engine.observe.StageEvent`)."""

    def state(self) -> Any:
        """The hook's slice of the snapshot, as JSON data (with a `state_key`)."""
        return None

    def check_state(self, state: Any) -> None:
        """Refuse a slice `restore` could not continue from exactly: raise `ValueError`
        saying what is wrong with it (the lane adds which lane and which key). Called for
        every hook with state before any hook restores; a slice that passes must restore
        without an error. A hook with state implements it."""

    def restore(self, state: Any) -> None:
        """Continue from `state` (what `state` gave; `check_state` passed it)."""


#: the events a lane dispatches (every method of `LaneHook` but the state's)
EVENTS = ("may_draw", "drew", "digest", "document", "cut", "released", "reached_combiner",
          "took", "refused", "dropped", "row", "stage_done")


def _overrides(hook: LaneHook, event: str) -> bool:
    return getattr(type(hook), event) is not getattr(LaneHook, event)


class LaneHooks:
    """A lane's hooks, each event bound only to the hooks that override it: an event no hook
    wants costs the lane a loop over an empty tuple."""

    def __init__(self, hooks: Iterable[LaneHook]) -> None:
        self.hooks: tuple[LaneHook, ...] = tuple(hooks)
        self._on: dict[str, tuple[Any, ...]] = {
            event: tuple(getattr(h, event) for h in self.hooks if _overrides(h, event))
            for event in EVENTS}
        self.watched = any(h.watches for h in self.hooks)
        self.stateful: tuple[LaneHook, ...] = tuple(h for h in self.hooks
                                                    if h.state_key is not None)

    def may_draw(self, lane: LaneView) -> bool:
        return all(fn(lane) for fn in self._on["may_draw"])

    def drew(self, lane: LaneView) -> None:
        for fn in self._on["drew"]:
            fn(lane)

    def digest(self, origin: Origin, digest: dict[str, str]) -> None:
        for fn in self._on["digest"]:
            fn(origin, digest)

    def document(self, origin: Origin, payload: Any) -> None:
        for fn in self._on["document"]:
            fn(origin, payload)

    def cut(self, position: str, pushed: Origin, acc: Any) -> list[tuple[Origin, Any]]:
        return [out for fn in self._on["cut"] for out in fn(position, pushed, acc)]

    def released(self, pushed: Origin, outs: list[tuple[Origin, Any]]) -> None:
        for fn in self._on["released"]:
            fn(pushed, outs)

    def reached_combiner(self, lane: LaneView, origin: Origin, tokens: int) -> None:
        for fn in self._on["reached_combiner"]:
            fn(lane, origin, tokens)

    def took(self, origin: Origin) -> None:
        for fn in self._on["took"]:
            fn(origin)

    def refused(self, origin: Origin) -> None:
        for fn in self._on["refused"]:
            fn(origin)

    def dropped(self, origin: Origin, reason: str) -> None:
        for fn in self._on["dropped"]:
            fn(origin, reason)

    def row(self, lane: LaneView, row: Row) -> None:
        for fn in self._on["row"]:
            fn(lane, row)

    def stage_done(self, lane: int, stage: int, name: str, runner: str, start: float,
                   end: float, origins: list[Origin]) -> None:
        for fn in self._on["stage_done"]:
            fn(lane, stage, name, runner, start, end, origins)

    def state(self) -> dict[str, Any]:
        """Every stateful hook's slice, by its key."""
        return {h.state_key: h.state() for h in self.stateful if h.state_key is not None}

    def check_state(self, slices: Mapping[str, Any], where: str) -> None:
        """Refuse `slices` (`CheckpointError`, naming `where`, the hook's key and what is
        wrong) unless every stateful hook has its slice and accepts it."""
        for h in self.stateful:
            key = h.state_key
            if key not in slices:
                raise _refused(where, h, "is missing (the checkpoint was written without "
                               "this hook: give the loader the lane hooks it was saved with)")
            try:
                h.check_state(slices[key])
            except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
                raise _refused(where, h, str(exc) or type(exc).__name__) from None

    def restore(self, slices: Mapping[str, Any], where: str) -> None:
        """Give every stateful hook its slice, once every one has been checked: a bad slice
        leaves every hook as it was."""
        self.check_state(slices, where)
        for h in self.stateful:
            h.restore(slices[h.state_key])


def _refused(where: str, hook: LaneHook, what: str) -> CheckpointError:
    return CheckpointError(f"{where}: the checkpoint's {hook.state_key!r} (the state of lane "
                           f"hook {type(hook).__name__}) {what}; restore from an intact "
                           "checkpoint file")

