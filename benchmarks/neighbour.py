"""A busy neighbour: one process that keeps one core busy, a stand-in for the trainer.

On a training node the trainer's own process keeps a core busy (Python,
kernel launches, collectives) beside the loader. The benchmark's ``+busy``
workloads run every loader with this neighbour beside it for the whole run
and report the loader's delivered rate as a share of its quiet rate. The
neighbour is outside the measured process tree: its CPU is not the loader's,
and the harness subtracts it from the machine's "outside" load, so a run is
not called disturbed for the load it was asked to carry.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from types import TracebackType


def _spin(ready: object) -> None:
    """Pure-Python work until killed (a trainer's interpreter never sleeps for long)."""
    os.setsid()  # its own session: the harness's clean-up of a run's session skips it
    ready.set()  # type: ignore[attr-defined]
    x = 0
    while True:
        for i in range(10_000):
            x = (x * 31 + i) & 0xFFFF


class Neighbour:
    """``with Neighbour() as n:`` one spinning process (``n.pid``) for the block's duration."""

    def __init__(self) -> None:
        self.process: mp.process.BaseProcess | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> Neighbour:
        ctx = mp.get_context("fork")
        ready = ctx.Event()
        self.process = ctx.Process(target=_spin, args=(ready,), name="bench-neighbour",
                                   daemon=True)
        self.process.start()
        if not ready.wait(30):
            self.stop()
            raise RuntimeError("the busy neighbour process did not start within 30 s")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.is_alive():
            os.kill(self.process.pid, signal.SIGKILL)  # type: ignore[arg-type]
        if self.process is not None:
            self.process.join(timeout=10)

    def __enter__(self) -> Neighbour:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
