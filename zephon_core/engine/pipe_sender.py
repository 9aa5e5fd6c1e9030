"""The process runner's outgoing messages, sent by a thread of their own.

A group travels to its worker through the worker's pipe: its arrays through shared
memory, everything else (text, bytes, a whole group when /dev/shm is full) pickled in the
message. A message larger than the pipe's buffer blocks its sender until the worker reads
it, and the worker reads only once it has written its previous answer, which may be as
large. If the dispatcher, the one thread that reads the answers, also sent the groups,
each side would wait for the other forever. So the dispatcher only queues what it sends
and this thread writes it, in order (a worker's groups arrive in the order they were
assigned, which is the order its answers are matched in).

A connection is closed here too, after every message queued before for it: closing it
from another thread while this one writes to it could let a new pipe take its file number
and receive the rest of the old message.

`PipeWatch` is the dispatcher's side: what it waits on (the wake-up pipe, the workers'
pipes and their process sentinels) in one poll set kept between waits.
"""

from __future__ import annotations

import math
import queue
import select
import threading
from multiprocessing.connection import Connection
from typing import Any

_CLOSE = object()
_STOP = object()


class PipeSender:
    """One thread writing queued messages to worker pipes, first queued first written.

    A write to a worker that has died fails at once (its end of the pipe is closed) and
    is dropped: the dispatcher sees the death by the process sentinel and re-runs the
    groups that worker held.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Connection | None, Any]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"zephon-send-{name}",
                                        daemon=True)
        self._thread.start()

    def send(self, conn: Connection, message: Any) -> None:
        """Queue `message` for `conn`; returns at once."""
        self._queue.put((conn, message))

    def close_after(self, conn: Connection) -> None:
        """Close `conn` once every message queued for it before has been written."""
        self._queue.put((conn, _CLOSE))

    def stop(self, timeout: float) -> bool:
        """Write what is queued, then end the thread; False if it is still writing after
        `timeout` seconds (a worker that reads nothing: kill it, then `stop` again)."""
        self._queue.put((None, _STOP))
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            conn, message = self._queue.get()
            if message is _STOP:
                return
            assert conn is not None
            if message is _CLOSE:
                conn.close()
                continue
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
