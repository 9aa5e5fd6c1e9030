"""What every runner is, below the runners themselves: the `Runner` interface, the
`CpuMeter` its workers fill, `timed_call` (one stage call, timed per transform) and
`MAX_ATTEMPTS`.

The implementations (`engine/runners.py` for inline and threads, `engine/processes.py`
with `engine/workers.py`, `engine/ray_runner.py`) import this module, and
`runners.make_runner` imports them, so no implementation imports the table that picks it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from zephon_core.engine.kinds import RunnerKind
from zephon_core.records import Element

#: attempts of one group before its stage fails (process and Ray runners)
MAX_ATTEMPTS = 3


def timed_call(fn: Any, elements: list[Element],
               clock: Callable[[], float]) -> tuple[list[Any], tuple[float, ...]]:
    """`fn(elements)` and the `clock` seconds it took, per transform when `fn` is a
    `StageFn` (its `timed`), else one figure for the whole call."""
    timed = getattr(fn, "timed", None)
    if callable(timed):
        return timed(elements, clock)
    start = clock()
    out = fn(elements)
    return out, (clock() - start,)


class CpuMeter:
    """CPU seconds a runner's workers spent in its stage, per transform, since it started.

    Measured where the work runs: the worker thread's CPU clock
    (`time.thread_time`) for inline and thread runners, the worker process's
    (`time.process_time`, all its threads) for process runners. Only the stage
    function's own calls count (not queueing, not moving data between processes).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: list[float] = []
        self._elements = 0

    def add(self, seconds: tuple[float, ...], elements: int) -> None:
        with self._lock:
            self._elements += elements
            if len(self._seconds) < len(seconds):
                self._seconds += [0.0] * (len(seconds) - len(self._seconds))
            for k, v in enumerate(seconds):
                self._seconds[k] += v

    def read(self) -> tuple[float, ...]:
        with self._lock:
            return tuple(self._seconds)

    def per_element(self) -> float | None:
        """CPU seconds per element so far, all transforms together (None before any)."""
        with self._lock:
            return sum(self._seconds) / self._elements if self._elements else None


class Runner:
    kind = RunnerKind.INLINE
    workers = 1
    #: workers replaced since it started (died or hung; the process runner's count)
    restarts = 0
    #: CPU its workers spent in the stage (None: not measured, e.g. Ray tasks)
    cpu: CpuMeter | None = None
    #: its workers were forked from this process: they share what it has loaded
    forked = False

    def cpu_seconds(self) -> tuple[float, ...]:
        """CPU seconds per transform of the stage since the runner started; () when the
        runner does not measure them."""
        return self.cpu.read() if self.cpu is not None else ()

    def cpu_per_element(self) -> float | None:
        """CPU seconds one element has cost the stage so far (None: none done yet, or not
        measured)."""
        return self.cpu.per_element() if self.cpu is not None else None

    def submit(self, elements: list[Element]) -> Future:
        raise NotImplementedError

    def close(self) -> None:
        """Release threads, processes and shared memory; safe to call twice."""
