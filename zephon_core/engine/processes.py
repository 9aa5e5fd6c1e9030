"""The process pool runner: a stage's work in worker processes (`engine.workers`).

The pool is ours rather than `concurrent.futures`' because it must
(1) move arrays through shared memory both ways, (2) restart a worker that
dies, or hangs past the group deadline, and re-run its groups without
breaking the pool, (3) on `close()` leave no process and no shared-memory
segment behind, and (4) leave none either when the driver itself is killed:
workers watch their parent and remove the pool's files once it is gone.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import pickle
import threading
import time
import uuid
import weakref
from collections import deque
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from zephon_core.engine import shm
from zephon_core.engine.kinds import RunnerKind
from zephon_core.engine.pipe_sender import PipeSender, PipeWatch
from zephon_core.engine.process_failures import WorkerFailures
from zephon_core.engine.runner_base import CpuMeter, Runner
from zephon_core.engine.workers import (
    lean_start,
    short_cause,
    start_method_now,
    worker_main,
)
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import StageFn
from zephon_core.records import Element

#: the pool's warnings keep the logger name they had before the pool had its own module
#: (``zephon_core.engine.runners``), so a logging setup that names it still sees them
log = logging.getLogger("zephon_core.engine.runners")

#: A pool that has started once gives up on replacements killed by a signal while
#: they start only after this long with none ready and no group answered ...
START_PATIENCE_MIN_S = 60.0
#: ... or this many times the longest start it has seen, if that is longer.
START_PATIENCE = 20.0
#: seconds a retired worker (`ProcessRunner.resize`) may take to exit before it is killed
RETIRE_PATIENCE_S = 10.0


class _Task:
    __slots__ = ("id", "packed", "future", "attempts", "overdue", "samples", "size")

    def __init__(self, task_id: int, packed: shm.Packed, future: Future, samples: str,
                 size: int) -> None:
        self.id = task_id
        self.size = size
        self.packed = packed
        self.future = future
        self.attempts = 0
        self.overdue = 0
        self.samples = samples


class ProcessRunner(Runner, WorkerFailures):
    """A pool of worker processes running one fused stage; one dispatcher thread feeds it.

    `group_timeout` (seconds, None: none) bounds how long a worker may work on
    one group: past it the worker is killed and replaced and its groups re-run.
    `resize` changes the number of workers while it runs (`Execution(workers="auto")`).
    """

    kind = RunnerKind.PROCESSES
    per_worker_inflight = 2

    def __init__(self, fn: StageFn, workers: int, start_method: str = "auto",
                 name: str = "stage", group_timeout: float | None = None) -> None:
        if workers < 1:
            raise ConfigError(f"stage {name}: processes runner needs workers >= 1")
        self.name = name
        self.workers = workers
        self.group_timeout = group_timeout
        #: as asked (`start_method_now` resolves "auto" at each start)
        self.start_method = start_method
        # first: a stage that cannot be shipped to workers is refused before anything of
        # this runner exists to leak (its owner lock in /dev/shm)
        self._fn_bytes = pickle.dumps(fn)
        shm.sweep_orphans()
        self.prefix = f"zephon-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
        self._owner = shm.OwnerLock(self.prefix) if shm.available() else None
        self.pool_bytes = self._size_pools()
        self._lock = threading.Lock()
        self._pending: deque[_Task] = deque()
        self._next_id = 0
        self._closed = False
        self._wake_r, self._wake_w = mp.Pipe(duplex=False)
        #: writes the groups to the workers, so the dispatcher never waits on a full pipe
        self._sender = PipeSender(name)
        self._watch = PipeWatch()
        #: a wake-up byte is on its way to the dispatcher (guarded by `_lock`)
        self._woken = False
        self._procs: list[Any] = [None] * workers
        self._conns: list[Connection | None] = [None] * workers
        self._assigned: list[deque[_Task]] = [deque() for _ in range(workers)]
        # when each worker began its current group (None: idle or still starting)
        self._busy_since: list[float | None] = [None] * workers
        self.cpu = CpuMeter()
        #: messages sent pickled through the pipe because /dev/shm had no room
        self.pickled = 0
        self._init_health(workers)
        # names of pooled answer files the driver no longer reads (appended by finalizers)
        self._released: deque[str] = deque()
        self._free_by_pid: dict[int, list[str]] = {}
        #: the workers' pooled files, mapped once (the dispatcher thread's)
        self._mappings = shm.Mappings()
        #: the worker count `resize` asked for, not yet applied by the dispatcher
        self._target: int | None = None
        #: slots told to stop once their groups are answered: always the last ones, so
        #: the first `workers` slots are the ones given groups
        self._retiring: set[int] = set()
        #: retiring slots told to stop, and when
        self._stopping: dict[int, float] = {}
        self.forked = {self._start_worker(i) for i in range(workers)} == {"fork"}
        self._thread = threading.Thread(target=self._dispatch, name=f"zephon-{name}", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def _size_pools(self) -> int:
        """Each worker's answer pool, sized from what /dev/shm has free now."""
        if not shm.available():
            return 0
        space = shm.space()
        size = shm.pool_bytes(self.workers, space.free)
        if size < shm.MIN_POOL_BYTES:
            need = int(self.workers * shm.MIN_POOL_BYTES / shm.POOL_SHARE)
            log.warning("zephon: stage %s: /dev/shm has %s; %d workers want %.0f MiB for "
                        "their answer pools, so answers will travel slower (one-shot files, "
                        "or pickled when /dev/shm is full). Fix: give /dev/shm more room "
                        "(docker run --shm-size=8g) or use fewer workers",
                        self.name, space, self.workers, need / (1 << 20))
        return size

    def _init_health(self, workers: int) -> None:
        """What the pool knows of its workers' starts and deaths: it decides when a
        replacement is worth starting and when the stage is broken (`process_failures`)."""
        self.restarts = 0
        self._early_deaths = 0
        #: how the workers that died while starting ended, since the pool last made progress
        self._early_causes: dict[str, int] = {}
        #: when the pool last made progress (a worker ready, a group answered)
        self._progress_at = time.monotonic()
        #: seconds each worker took from spawn to ready (the last 64)
        self.start_times: deque[float] = deque(maxlen=64)
        self._started = 0
        self._spawned_at = [0.0] * workers
        self._broken = ""
        self._answered = [False] * workers

    def _start_worker(self, i: int) -> str:
        """Start slot `i`'s process; returns how it was started (fork or spawn...)."""
        method = start_method_now(self.start_method)
        ctx = mp.get_context(method)
        parent, child = ctx.Pipe()
        p = ctx.Process(target=worker_main,
                        args=(child, self._fn_bytes, self.prefix, self.pool_bytes),
                        name=f"zephon-{self.name}-{i}", daemon=True)
        with lean_start(method, self._fn_bytes):
            p.start()
        child.close()
        self._procs[i] = p
        self._conns[i] = parent
        self._answered[i] = False
        self._busy_since[i] = None
        self._spawned_at[i] = time.monotonic()
        return method

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p is not None]

    def resize(self, workers: int) -> None:
        """Run `workers` workers from now on. Never changes an answer, only who computes it:
        new workers start beside the others; the last ones stop taking groups, answer
        those they hold, then exit (never killed mid-group, so no group re-runs)."""
        if workers < 1:
            raise ConfigError(f"stage {self.name}: processes runner needs workers >= 1")
        with self._lock:
            if self._closed or self._broken:
                return
            self._target = workers
            wake, self._woken = not self._woken, True
        if wake:
            self._wake_w.send_bytes(b"x")

    def _apply_size(self) -> None:
        """The dispatcher's half of `resize`: start slots, or mark the last ones retiring."""
        with self._lock:
            target, self._target = self._target, None
        if target is None or target == self.workers:
            return
        for i in sorted(self._retiring):  # taken back first: they are running already
            if self.workers >= target:
                break
            self._retiring.discard(i)
            if i in self._stopping:  # told to stop already: let it go, start a fresh one
                self._end_process(i)
            if self._conns[i].closed:  # its worker died or was stopped while retiring
                self._start_worker(i)
            self.workers += 1
        while self.workers < target:
            i = len(self._procs)
            with self._lock:
                self._procs.append(None)
                self._conns.append(None)
                self._assigned.append(deque())
                self._busy_since.append(None)
                self._spawned_at.append(0.0)
                self._answered.append(False)
            self._start_worker(i)
            self.workers += 1
        while self.workers > target:
            self.workers -= 1
            self._retiring.add(self.workers)

    def _reap_retired(self) -> None:
        """Stop the last slot once it is retiring and holds no group (without waiting for
        it: its exit wakes the dispatcher), and remove it once its process is gone."""
        while self._procs and len(self._procs) - 1 in self._retiring:
            i = len(self._procs) - 1
            p, conn = self._procs[i], self._conns[i]
            if self._assigned[i]:
                return
            if i not in self._stopping:
                self._stopping[i] = time.monotonic()
                self._sender.send(conn, None)
            if p.is_alive() and time.monotonic() - self._stopping[i] < RETIRE_PATIENCE_S:
                return
            self._end_process(i)
            with self._lock:
                for slots in (self._procs, self._conns, self._assigned, self._busy_since,
                              self._spawned_at, self._answered):
                    slots.pop()
            self._retiring.discard(i)

    def _end_process(self, i: int) -> None:
        """The process of slot `i` has been told to stop (or died): make sure it is gone and
        forget its files."""
        p, conn = self._procs[i], self._conns[i]
        self._stopping.pop(i, None)
        p.join(timeout=2)
        if p.is_alive():
            p.kill()
            p.join(timeout=2)
        self._sender.close_after(conn)
        shm.remove_leftovers(f"{self.prefix}{p.pid}-")
        self._mappings.forget_prefix(f"{self.prefix}{p.pid}-")
        self._free_by_pid.pop(p.pid, None)

    def submit(self, elements: list[Element]) -> Future:
        fut: Future = Future()
        packed = shm.pack(elements, self.prefix)
        self._count_pickled([packed])
        samples = "; ".join(e.origin.where() for e in elements if e.origin is not None)
        with self._lock:
            if self._closed or self._broken:
                shm.discard(packed)
                raise RuntimeError(self._broken or f"runner {self.name} is closed")
            self._pending.append(_Task(self._next_id, packed, fut, samples or "?",
                                       len(elements)))
            self._next_id += 1
            wake, self._woken = not self._woken, True
        if wake:  # one byte until the dispatcher looks at the queue again
            self._wake_w.send_bytes(b"x")
        return fut

    def _count_pickled(self, items: list[Any]) -> None:
        n = sum(1 for p in items if isinstance(p, shm.Packed) and p.pickled)
        if not n:
            return
        with self._lock:
            first = not self.pickled
            self.pickled += n
        if first:
            log.warning("zephon: stage %s: /dev/shm is full (%s); messages that do not fit "
                        "travel pickled through the pipe (slower). Fix: give /dev/shm more "
                        "room (docker run --shm-size=8g) or use fewer workers",
                        self.name, shm.space())

    def _released_for(self, pid: int) -> list[str]:
        """Pooled files of worker `pid` that it may reuse (a dead worker's files are gone)."""
        live = set(self.pids)
        while self._released:
            name = self._released.popleft()
            owner = int(name[len(self.prefix):].split("-", 1)[0])
            if owner in live:
                self._free_by_pid.setdefault(owner, []).append(name)
        return self._free_by_pid.pop(pid, [])

    def _assign(self) -> None:
        """Give each pending group to the least busy worker (up to `per_worker_inflight`):
        groups often come one at a time (a lane's rows), and filling one worker's queue
        first put the second behind the first while another worker idled."""
        with self._lock:
            self._woken = False  # a task queued from here on wakes the dispatcher again
            while self._pending:
                i = min(range(self.workers), key=lambda j: len(self._assigned[j]))
                if len(self._assigned[i]) >= self.per_worker_inflight:
                    break
                task = self._pending.popleft()
                task.attempts += 1
                if not self._assigned[i] and self._answered[i]:
                    self._busy_since[i] = time.monotonic()
                self._assigned[i].append(task)
                released = self._released_for(self._procs[i].pid)
                self._sender.send(self._conns[i], (task.id, task.packed, released))

    def _wait_s(self) -> float:
        """How long the dispatcher may sleep: 1 s, or until the next group deadline."""
        if self.group_timeout is None:
            return 1.0
        starts = [t for t in self._busy_since if t is not None]
        if not starts:
            return 1.0
        return min(1.0, max(0.01, min(starts) + self.group_timeout - time.monotonic()))

    def _dispatch(self) -> None:
        while True:
            self._apply_size()
            self._assign()
            with self._lock:
                if self._closed:
                    return
                # a worker given up on (broken pool) has its pipe closed: not watched
                live = [(c, p) for c, p in zip(self._conns, self._procs, strict=True)
                        if c is not None and not c.closed]
                conns = [c for c, _ in live]
                sentinels = [p.sentinel for _, p in live]
            ready = self._watch.wait([self._wake_r, *conns, *sentinels], self._wait_s())
            # a worker's death makes its sentinel ready (and it stays ready until seen)
            ended = {obj for obj in ready if isinstance(obj, int)}
            for obj in ready:
                if obj is self._wake_r:  # one byte a read; another pending wakes the next wait
                    self._wake_r.recv_bytes()
                elif isinstance(obj, Connection):
                    self._receive(obj)
            self._reap_retired()
            for i, p in enumerate(self._procs):
                if self._broken or self._closed:
                    break
                if self._conns[i].closed or i in self._stopping:  # retired: being removed
                    continue
                if p.sentinel in ended and not p.is_alive():
                    self._restart(i)
                elif self._overdue(i):
                    p.kill()
                    p.join(timeout=5)
                    self._restart(i, overdue=True)

    def _overdue(self, i: int) -> bool:
        """Past `group_timeout` on a group, or starting past `start_deadline` with groups
        dealt to it (`_start_overdue`)."""
        since = self._busy_since[i]
        if since is None:
            return self._start_overdue(i)
        return self.group_timeout is not None and time.monotonic() - since > self.group_timeout

    def _receive(self, conn: Connection) -> bool:
        """Take one answer from a worker; False when its pipe is closed (the worker died)."""
        i = self._conns.index(conn)
        try:
            status, task_id, payload, cpu = conn.recv()
        except (EOFError, OSError):
            return False
        if status == "ready":
            self._answered[i] = True
            self.start_times.append(time.monotonic() - self._spawned_at[i])
            self._started += 1
            self._made_progress()
            if self._assigned[i]:
                self._busy_since[i] = time.monotonic()
            return True
        with self._lock:
            task = self._assigned[i].popleft()
            self._busy_since[i] = time.monotonic() if self._assigned[i] else None
        assert task.id == task_id, "worker answered out of order"
        self._made_progress()
        shm.discard(task.packed)
        if cpu:
            self.cpu.add(cpu, task.size)
        if status == "ok":
            self._count_pickled(getattr(payload, "items", [payload]))
            try:
                task.future.set_result(shm.unpack(payload, self._released.append,
                                                  self._mappings))
            except BaseException as exc:  # noqa: BLE001
                task.future.set_exception(exc)
        else:
            task.future.set_exception(payload)
        return True

    def _restart(self, i: int, overdue: bool = False) -> None:
        """A worker died or overran the deadline: re-run its groups on a fresh worker,
        unless they keep killing (or hanging) it."""
        p = self._procs[i]
        self.restarts += 1
        conn = self._conns[i]
        if not overdue:
            while conn.poll() and self._receive(conn):
                pass
        started = self._answered[i]
        why = self._why_replaced(p.exitcode, overdue, started)
        with self._lock:
            lost = list(self._assigned[i])
            self._assigned[i].clear()
        where = (f"on the group of samples {lost[0].samples}" if lost and started
                 else "while starting" if not started else "between groups")
        log.warning("zephon: stage %s: worker %s %s %s; replacing it", self.name, p.pid, why,
                    where)
        if not started:
            self._early_deaths += 1
            cause = "start timeout" if overdue else short_cause(p.exitcode)
            self._early_causes[cause] = self._early_causes.get(cause, 0) + 1
        with self._lock:
            if overdue and started and lost:
                lost[0].overdue += 1
            if not started or overdue:  # not these groups' doing (a hang is counted apart)
                for task in lost:
                    task.attempts -= 1
            if not started and self._cannot_start(p.exitcode):
                lost += list(self._pending)
                self._pending.clear()
                self._broken = self._start_failure(p.exitcode, hung=overdue)
            for task in reversed(lost):
                error = self._broken or self._group_failure(task, p.exitcode)
                if error:
                    task.future.set_exception(RuntimeError(error))
                    shm.discard(task.packed)
                else:
                    self._pending.appendleft(task)
        self._sender.close_after(conn)
        shm.remove_leftovers(f"{self.prefix}{p.pid}-")
        self._mappings.forget_prefix(f"{self.prefix}{p.pid}-")
        self._free_by_pid.pop(p.pid, None)
        if not self._broken and i not in self._retiring:
            self._start_worker(i)

    def _made_progress(self) -> None:
        self._early_deaths = 0
        self._early_causes.clear()
        self._progress_at = time.monotonic()

    def start_patience(self) -> float:
        """Seconds without progress before replacements killed while starting end the
        stage: `START_PATIENCE` x the longest start seen, at least `START_PATIENCE_MIN_S`."""
        return max(START_PATIENCE_MIN_S, START_PATIENCE * max(self.start_times, default=0.0))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            tasks = list(self._pending) + [t for q in self._assigned for t in q]
            self._pending.clear()
        self._wake_w.send_bytes(b"x")
        self._thread.join(timeout=5)
        for c in self._conns:
            self._sender.send(c, None)
        stopped = self._sender.stop(timeout=2)
        for p in self._procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        if stopped or self._sender.stop(timeout=5):  # a killed worker's pipe fails at once
            for c in self._conns:
                c.close()
        for t in tasks:
            shm.discard(t.packed)
            t.future.cancel()
        self._wake_r.close()
        self._wake_w.close()
        shm.remove_leftovers(self.prefix)
        self._mappings.forget_prefix(self.prefix)
        if self._owner is not None:
            self._owner.release()
        _LIVE.discard(self)


_LIVE: weakref.WeakSet[ProcessRunner] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for r in list(_LIVE):
        r.close()
