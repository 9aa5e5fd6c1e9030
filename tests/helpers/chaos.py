"""Worker functions and driver scripts of the chaos tests (tests/core/test_chaos.py).

Process workers unpickle these by module name, so they live at module level
in a module that imports only numpy and zephon_core.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

from zephon_core import Element, Map, Origin
from zephon_core.ops.contract import StageFn


def big(x: int) -> np.ndarray:
    """An answer large enough to travel through a pooled shared-memory file."""
    return np.full(200_000, x % 251, dtype=np.uint8)


def slow_big(x: int) -> np.ndarray:
    """`big` after 30 ms: groups still in flight when a test resizes the pool."""
    time.sleep(0.03)
    return big(x)


def hang_on_13(x: int) -> int:
    """Never returns on element 13: a hung operator."""
    if x == 13:
        time.sleep(3600)
    return x


def sigbus_always(x: int) -> int:
    """Dies as a worker writing into a full tmpfs mapping does: the fault's SIGBUS goes to
    the thread that wrote (a signal sent to the process may reach another thread and end
    the process only after this one has answered)."""
    signal.pthread_kill(threading.get_ident(), signal.SIGBUS)
    return x


class SlowStart(Map):
    """A Map whose setup takes long (a model load): its workers stay "starting"."""

    def setup(self) -> None:
        time.sleep(60)


class HangingStart(Map):
    """A Map whose setup never ends (a model load stuck on a dead file server) in the
    first worker that starts, or in every worker when `marker` is None; the others start
    at once. The first one claims `marker` by creating it."""

    marker: str | None = None

    def setup(self) -> None:
        if self.marker is not None:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
        time.sleep(3600)


def hanging_start(marker: str | None) -> StageFn:
    """A stage of `HangingStart(identity)` (see there)."""
    op = HangingStart(identity, name="hang_start")
    op.marker = marker
    return StageFn([op])


def identity(x: int) -> int:
    return x


def elements(start: int, n: int) -> list[Element]:
    return [Element(i, i, Origin(i, 0, 1, i, 0)) for i in range(start, start + n)]


def stage(fn: Any) -> StageFn:
    return StageFn([Map(fn, name="chaos")])


def hold_pool() -> None:
    """A driver for the driver-SIGKILL test: a pool with answers held in pooled files.

    Prints one JSON line (the pool's prefix and its workers), then waits to be killed.
    """
    from zephon_core.engine.processes import ProcessRunner

    runner = ProcessRunner(stage(big), workers=2, name="held")
    held = [runner.submit(elements(i, 2)).result(timeout=60) for i in range(0, 12, 2)]
    print(json.dumps({"prefix": runner.prefix, "pids": runner.pids, "held": len(held)}),
          flush=True)
    time.sleep(120)
    sys.exit(1)  # only reached if the test failed to kill this process


def second_pool() -> None:
    """Start and close a pool (it sweeps orphans at start): run in another PID namespace."""
    from zephon_core.engine.processes import ProcessRunner

    runner = ProcessRunner(stage(big), workers=1, name="neighbour")
    try:
        assert runner.submit(elements(0, 1)).result(timeout=60)[0][0] == 0
    finally:
        runner.close()
    print(json.dumps({"pid": os.getpid()}), flush=True)


class BusyStart(Map):
    """A Map whose setup burns `cpu_s` of CPU (imports, a model load): slower on a busy machine."""

    def __init__(self, fn: Any, cpu_s: float, name: str = "busy") -> None:
        super().__init__(fn, name=name)
        self.cpu_s = cpu_s

    def setup(self) -> None:
        end = time.process_time() + self.cpu_s
        while time.process_time() < end:
            pass


class ExitOnRestart(Map):
    """Starts once; every later worker exits with code 3 while starting (a broken restart)."""

    def __init__(self, fn: Any, marker: str, name: str = "restart") -> None:
        super().__init__(fn, name=name)
        self.marker = marker

    def setup(self) -> None:
        if os.path.exists(self.marker):
            os._exit(3)
        with open(self.marker, "w") as f:
            f.write(str(os.getpid()))


def burn_cpu(seconds: float) -> None:
    """A CPU burner for tests on a busy machine: spins until `seconds` have passed."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def spin_cpu_10ms(x: int) -> int:
    """Uses 10 ms of this thread's CPU (not wall time: a busy machine cannot shorten it)."""
    end = time.thread_time() + 0.01
    while time.thread_time() < end:
        pass
    return x


def plus_one(x: int) -> int:
    return x + 1


#: set by a driver script before it starts workers (tests/core/test_start_method.py)
DRIVER_MARK = 0


def seen_in_worker(x: int) -> int:
    """The worker's `DRIVER_MARK`: the driver's value in a forked worker, 0 in a spawned one."""
    return DRIVER_MARK


def sleep_then_size(payload: dict) -> int:
    """Sleeps ``payload["sleep"]`` seconds, then answers the size of ``payload["blob"]``
    (bytes, pickled into the group's message: a large one fills the worker's pipe)."""
    time.sleep(payload["sleep"])
    return len(payload["blob"])
