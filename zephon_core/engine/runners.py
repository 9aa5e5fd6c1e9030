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
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zephon_core.common.deprecation import deprecation
from zephon_core.engine.kinds import RAY_CONNECT_TIMEOUT, RUNNERS, RunnerKind
from zephon_core.engine.runner_base import CpuMeter, Runner, timed_call
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import StageFn
from zephon_core.records import Element

if TYPE_CHECKING:
    from zephon_core.engine.execution import Execution


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


@dataclass(frozen=True)
class RunnerSpec:
    """Everything a runner is built from: one stage's kind, workers and name, and the
    `Execution` settings runners read, frozen, so a runner cannot change what it was
    given and a new runner setting is one field here and one line in `from_execution`."""

    kind: RunnerKind
    workers: int
    #: the stage's name, for worker processes' names and error messages
    name: str
    start_method: str = "auto"
    group_timeout: float | None = None
    ray_address: str | None = None
    ray_resources: Mapping[str, float] = field(default_factory=dict)
    ray_connect_timeout: float = RAY_CONNECT_TIMEOUT

    @classmethod
    def from_execution(cls, ex: Execution, stage: Any) -> RunnerSpec:
        """The spec of a plan's `stage` (its ``runner_kind``, ``workers`` and ``name``)
        under execution settings `ex`."""
        return cls(RunnerKind(stage.runner_kind), stage.workers, stage.name,
                   ex.start_method, ex.group_timeout, ex.ray_address,
                   dict(ex.ray_resources), ex.ray_connect_timeout)


#: ``make_runner(kind, fn, workers, start_method, name, ...)`` of before 0.4
_POSITIONAL = deprecation("make_runner(kind, fn, workers, start_method, name, ...)",
                          "make_runner(RunnerSpec(...), fn)", "0.4.0")
_OLD_ORDER = ("workers", "start_method", "name", "group_timeout", "ray_address",
              "ray_resources", "ray_connect_timeout")


def make_runner(spec: RunnerSpec | RunnerKind | str, fn: StageFn, *old: Any,
                **old_keywords: Any) -> Runner:
    """The runner `spec` describes, running `fn` (`RunnerSpec.from_execution` gives a
    plan's stage its spec). The positional spelling of before 0.4, ``(kind, fn, workers,
    start_method, name, ...)``, still works until 0.5 with a DeprecationWarning."""
    if not isinstance(spec, RunnerSpec):
        _POSITIONAL.warn(stacklevel=2)
        fields = {**dict(zip(_OLD_ORDER, old, strict=False)), **old_keywords}
        fields["ray_resources"] = fields.get("ray_resources") or {}
        spec = RunnerSpec(RunnerKind(spec), **fields)
    elif old or old_keywords:
        raise TypeError("make_runner(spec, fn) takes nothing more: the spec holds it all")
    return _build(spec, fn)


def _build(spec: RunnerSpec, fn: StageFn) -> Runner:
    kind = spec.kind
    if kind == RunnerKind.INLINE:
        return InlineRunner(fn)
    if kind == RunnerKind.THREADS:
        return ThreadRunner(fn, spec.workers)
    if kind == RunnerKind.PROCESSES:
        from zephon_core.engine.processes import ProcessRunner

        return ProcessRunner(fn, spec.workers, spec.start_method, spec.name,
                             spec.group_timeout)
    if kind == RunnerKind.RAY:
        from zephon_core.engine.ray_runner import RayRunner

        return RayRunner(fn, spec.workers, spec.name, spec.group_timeout, spec.ray_address,
                         dict(spec.ray_resources), spec.ray_connect_timeout)
    raise ConfigError(f"unknown runner {kind!r}; choose one of {RUNNERS}")
