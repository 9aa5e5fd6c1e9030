"""The raw limit of the delivered-batch runs: the recipe's work and collate, no loader.

An upper bound is only one if nothing that a loader can do is left out of it.
So the limit runs the recipe's own operators on every sample (``Work.process``:
read, decode with the recipe's ``ImageSettings`` -- reduced-scale JPEG decode
exactly when the recipe sets ``draft`` --, tokenize), the recipe's packer and
collate, hands each collated batch to the main process the cheapest way, and
is measured like every loader (the harness's clock, steady window and process
tree). What it leaves out is the loader: no lanes, no shuffle buffer, no
ordering, no checkpointable state, no per-stage queues. It tries three
arrangements; the harness takes the best of them as "the limit":

* ``{"processes": N}``: N forked processes (``"start_method": "spawn"``:
  spawned ones, which do not share the parent's heap), each set up in its main
  thread and working from a side thread as zephon's workers do
  (`zephon_core.internals.in_own_thread`);
  each takes the next
  sample from a shared counter (no process waits while another still has a
  share to finish), packs what it took, collates ``batch_rows`` rows and
  sends the batch through shared memory: zephon's own `SegmentPool` (files
  each process keeps and reuses, so no page is zeroed twice) and `unpack`
  (the main process maps them; no pixel is pickled or copied). The main
  process only receives.
* ``{"threads": N}``: N threads in the main process, each with its own packer
  (decode and resize release the GIL); a batch is handed over as a Python
  object: no copy at all.

The clock starts before the workers are made (start-up is in the time to the
first batch, as for every loader); the steady window leaves it out.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import numpy as np
from zephon_bench.e2e import _finish, _side, collate_rows, deliver, packed_rows
from zephon_bench.loaders import Trace
from zephon_bench.workload import Work, WorkSpec

from zephon_core import Pointer
from zephon_core.extend import Row

#: shared-memory files one worker process may keep for the batches in flight
POOL_BYTES = 512 << 20
#: the prefix of those files in /dev/shm (a leftover one names the benchmark)
SHM_PREFIX = "zephon-bench-limit-"
#: seconds the main process waits for a worker's next message before it gives up
WAIT_S = 900.0


def run_limit(spec: WorkSpec, params: dict) -> Trace:
    """The raw limit in the arrangement `params` names (module docstring)."""
    work = Work.build(spec)
    trace = Trace()
    pixels = bool(params.get("pixels"))
    if params.get("threads"):
        n = int(params["threads"])
        _run_threads(work, n, trace, pixels)
        trace.extra["arrangement"] = f"{n} threads"
    else:
        n = int(params.get("processes") or os.cpu_count() or 1)
        method = params.get("start_method", "fork")
        _run_processes(work, n, method, trace, pixels)
        trace.extra["arrangement"] = f"{n} processes ({method})"
        trace.extra["processes"] = n
    return _finish(trace)


def batches(work: Work, docs: Iterator[tuple[Any, Any]]) -> Iterator[list[tuple[Row, int]]]:
    """The recipe's packer over `docs`, `batch_rows` rows at a time (the last one shorter)."""
    batch: list[tuple[Row, int]] = []
    for item in packed_rows(work, docs):
        batch.append(item)
        if len(batch) == work.spec.batch_rows:
            yield batch
            batch = []
    if batch:
        yield batch


# --- threads ---------------------------------------------------------------------

