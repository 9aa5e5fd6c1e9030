"""Runners execute a stage's stateless work: inline, on threads, in a process pool
(`zephon_core.engine.processes`), or as Ray tasks on a cluster
(`zephon_core.engine.ray_runner`); the last two are imported only when asked for.
This module is the table that picks one (`make_runner`) and the two that run in this
process; what every runner shares (`Runner`, `CpuMeter`, `timed_call`) is
`engine/runner_base.py`, below all of them, so no runner imports this table.

All of them return futures; the engine consumes them in submission order, so
the runner never changes the data, only where and when the work happens.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from zephon_core.engine.kinds import RAY_CONNECT_TIMEOUT, RUNNERS, RunnerKind
from zephon_core.engine.runner_base import CpuMeter, Runner, timed_call
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import StageFn
from zephon_core.records import Element


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
