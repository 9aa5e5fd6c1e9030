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
"""

from __future__ import annotations

import queue
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