def _run_threads(work: Work, n: int, trace: Trace, pixels: bool) -> None:
    work.fn.setup()
    items = iter(list(enumerate(work.pointers)))
    lock = threading.Lock()
    out: queue.Queue = queue.Queue()

    def claim() -> tuple[int, Pointer] | None:
        with lock:
            return next(items, None)

    def worker() -> None:
        try:
            docs = (work.process(*item) for item in iter(claim, None))
            for batch in batches(work, docs):
                out.put(("batch", collate_rows(work, batch)))
            out.put(("done", None))
        except BaseException:  # noqa: BLE001 - the main thread raises it with its traceback
            out.put(("error", traceback.format_exc()))

    threads = [threading.Thread(target=worker, name=f"raw-limit-{i}", daemon=True)
               for i in range(n)]
    for t in threads:
        t.start()
    done = 0
    while done < n:
        kind, payload = out.get(timeout=WAIT_S)
        if kind == "batch":
            ids, dropped = _side(payload)
            deliver(trace, payload, ids, dropped, pixels)
        elif kind == "done":
            done += 1
        else:
            raise RuntimeError(f"a raw-limit thread failed:\n{payload}")
    for t in threads:
        t.join(timeout=10)


# --- processes -------------------------------------------------------------------

def _claim(counter: Any, n: int) -> int | None:
    with counter.get_lock():
        i = counter.value
        if i >= n:
            return None
        counter.value = i + 1
    return i


def _worker(work: Work, items: list[tuple[int, Pointer]], counter: Any, wid: int,
            ready: Any, start: Any, finish: Any, out: Any, freed: Any) -> None:
    """One process: set up in its main thread, wait for the start, then take samples until
    none is left from a side thread (`zephon_core.internals.in_own_thread`), sending each
    collated batch through its pool; the files stay until `finish`."""
    from zephon_core.internals import SegmentPool, in_own_thread

    pool = None
    try:
        try:
            work.fn.setup()  # the tokenizer, before the steady part, as every loader's
            pool = SegmentPool(SHM_PREFIX, max_bytes=POOL_BYTES)
        finally:
            ready.put(wid)  # a set-up that failed is reported on `out` below
        start.wait()
        in_own_thread(_send_batches, work, items, counter, wid, out, freed, pool)
        out.put((wid, "done", None))
        finish.wait(WAIT_S)  # the main process has mapped every file sent
    except BaseException:  # noqa: BLE001 - the main process raises it with its traceback
        out.put((wid, "error", traceback.format_exc()))
    finally:
        if pool is not None:
            pool.close()


def _send_batches(work: Work, items: list[tuple[int, Pointer]], counter: Any, wid: int,
                  out: Any, freed: Any, pool: Any) -> None:
    docs = (work.process(*items[i]) for i in iter(lambda: _claim(counter, len(items)), None))
    for batch in batches(work, docs):
        while freed.poll():  # the files of the batches the main process let go of
            pool.release([freed.recv()])
        out.put((wid, "batch", pool.pack([collate_rows(work, batch, as_numpy=True)])))


def _run_processes(work: Work, n: int, method: str, trace: Trace, pixels: bool) -> None:
    ctx = mp.get_context(method)
    ready, out, start, finish = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    counter = ctx.Value("q", 0)
    items = list(enumerate(work.pointers))
    pipes = [ctx.Pipe(duplex=False) for _ in range(n)]
    procs = [ctx.Process(target=_worker, daemon=True, name=f"raw-limit-{i}",
                         args=(work, items, counter, i, ready, start, finish, out, pipes[i][0]))
             for i in range(n)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=300)
        start.set()
        _receive(out, n, [w for _, w in pipes], trace, pixels)
    finally:
        finish.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def _receive(out: Any, n: int, freed: list[Any], trace: Trace, pixels: bool) -> None:
    """Deliver the workers' batches until each has said it is done."""
    import torch

    from zephon_core.internals import unpack

    done = 0
    while done < n:
        try:
            wid, kind, payload = out.get(timeout=WAIT_S)
        except queue.Empty:
            raise RuntimeError(f"the raw limit's workers sent nothing for {WAIT_S:.0f} s "
                               f"({done} of {n} done)") from None
        if kind == "batch":
            (batch,) = unpack(payload, on_release=freed[wid].send)
            ids, dropped = _side(batch)
            deliver(trace, {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}, ids,
                    dropped, pixels)
            del batch
        elif kind == "done":
            done += 1
        else:
            raise RuntimeError(f"raw-limit process {wid} failed:\n{payload}")
