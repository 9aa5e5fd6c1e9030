"""The engine's kinds as `StrEnum`s: each equals and prints as its name (``"threads"``),
so settings, logs, JSON and old comparisons with strings keep working."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol, runtime_checkable


class RunnerKind(StrEnum):
    """Where a stateless stage runs (`Execution.runner`). A `StrEnum`, so a kind equals and
    prints as its name (``"threads"``) in settings, logs and JSON."""

    INLINE = "inline"
    THREADS = "threads"
    PROCESSES = "processes"
    RAY = "ray"

    @property
    def singular(self) -> str:
        """One worker of this kind, as `explain()` counts it: ``1 thread``, ``1 process``."""
        names = {RunnerKind.THREADS: "thread", RunnerKind.PROCESSES: "process",
                 RunnerKind.RAY: "Ray task"}
        return names.get(self, self.value)


@runtime_checkable
class Resizable(Protocol):
    """A runner that can change its worker count while it runs (the process pool,
    `ProcessRunner`): the capability `Execution.auto_workers` sizes. A runner declares it
    by defining `resize`; the sizer checks ``isinstance(runner, Resizable)``."""

    def resize(self, workers: int) -> None:
        """Run `workers` workers from now on, never changing an answer."""


#: every runner kind's name, in order (the choices of `Execution.runner`, with ``auto``)
RUNNERS = tuple(k.value for k in RunnerKind)

#: seconds the ray runner waits for the cluster its address names (`Execution`'s default)
RAY_CONNECT_TIMEOUT = 20.0

#: how process workers may start (`Execution.start_method`; ``auto``: fork where safe)
START_METHODS = ("auto", "spawn", "forkserver", "fork")


class StageKind(StrEnum):
    """What a stage does with a lane's elements (a `StrEnum`: equal to its name)."""

    TRANSFORM = "transform"  # stateless, per element, on a runner
    ACCUMULATOR = "accumulator"  # per-lane state that holds and reorders elements
    COMBINER = "combiner"  # makes the rows
    ROWS = "rows"  # stateless, per finished row, on a runner (`RowTransform`): after the combiner
