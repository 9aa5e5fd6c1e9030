"""Runners execute a stage's stateless work: inline, on threads, or in a process pool.

All three return futures; the engine consumes them in submission order, so
the runner never changes the data, only where and when the work happens.

The process pool is ours rather than `concurrent.futures`' because it must
(1) move arrays through shared memory both ways, (2) restart a worker that
dies and re-run its groups without breaking the pool, and (3) on `close()`
leave no process and no shared-memory segment behind.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import pickle
import threading
import traceback
import uuid
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection, wait
from typing import Any

from zephon_core.engine import shm
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import StageFn
from zephon_core.records import Element

log = logging.getLogger(__name__)
RUNNERS = ("inline", "threads", "processes")
MAX_ATTEMPTS = 3


class Runner:
    kind = "inline"
    workers = 1

    def submit(self, elements: list[Element]) -> Future:
        raise NotImplementedError

    def close(self) -> None:
        """Release threads, processes and shared memory; safe to call twice."""


class InlineRunner(Runner):
    """Runs each group at submission, in the calling thread (the reference runner)."""

    def __init__(self, fn: StageFn) -> None:
        self.fn = fn
        fn.setup()

    def submit(self, elements: list[Element]) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(self.fn(elements))
        except BaseException as exc:  # noqa: BLE001 - delivered to the consumer
            fut.set_exception(exc)
        return fut


class ThreadRunner(Runner):
    kind = "threads"

    def __init__(self, fn: StageFn, workers: int) -> None:
        self.fn = fn
        self.workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="zephon")
        self._setup_lock = threading.Lock()
        self._ready = False

    def _call(self, elements: list[Element]) -> list[Any]:
        if not self._ready:
            with self._setup_lock:
                if not self._ready:
                    self.fn.setup()
                    self._ready = True
        return self.fn(elements)

    def submit(self, elements: list[Element]) -> Future:
        return self._pool.submit(self._call, elements)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _worker_main(conn: Connection, fn_bytes: bytes, prefix: str) -> None:
    """Worker process loop: receive a group, run the stage, send results via shm."""
    fn: StageFn = pickle.loads(fn_bytes)
    fn.setup()
    pool = shm.SegmentPool(prefix)
    conn.send(("ready", -1, None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            pool.close()
            return
        task_id, packed, released = msg
        pool.release(released)
        try:
            out = fn(shm.unpack(packed))
            reply = ("ok", task_id, pool.pack(out))
        except BaseException as exc:  # noqa: BLE001 - sent back to the parent
            try:
                pickle.dumps(exc)
                err: Any = exc
            except Exception:  # noqa: BLE001
                err = RuntimeError("".join(traceback.format_exception(exc)))
            reply = ("err", task_id, err)
        conn.send(reply)


class _Task:
    __slots__ = ("id", "packed", "future", "attempts", "elements_hint")

    def __init__(self, task_id: int, packed: shm.Packed, future: Future, hint: str) -> None:
        self.id = task_id
        self.packed = packed
        self.future = future
        self.attempts = 0
        self.elements_hint = hint


class ProcessRunner(Runner):
    """A pool of worker processes running one fused stage; one dispatcher thread feeds it."""

    kind = "processes"
    per_worker_inflight = 2

    def __init__(self, fn: StageFn, workers: int, start_method: str = "spawn",
                 name: str = "stage") -> None:
        if workers < 1:
            raise ConfigError(f"stage {name}: processes runner needs workers >= 1")
        self.name = name
        self.workers = workers
        self._ctx = mp.get_context(start_method)
        shm.sweep_orphans()
        self.prefix = f"zephon-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
        self._fn_bytes = pickle.dumps(fn)
        self._lock = threading.Lock()
        self._pending: deque[_Task] = deque()
        self._next_id = 0
        self._closed = False
        self._wake_r, self._wake_w = mp.Pipe(duplex=False)
        self._procs: list[Any] = [None] * workers
        self._conns: list[Connection | None] = [None] * workers
        self._assigned: list[deque[_Task]] = [deque() for _ in range(workers)]
        self.restarts = 0
        self._early_deaths = 0
        self._broken = ""
        self._answered = [False] * workers
        # names of pooled answer files the driver no longer reads (appended by finalizers)
        self._released: deque[str] = deque()
        self._free_by_pid: dict[int, list[str]] = {}
        for i in range(workers):
            self._start_worker(i)
        self._thread = threading.Thread(target=self._dispatch, name=f"zephon-{name}", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def _start_worker(self, i: int) -> None:
        parent, child = self._ctx.Pipe()
        p = self._ctx.Process(target=_worker_main, args=(child, self._fn_bytes, self.prefix),
                              name=f"zephon-{self.name}-{i}", daemon=True)
        p.start()
        child.close()
        self._procs[i] = p
        self._conns[i] = parent
        self._answered[i] = False

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p is not None]

    def submit(self, elements: list[Element]) -> Future:
        fut: Future = Future()
        packed = shm.pack(elements, self.prefix)
        hint = ", ".join(e.origin.where() for e in elements[:3] if e.origin is not None)
        with self._lock:
            if self._closed or self._broken:
                shm.discard(packed)
                raise RuntimeError(self._broken or f"runner {self.name} is closed")
            self._pending.append(_Task(self._next_id, packed, fut, hint))
            self._next_id += 1
        self._wake_w.send_bytes(b"x")
        return fut

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
        with self._lock:
            for i in range(self.workers):
                while self._pending and len(self._assigned[i]) < self.per_worker_inflight:
                    task = self._pending.popleft()
                    task.attempts += 1
                    self._assigned[i].append(task)
                    released = self._released_for(self._procs[i].pid)
                    try:
                        self._conns[i].send((task.id, task.packed, released))
                    except (BrokenPipeError, OSError):
                        break

    def _dispatch(self) -> None:
        while True:
            self._assign()
            with self._lock:
                if self._closed:
                    return
                conns = [c for c in self._conns if c is not None]
                sentinels = [p.sentinel for p in self._procs if p is not None]
            ready = wait([self._wake_r, *conns, *sentinels], timeout=1.0)
            for obj in ready:
                if obj is self._wake_r:
                    while self._wake_r.poll():
                        self._wake_r.recv_bytes()
                elif isinstance(obj, Connection):
                    self._receive(obj)
            for i, p in enumerate(self._procs):
                if not self._broken and not p.is_alive() and not self._closed:
                    self._restart(i)

    def _receive(self, conn: Connection) -> bool:
        """Take one answer from a worker; False when its pipe is closed (the worker died)."""
        i = self._conns.index(conn)
        try:
            status, task_id, payload = conn.recv()
        except (EOFError, OSError):
            return False
        if status == "ready":
            self._answered[i] = True
            self._early_deaths = 0
            return True
        with self._lock:
            task = self._assigned[i].popleft()
        assert task.id == task_id, "worker answered out of order"
        shm.discard(task.packed)
        if status == "ok":
            try:
                task.future.set_result(shm.unpack(payload, self._released.append))
            except BaseException as exc:  # noqa: BLE001
                task.future.set_exception(exc)
        else:
            task.future.set_exception(payload)
        return True

    def _restart(self, i: int) -> None:
        """A worker died: re-run its groups on a fresh worker, unless they keep killing it."""
        p = self._procs[i]
        log.warning("zephon: worker %s of stage %s died (exit code %s); restarting it",
                    p.pid, self.name, p.exitcode)
        self.restarts += 1
        conn = self._conns[i]
        while conn.poll() and self._receive(conn):
            pass
        started = self._answered[i]
        if not started:
            self._early_deaths += 1
        with self._lock:
            lost = list(self._assigned[i])
            self._assigned[i].clear()
            if not started:  # it died setting up, not on these groups
                for task in lost:
                    task.attempts -= 1
            if self._early_deaths >= MAX_ATTEMPTS * self.workers:
                lost += list(self._pending)
                self._pending.clear()
                self._broken = (f"stage {self.name}: worker processes keep dying while they "
                                f"start (exit code {p.exitcode}); the stage cannot start in a "
                                "worker process (is the script guarded by `if __name__ == "
                                "'__main__':`? are its operators importable and picklable?)")
            for task in reversed(lost):
                if self._broken:
                    task.future.set_exception(RuntimeError(self._broken))
                    shm.discard(task.packed)
                elif task.attempts >= MAX_ATTEMPTS:
                    task.future.set_exception(RuntimeError(
                        f"stage {self.name}: a worker died {task.attempts} times on the group "
                        f"starting at {task.elements_hint}; the sample crashes the process "
                        "(check it, or drop it with a filter)"))
                    shm.discard(task.packed)
                else:
                    self._pending.appendleft(task)
        conn.close()
        shm.remove_leftovers(f"{self.prefix}{p.pid}-")
        self._free_by_pid.pop(p.pid, None)
        if not self._broken:
            self._start_worker(i)

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
            try:
                c.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self._procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        for c in self._conns:
            c.close()
        for t in tasks:
            shm.discard(t.packed)
            t.future.cancel()
        self._wake_r.close()
        self._wake_w.close()
        shm.remove_leftovers(self.prefix)
        _LIVE.discard(self)


_LIVE: weakref.WeakSet[ProcessRunner] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for r in list(_LIVE):
        r.close()


def make_runner(kind: str, fn: StageFn, workers: int, start_method: str, name: str) -> Runner:
    if kind == "inline":
        return InlineRunner(fn)
    if kind == "threads":
        return ThreadRunner(fn, workers)
    if kind == "processes":
        return ProcessRunner(fn, workers, start_method, name)
    raise ConfigError(f"unknown runner {kind!r}; choose one of {RUNNERS}")
