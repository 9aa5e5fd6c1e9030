"""The Ray runner: a stateless stage's groups as Ray tasks on a cluster.

Only the stateless half of a stage travels: a group's elements (pointers, or
the encoded bytes a previous stage read) go out, its outputs (tokens, uint8
pixel rows) come back; lanes, accumulators and checkpoints stay with the
trainer. The engine consumes the futures in submission order, as with every
runner, so where and when a group ran never shows in a batch.

Faults never change data. A group lost with its worker or node (or whose
answer was lost with the node that held it) is submitted again, up to
`MAX_ATTEMPTS` times, then the run stops naming the stage and the group. A
group past `group_timeout` is abandoned and submitted again: never
``ray.cancel``-ed, because in Ray 2.60 a cancel that meets the task's own
completion fails a check in the driver's core worker and ends the trainer's
process (``Tried to complete task that was not pending``, ray-project/ray
#54846); an abandoned task keeps its CPU until it ends, and its answer is
dropped. A cluster whose
head stops answering fails every group in flight with an error that says so:
resume from the last checkpoint on a cluster that is up again.

Answers are copied out of the object store as they arrive, so the object
store on the trainer's node only ever holds the groups in flight (at most
`per_worker_inflight * workers` per rank and stage), never the documents that
wait for their step.

Ray is imported in `ray_connection` only (one ``ray.init`` per process, within
a deadline), and these modules only when a stage asks for the ray runner, so
`zephon_core` works without Ray installed. What a task carries (the group run
on a worker, the answer copied back) is `ray_tasks`.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from typing import Any

from zephon_core.engine.kinds import RAY_CONNECT_TIMEOUT, RunnerKind
from zephon_core.engine.ray_connection import (  # noqa: F401  (connect, head_of: still offered here)
    _Connection,
    connect,
    head_of,
)
from zephon_core.engine.ray_tasks import FLOAT_WARN_BYTES, float_bytes, own_copy, run_group
from zephon_core.engine.runner_base import MAX_ATTEMPTS, Runner
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import StageFn
from zephon_core.records import Element

log = logging.getLogger(__name__)

#: seconds without any answer before the runner asks whether the cluster's head still answers
PROBE_AFTER_S = 2.0
#: seconds the head may not answer before the cluster counts as gone and the run stops
CLUSTER_GRACE_S = 10.0


class _Task:
    __slots__ = ("id", "elements", "future", "samples", "attempts", "overdue", "ref",
                 "started")

    def __init__(self, task_id: int, elements: list[Element], future: Future,
                 samples: str) -> None:
        self.id = task_id
        self.elements = elements
        self.future = future
        self.samples = samples
        self.attempts = 0
        self.overdue = 0
        self.ref: Any = None
        self.started = 0.0


class RayRunner(Runner):
    """A stage's groups as Ray tasks: `workers` groups running, twice that in flight.

    Each task asks for one CPU and `resources` (a custom resource such as
    ``{"zephon_cpu": 1}`` that only the CPU-only node pool offers, so tasks
    never land on the trainers' nodes). `address` (None: ``RAY_ADDRESS``, else
    the latest cluster started on this machine, else a local instance); a cluster
    named by an address that does not connect within `connect_timeout` seconds is
    refused with an error naming it.
    """

    kind = RunnerKind.RAY
    per_worker_inflight = 2

    def __init__(self, fn: StageFn, workers: int, name: str = "stage",
                 group_timeout: float | None = None, address: str | None = None,
                 resources: dict[str, float] | None = None,
                 connect_timeout: float = RAY_CONNECT_TIMEOUT) -> None:
        if workers < 1:
            raise ConfigError(f"stage {name}: ray runner needs workers >= 1")
        self.name = name
        self.workers = workers
        self.group_timeout = group_timeout
        self.max_inflight = self.per_worker_inflight * workers
        self.resources = dict(resources or {})
        self._ray = _Connection.acquire(address, connect_timeout)
        ray = self._ray
        try:
            self.gcs_address = ray.get_runtime_context().gcs_address
            self._key = uuid.uuid4().hex
            self._box = [ray.put(fn)]
            self._remote = ray.remote(run_group).options(
                num_cpus=1, resources=self.resources or None, max_retries=0,
                name=f"zephon:{name}")
        except BaseException:
            _Connection.release()
            raise
        self._lock = threading.Lock()
        self._pending: deque[_Task] = deque()
        self._running: dict[int, _Task] = {}
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._next_id = 0
        self._closed = False
        self._broken = ""
        self._last_answer = time.monotonic()
        self._head_silent_since: float | None = None
        self._warned_floats = False
        #: groups submitted again after their worker, node or answer was lost
        self.resubmitted = 0
        #: groups answered, by the Ray node that ran them (hex node id)
        self.nodes: dict[str, int] = {}
        self._thread = threading.Thread(target=self._dispatch, name=f"zephon-ray-{name}",
                                        daemon=True)
        self._thread.start()

    def submit(self, elements: list[Element]) -> Future:
        fut: Future = Future()
        samples = "; ".join(e.origin.where() for e in elements if e.origin is not None)
        with self._lock:
            if self._closed or self._broken:
                raise RuntimeError(self._broken or f"runner {self.name} is closed")
            self._pending.append(_Task(self._next_id, elements, fut, samples or "?"))
            self._next_id += 1
        self._events.put(None)
        return fut

    def inflight(self) -> int:
        """Groups submitted and not answered yet (running on the cluster or queued here)."""
        with self._lock:
            return len(self._pending) + len(self._running)

    # -- the dispatcher thread owns `_running` and every Ray call after construction --

    def _launch(self) -> None:
        while True:
            with self._lock:
                if self._broken or not self._pending or len(self._running) >= self.max_inflight:
                    return
                task = self._pending.popleft()
            task.attempts += 1
            task.started = time.monotonic()
            ref = self._remote.remote(self._key, self._box, self.name, task.elements)
            task.ref = ref
            self._running[task.id] = task
            ref.future().add_done_callback(
                lambda f, tid=task.id, r=ref: self._events.put((tid, r, f)))

    def _dispatch(self) -> None:
        while True:
            try:
                event = self._events.get(timeout=0.5)
            except queue.Empty:
                event = None
            if self._closed:
                return
            if event is not None:
                self._answer(*event)
                while True:  # take every answer that is already there
                    try:
                        more = self._events.get_nowait()
                    except queue.Empty:
                        break
                    if more is not None:
                        self._answer(*more)
            if not self._broken:
                self._check_deadlines()
                self._check_cluster()
            self._launch()

    def _answer(self, task_id: int, ref: Any, ray_future: Future) -> None:
        task = self._running.get(task_id)
        if task is None or task.ref is not ref:
            return  # an attempt given up on (abandoned past its deadline, or closed)
        ray = self._ray
        try:
            status, node, payload = ray_future.result()
        except ray.exceptions.RayTaskError as exc:
            # the task machinery itself failed on the worker (never the stage: its
            # exceptions come back as values): e.g. zephon not importable there
            self._fail(task, RuntimeError(
                f"stage {self.name}: the Ray task for the group of samples {task.samples} "
                f"could not run: {exc}. Every node that runs zephon tasks needs zephon-vl and "
                "the recipe's modules at the trainer's versions"))
            return
        except Exception as exc:  # noqa: BLE001 - lost with a worker, node or object
            self._lost(task, exc)
            return
        self._last_answer = time.monotonic()
        self._head_silent_since = None
        del self._running[task_id]
        self.nodes[node] = self.nodes.get(node, 0) + 1
        if status != "ok":
            task.future.set_exception(payload)
            return
        if not self._warned_floats and float_bytes(payload) >= FLOAT_WARN_BYTES:
            self._warned_floats = True
            log.warning("zephon: stage %s: Ray tasks send back floating-point arrays (%d KiB "
                        "in one group); send uint8 pixels and normalize on the trainer "
                        "(ImageSettings.normalize='collate' or 'device'): 4x fewer bytes "
                        "over the network", self.name, float_bytes(payload) >> 10)
        try:
            task.future.set_result(own_copy(payload))
        except BaseException as exc:  # noqa: BLE001
            task.future.set_exception(exc)

    def _lost(self, task: _Task, exc: BaseException) -> None:
        """A group lost with its worker or node: again, a bounded number of times."""
        del self._running[task.id]
        if task.attempts >= MAX_ATTEMPTS:
            self._fail(task, RuntimeError(
                f"stage {self.name}: the group of samples {task.samples} was lost "
                f"{task.attempts} times with its Ray worker or node (the last time: "
                f"{type(exc).__name__}: {str(exc).strip()[:300]}); check the nodes "
                "(`ray status`, `ray logs`): they may run out of memory, or a sample crashes "
                "the worker"), running=False)
            return
        log.warning("zephon: stage %s: a Ray task was lost (%s: %s); submitting the group of "
                    "samples %s again", self.name, type(exc).__name__,
                    str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "",
                    task.samples)
        self.resubmitted += 1
        with self._lock:
            self._pending.appendleft(task)

    def _fail(self, task: _Task, exc: BaseException, running: bool = True) -> None:
        if running:
            self._running.pop(task.id, None)
        task.future.set_exception(exc)

    def _check_deadlines(self) -> None:
        if self.group_timeout is None:
            return
        now = time.monotonic()
        for task in [t for t in self._running.values()
                     if now - t.started > self.group_timeout]:
            task.overdue += 1
            task.attempts -= 1  # a hang is counted apart
            del self._running[task.id]
            if task.overdue >= MAX_ATTEMPTS:
                task.future.set_exception(RuntimeError(
                    f"stage {self.name}: {task.overdue} Ray tasks in a row ran past "
                    f"group_timeout ({self.group_timeout:g} s) on the group of samples "
                    f"{task.samples}; one of them hangs the operator, or no node offers the "
                    f"resources the tasks ask for ({ {'CPU': 1, **self.resources} }: check "
                    "`ray status`)"))
                continue
            log.warning("zephon: stage %s: a Ray task ran past group_timeout (%g s); "
                        "abandoned, submitting the group of samples %s again", self.name,
                        self.group_timeout, task.samples)
            self.resubmitted += 1
            with self._lock:
                self._pending.appendleft(task)

    def _head_answers(self) -> bool:
        host, _, port = self.gcs_address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
                return True
        except OSError:
            return False

    def _check_cluster(self) -> None:
        """With groups in flight and no answer for a while: does the cluster's head answer?
        Ray itself waits for a head that is gone; the run must stop instead."""
        now = time.monotonic()
        if not self._running or now - self._last_answer < PROBE_AFTER_S:
            return
        if self._head_answers():
            self._head_silent_since = None
            self._last_answer = now  # probe again in PROBE_AFTER_S
            return
        if self._head_silent_since is None:
            self._head_silent_since = now
            return
        if now - self._head_silent_since < CLUSTER_GRACE_S:
            return
        tasks = sorted(self._running.values(), key=lambda t: t.id)
        with self._lock:
            tasks += list(self._pending)
            self._pending.clear()
            self._broken = (
                f"stage {self.name}: the Ray cluster went away: its head at "
                f"{self.gcs_address} has not answered for {CLUSTER_GRACE_S:g} s, with "
                f"{len(tasks)} groups in flight (the first: samples {tasks[0].samples}). The "
                "run stops here: start the cluster again (or point RAY_ADDRESS at another) "
                "and resume from the last checkpoint; the batches continue exactly as in an "
                "uninterrupted run")
        self._running.clear()
        for task in tasks:
            task.future.set_exception(RuntimeError(self._broken))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            tasks = list(self._pending)
            self._pending.clear()
        self._events.put(None)
        self._thread.join(timeout=5)
        tasks += list(self._running.values())  # abandoned, as past a deadline (module doc)
        self._running.clear()
        for task in tasks:
            task.future.cancel()
        self._box = []
        _Connection.release()
