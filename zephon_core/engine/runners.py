"""Runners execute a stage's stateless work: inline, on threads, in a process pool
(`zephon_core.engine.processes`), or as Ray tasks on a cluster
(`zephon_core.engine.ray_runner`); the last two are imported only when asked for.

All of them return futures; the engine consumes them in submission order, so
the runner never changes the data, only where and when the work happens.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from zephon_core.engine.kinds import RAY_CONNECT_TIMEOUT, RUNNERS, RunnerKind
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import StageFn
from zephon_core.records import Element

log = logging.getLogger(__name__)

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


class InlineRunner(Runner):
    """Runs each group at submission, in the calling thread (the reference runner)."""

    def __init__(self, fn: StageFn) -> None:
        self.fn = fn
        self.cpu = CpuMeter()
        fn.setup()

    def submit(self, elements: list[Element]) -> Future:
        fut: Future = Future()
        try:
            out, cpu = timed_call(self.fn, elements, time.thread_time)
            self.cpu.add(cpu, len(elements))
            fut.set_result(out)
        except BaseException as exc:  # noqa: BLE001 - delivered to the consumer
            fut.set_exception(exc)
        return fut


class ThreadRunner(Runner):
    kind = RunnerKind.THREADS

    def __init__(self, fn: StageFn, workers: int) -> None:
        self.fn = fn
        self.workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="zephon")
        self._setup_lock = threading.Lock()
        self._ready = False
        self.cpu = CpuMeter()

    def _call(self, elements: list[Element]) -> list[Any]:
        if not self._ready:
            with self._setup_lock:
                if not self._ready:
                    self.fn.setup()
                    self._ready = True
        out, cpu = timed_call(self.fn, elements, time.thread_time)
        self.cpu.add(cpu, len(elements))
        return out

    def submit(self, elements: list[Element]) -> Future:
        return self._pool.submit(self._call, elements)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def make_runner(kind: RunnerKind | str, fn: StageFn, workers: int, start_method: str, name: str,
                group_timeout: float | None = None, ray_address: str | None = None,
                ray_resources: dict[str, float] | None = None,
                ray_connect_timeout: float = RAY_CONNECT_TIMEOUT) -> Runner:
    if kind == RunnerKind.INLINE:
        return InlineRunner(fn)
    if kind == RunnerKind.THREADS:
        return ThreadRunner(fn, workers)
    if kind == RunnerKind.PROCESSES:
        from zephon_core.engine.processes import ProcessRunner

        return ProcessRunner(fn, workers, start_method, name, group_timeout)
    if kind == RunnerKind.RAY:
        from zephon_core.engine.ray_runner import RayRunner

        return RayRunner(fn, workers, name, group_timeout, ray_address, ray_resources,
                         ray_connect_timeout)
    raise ConfigError(f"unknown runner {kind!r}; choose one of {RUNNERS}")
