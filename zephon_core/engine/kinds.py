"""The engine's kinds as `StrEnum`s: each equals and prints as its name (``"threads"``),
so settings, logs, JSON and old comparisons with strings keep working."""

from __future__ import annotations

from enum import StrEnum


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
    COMBINER = "combiner"  # the last stage: makes the rows
