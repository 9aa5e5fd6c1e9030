"""The worker process of `ProcessRunner`: its loop, how it starts lean, how it reports.

A worker runs one fused stage on the groups its driver sends, moves arrays
both ways through shared memory (`engine.shm`), and leaves with its driver:
it watches the parent's PID as well as the pipe, and removes the pool's
files once the driver is gone. What the driver says when a worker dies
(`death_cause`, `advice`) lives here beside it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from zephon_core.engine import shm
from zephon_core.engine.runner_base import timed_call
from zephon_core.ops.contract import StageFn

#: how often an idle worker checks that its driver still exists
PARENT_POLL_S = 0.5


def sendable_error(exc: BaseException) -> BaseException:
    """`exc` itself when it pickles (to cross to the driver), else a RuntimeError with
    its traceback as text."""
    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError("".join(traceback.format_exception(exc)))


def _driver_alive(conn: Connection, parent: int) -> bool:
    """Wait for a message; False once the driver is gone.

    The pipe alone is not enough: a process the driver forked may hold the
    driver's end open after the driver dies, so the parent PID is watched too.
    """
    while not conn.poll(PARENT_POLL_S):
        if os.getppid() != parent:
            return False
    return True


def start_method_now(requested: str) -> str:
    """The start method for a worker started now: `requested`, or for ``"auto"`` fork
    where it is safe, else spawn.

    A forked worker shares what the driver has loaded (libraries, the tokenizer), so it
    is ready in milliseconds and holds little memory of its own; a spawned one loads it
    all again (about 1 s of CPU for a Qwen tokenizer). Fork is unsafe beside threads that
    may hold a lock the child then needs, and in a process that has initialized CUDA,
    so ``"auto"`` forks only on Linux, when every other Python thread is zephon's own
    (the module locks a worker takes are renewed in the child: ``engine.shm``,
    ``data.remote``) and torch has not initialized CUDA. A training script's threads (a
    checkpointer, a logger) mean spawn.
    """
    if requested != "auto":
        return requested
    if not sys.platform.startswith("linux"):
        return "spawn"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "spawn"
    me = threading.current_thread()
    if any(t is not me and not t.name.startswith("zephon-") for t in threading.enumerate()):
        return "spawn"
    return "fork"


@contextlib.contextmanager
def lean_start(start_method: str, fn_bytes: bytes) -> Iterator[None]:
    """Processes started inside carry as little of the driver as they can.

    Spawn runs the parent's main module (a training script, the ``zephon-vl``
    command: torch and more) in every new process before unpickling its target:
    seconds and about 140 MB per worker before the first batch. A stage whose
    pickle names nothing of ``__main__`` never needs that, so while a worker is
    started the main module shows spawn no name or path to run (restored right
    after, under one lock: pools start replacements from their own threads).

    Fork shares the driver's pages until either side writes them, and the child's
    garbage collector would write every object header it inherited: the driver's
    objects are frozen (``gc.freeze``) across the fork so the child's collections
    skip them, and unfrozen in the driver right after.
    """
    main = sys.modules.get("__main__")
    if start_method == "fork":
        with _MAIN_LOCK:
            gc.freeze()
            try:
                yield
            finally:
                gc.unfreeze()
        return
    if start_method != "spawn" or main is None or b"__main__" in fn_bytes:
        yield
        return
    with _MAIN_LOCK:
        saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
        main.__dict__["__spec__"] = None
        main.__dict__.pop("__file__", None)
        try:
            yield
        finally:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


_MAIN_LOCK = threading.Lock()


def worker_main(conn: Connection, fn_bytes: bytes, prefix: str, pool_bytes: int) -> None:
    """Worker process: set the stage up in the main thread, then serve the driver's groups
    from a thread of its own (`_serve`).

    Why: glibc gives the main thread the process's main heap arena (a forked worker
    inherits the driver's, with all the driver allocated) and every other thread an arena
    of its own, and a loop whose short-lived allocations share an arena with a loaded
    model's long-lived ones pays for it. The same tokenizer calls cost 1.3-1.5 us of CPU a
    token from the main thread, 1.7 from a thread that also loaded the tokenizer, and
    1.0-1.2 from a thread apart from where it was loaded (bundled Qwen vocabulary, forked
    processes, 2026-12-07; `MALLOC_ARENA_MAX=1` makes every case slow). An error that
    escapes the loop is raised again here, so the worker exits as before (code 1, its
    traceback on stderr)."""
    parent = os.getppid()
    fn: StageFn = pickle.loads(fn_bytes)
    fn.setup()
    in_own_thread(_serve, conn, fn, prefix, pool_bytes, parent)


def in_own_thread(target: Callable[..., None], *args: Any) -> None:
    """``target(*args)`` in a new thread, waited for; what it raises is raised here. A
    process's work from a thread apart from its main one gets a heap arena of its own
    (`worker_main` says why that matters; the raw limits of the benchmarks use it too)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001 - raised again in the calling thread
            failed.append(exc)

    thread = threading.Thread(target=run, name="zephon-worker-loop", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def _serve(conn: Connection, fn: StageFn, prefix: str, pool_bytes: int, parent: int) -> None:
    """Worker loop: receive a group, run the stage, send results via shm."""
    pool = shm.SegmentPool(prefix, pool_bytes)
    conn.send(("ready", -1, None, ()))
    while _driver_alive(conn, parent):
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            pool.close()
            return
        task_id, packed, released = msg
        pool.release(released)
        try:
            out, cpu = timed_call(fn, shm.unpack(packed), time.process_time)
            reply = ("ok", task_id, pool.pack(out), cpu)
        except BaseException as exc:  # noqa: BLE001 - sent back to the parent
            reply = ("err", task_id, sendable_error(exc), ())
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            break
    pool.close()
    shm.abandon(prefix)


def death_cause(exitcode: int | None) -> str:
    """Why a worker ended, in words that point at the likely culprit."""
    if exitcode is None or exitcode >= 0:
        return f"exited with code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    if exitcode == -signal.SIGKILL:
        return f"was killed by {name} (likely out of memory: the kernel's OOM killer)"
    if exitcode == -signal.SIGBUS:
        return (f"was killed by {name}: shared memory ran out (/dev/shm: {shm.space()}), "
                "not a bad sample")
    return f"was killed by {name}"


def short_cause(exitcode: int | None) -> str:
    """``killed by SIGKILL`` or ``exited with code 3``: a key to count deaths by."""
    if exitcode is None or exitcode >= 0:
        return f"exited with code {exitcode}"
    try:
        return f"killed by {signal.Signals(-exitcode).name}"
    except ValueError:
        return f"killed by signal {-exitcode}"


def death_advice(exitcode: int | None) -> str:
    if exitcode == -signal.SIGKILL:
        return "use fewer workers or give the job more memory (see `dmesg` for the OOM killer)"
    if exitcode == -signal.SIGBUS:
        return ("give /dev/shm more room (docker run --shm-size=8g), or use fewer workers")
    return ""
