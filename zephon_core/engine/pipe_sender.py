"""The process runner's outgoing messages, sent by threads of their own, one a worker pipe.

A group travels to its worker through the worker's pipe: its arrays through shared
memory, everything else (text, bytes, a whole group when /dev/shm is full) pickled in the
message. A message larger than the pipe's buffer blocks its sender until the worker reads
it, and the worker reads only once it has written its previous answer, which may be as
large. If the dispatcher, the one thread that reads the answers, also sent the groups,
each side would wait for the other forever. So the dispatcher only queues what it sends
and a writer thread of the worker's pipe writes it, in order (a worker's groups arrive in
the order they were assigned, which is the order its answers are matched in).

One writer a pipe, not one for all: a busy worker reads its queued group only when it
finishes the one it runs, so a single writer blocked on that group held back the groups
of every other worker, which idled meanwhile (decode after packing: a row's encoded
bytes, megabytes; on full-size photos one core was idle 15% of the time).

A connection is closed by its writer too, after every message queued before for it:
closing it from another thread while the writer writes to it could let a new pipe take
its file number and receive the rest of the old message.

`PipeWatch` is the dispatcher's side: what it waits on (the wake-up pipe, the workers'
pipes and their process sentinels) in one poll set kept between waits.
"""

from __future__ import annotations

import itertools
import math
import queue
import select
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

_CLOSE = object()
_STOP = object()


class PipeSender:
    """Queued messages written to worker pipes, each pipe's in the order queued.

    A write to a worker that has died fails at once (its end of the pipe is closed) and
    is dropped: the dispatcher sees the death by the process sentinel and re-runs the
    groups that worker held.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._ids = itertools.count()
        self._lock = threading.Lock()
        #: the writer of each open connection (by identity), as its queue
        self._queues: dict[int, queue.SimpleQueue[Any]] = {}
        #: every writer thread with its queue, closing ones included (`stop` ends them all)
        self._writers: list[tuple[threading.Thread, queue.SimpleQueue[Any]]] = []

    def _queue_of(self, conn: Connection, closing: bool = False) -> queue.SimpleQueue[Any]:
        with self._lock:
            q = self._queues.pop(id(conn), None) if closing else self._queues.get(id(conn))
            if q is None:
                q = queue.SimpleQueue()
                thread = threading.Thread(target=_write, args=(conn, q), daemon=True,
                                          name=f"zephon-send-{self._name}-{next(self._ids)}")
                thread.start()
                self._writers = [w for w in self._writers if w[0].is_alive()]
                self._writers.append((thread, q))
                if not closing:
                    self._queues[id(conn)] = q
            return q

    def send(self, conn: Connection, message: Any) -> None:
        """Queue `message` for `conn`; returns at once."""
        self._queue_of(conn).put(message)

    def close_after(self, conn: Connection) -> None:
        """Close `conn` once every message queued for it before has been written (a new
        connection with the same identity later gets a writer of its own)."""
        self._queue_of(conn, closing=True).put(_CLOSE)

    def stop(self, timeout: float) -> bool:
        """Write what is queued, then end the writers; False if one is still writing after
        `timeout` seconds (a worker that reads nothing: kill it, then `stop` again)."""
        with self._lock:
            writers = list(self._writers)
        for _, q in writers:
            q.put(_STOP)
        deadline = time.monotonic() + timeout
        for thread, _ in writers:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread, _ in writers)


def _write(conn: Connection, messages: queue.SimpleQueue[Any]) -> None:
    """One pipe's writer: its messages in order until it is closed or stopped."""
    while True:
        message = messages.get()
        if message is _STOP:
            return
        if message is _CLOSE:
            conn.close()
            return
        try:
            conn.send(message)
        except (BrokenPipeError, OSError):
            pass


class PipeWatch:
    """``multiprocessing.connection.wait`` for a loop that waits on the same pipes again and
    again: the poll set is built when the objects change, not at every wait (the
    dispatcher waits two or three times per group; building a selector each time was a
    third of its CPU). Ready means any event, a hang-up included, as for ``wait``."""

    def __init__(self) -> None:
        self._objs: tuple[Any, ...] | None = None
        self._poll: Any = None
        self._by_fd: dict[int, Any] = {}

    def wait(self, objs: list[Any], timeout: float | None) -> list[Any]:
        """The objects of `objs` (connections, or file numbers such as a process's
        sentinel) ready to read, after at most `timeout` seconds (None: no limit)."""
        key = tuple(objs)
        if key != self._objs:
            poll, by_fd = select.poll(), {}
            for o in objs:
                fd = o if isinstance(o, int) else o.fileno()
                poll.register(fd, select.POLLIN)
                by_fd[fd] = o
            self._objs, self._poll, self._by_fd = key, poll, by_fd
        ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
        return [self._by_fd[fd] for fd, _ in self._poll.poll(ms)]
