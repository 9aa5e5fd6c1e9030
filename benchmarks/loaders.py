"""One configuration of one loader, run to the end of the data (runs in its own process).

Every runner builds the same :class:`~zephon_bench.workload.Work`, starts the
clock when the loader is constructed (so time to first batch includes worker
start-up) and records two curves:

* *produced*: when each processed document (or zephon group of documents, seen
  by a stage observer) reached the main process, with its tokens and images.
  Steady-state rates are measured on this curve. It is what a long run
  delivers: a loader that holds finished documents back (zephon's lanes hold
  a few hundred: open packer bins and prefetched rows in each of 8 lanes)
  delivers them later, but at the same rate, so on a finite data set the
  *delivery* curve would first lag and then burst while that backlog drains.
* *batches*: when each batch of ``batch_rows`` packed rows was delivered
  (time to first batch, and the check that every sample was delivered).

Rows left after the last full batch are drained (zephon: `Loader.drain()`) and
counted, so every loader accounts for every sample. Only public names of
zephon are used here: the harness measures what a user can build.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from zephon_bench.workload import RowBatcher, Tally, Work, WorkSpec, stand_in

from zephon_core import Dropped, Origin, Pointer, StageEvent
from zephon_core.extend import Row
from zephon_core.internals import StageKind

now = time.monotonic  # one clock for every process of the machine (CLOCK_MONOTONIC)


class Trace:
    def __init__(self) -> None:
        self.t_start = now()
        self.t_first: float | None = None
        self.events: list[list[float]] = []
        self.produced: list[list[float]] = []
        self.tally = Tally()
        self.t_end: float | None = None
        self.extra: dict[str, Any] = {}

    def produce(self, docs: list[Any]) -> None:
        """Documents that reached the main process (Dropped ones count as samples)."""
        t = im = 0
        for d in docs:
            if not isinstance(d, Dropped):
                t += len(d["tokens"])
                im += int(d["costs"].get("images", 0))
        self.produced.append([now(), len(docs), t, im])

    def batch(self, rows: list[Row]) -> None:
        s, t, im = self.tally.add_rows(rows)
        ts = now()
        if self.t_first is None:
            self.t_first = ts
        self.events.append([ts, s, t, im])

    def tail(self, rows: list[Row], dropped: int) -> None:
        s, t, im = self.tally.add_rows(rows)
        self.tally.dropped += dropped
        self.t_end = now()
        self.extra["tail"] = {"rows": len(rows), "samples": s, "tokens": t}

    def report(self) -> dict:
        return {"t_start": self.t_start, "t_first": self.t_first, "t_end": self.t_end,
                "events": self.events, "produced": sorted(self.produced),
                "tally": self.tally.report(), "extra": self.extra}


# --- zephon ------------------------------------------------------------------

class LastStageWatch:
    """A zephon stage observer: when each group of the watched stage (`stage`: the last
    worker stage, the row decode after the packer where there is one, else the last
    transform before it) came back to the driver, and which documents it held (a row
    stage's group is a row: a document cut over two rows counts in both).

    Tokens and images per group are filled in after the run from the rows the documents
    ended up in (an observer sees no payloads): a document the packer refuses counts as
    a sample with no tokens.
    """

    def __init__(self) -> None:
        self.stage: int | None = None
        self.groups: list[tuple[float, tuple[Origin, ...]]] = []
        self.delivered: dict[tuple[int, int, int, int], tuple[int, int]] = {}

    def __call__(self, event: StageEvent) -> None:
        if event.stage == self.stage:
            self.groups.append((event.end, event.origins))

    def rows(self, rows: list[Row]) -> None:
        """Tokens and images of each document, from the rows it is in."""
        for row in rows:
            for seg in row.segments:
                o = seg.origin
                key = (o.dataset, o.shard, o.index, o.epoch)
                tokens, images = self.delivered.get(key, (0, 0))
                images = images or int((seg.payload.get("costs") or {}).get("images", 0))
                self.delivered[key] = (tokens + seg.length, images)

    def produced(self) -> list[list[float]]:
        out = []
        for t, origins in self.groups:
            done = [self.delivered.get((o.dataset, o.shard, o.index, o.epoch), (0, 0))
                    for o in origins]
            out.append([t, len(origins), sum(d[0] for d in done), sum(d[1] for d in done)])
        return out


def zephon_execution(flat: dict[str, Any]) -> Any:
    """The `Execution` of flat settings (``{"workers": "decode=2"}``; `Execution.from_flat`):
    the bench's "default" is `Execution()`'s, whatever it becomes."""
    from zephon_core import Execution

    return Execution.from_flat(flat)


def run_zephon(spec: WorkSpec, params: dict) -> Trace:
    """`params["execution"]`: flat `Execution` settings, e.g. ``{"workers": "decode=2"}``."""
    from zephon_core import Loader

    recipe = spec.per_sample_recipe()  # the stage timed decodes and tokenizes each sample
    ex = zephon_execution(dict(params.get("execution", {})))
    trace = Trace()
    watch = LastStageWatch()
    loader = Loader(recipe, 0, 1, ex, observer=watch)
    watch.stage = max(s.index for s in loader.plan.stages if s.kind is StageKind.TRANSFORM)
    try:
        trace.extra["plan"] = [f"{s.name}:{s.runner_kind}x{s.workers}"
                               for s in loader.plan.stages if s.kind is StageKind.TRANSFORM]
        dropped = 0
        while (rows := loader.next_rows()) is not None:
            trace.batch(rows)
            watch.rows(rows)
            dropped += len(loader.last_meta.drops)
        rest = loader.drain()  # the rows after the last full step, and the last drops
        watch.rows(rest.rows)
        trace.tail(rest.rows, dropped + len(rest.drops))
        trace.produced = watch.produced()
    finally:
        loader.close()
    return trace


# --- Grain -------------------------------------------------------------------

_SETUP_LOCK = threading.Lock()  # one per process: Grain's read threads share the map function


class GrainWork:
    """Grain map function: pointer -> (origin, document), zephon's fused operators inside.

    The operators are set up once per process under a lock: importing
    transformers from two threads at once fails (its lazy module is not
    thread-safe), which Grain's read threads would otherwise do.
    """

    def __init__(self, work: Work) -> None:
        self.work = work
        self._ready = False

    def __getstate__(self) -> dict:
        return {"work": self.work, "_ready": False}

    def __call__(self, item: tuple[int, Pointer]) -> tuple[Origin, Any]:
        if not self._ready:
            with _SETUP_LOCK:
                if not self._ready:
                    self.work.fn.setup()
                    self._ready = True
        seq, p = item
        return self.work.process(seq, p)


def grain_documents(work: Work, params: dict) -> Any:
    """Grain's per-sample map over the samples, read with `params`' threads and buffer."""
    import grain

    ds = grain.MapDataset.source(list(enumerate(work.pointers))).map(GrainWork(work))
    return ds.to_iter_dataset(grain.ReadOptions(num_threads=params.get("threads", 1),
                                                prefetch_buffer_size=params.get("buffer", 16)))


def grain_prefetch(ds: Any, params: dict) -> Any:
    """`ds` behind Grain's `mp_prefetch` with `params`' worker processes (none: as is)."""
    import grain

    if params.get("workers", 0) <= 0:
        return ds
    return ds.mp_prefetch(grain.MultiprocessingOptions(
        num_workers=params["workers"], per_worker_buffer_size=params.get("per_worker_buffer", 1)))


def run_grain(spec: WorkSpec, params: dict) -> Trace:
    work = Work.build(spec)
    batcher = RowBatcher(work.pack, spec.batch_rows, spec.seed)
    trace = Trace()
    it = iter(grain_prefetch(grain_documents(work, params), params))
    try:
        for origin, doc in it:
            trace.produce([doc])
            for rows in batcher.push(origin, doc):
                trace.batch(rows)
        trace.tail(batcher.finish(), batcher.dropped)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    return trace


# --- torch DataLoader -----------------------------------------------------------

class TorchWork:
    """A map-style torch Dataset over the same work; pixel rows travel as torch tensors."""

    def __init__(self, work: Work) -> None:
        self.work = work

    def __len__(self) -> int:
        return len(self.work.pointers)

    def __getitem__(self, i: int) -> tuple[Origin, Any]:
        import torch

        origin, doc = self.work.process(i, self.work.pointers[i])
        if not isinstance(doc, Dropped):
            # torch moves tensors (not numpy arrays) between processes through shared memory
            doc = {**doc, "pixel_values": [torch.from_numpy(p) for p in doc["pixel_values"]]}
        return origin, doc


def _list_collate(items: list) -> list:
    return items


def run_torch(spec: WorkSpec, params: dict) -> Trace:
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    work = Work.build(spec)
    batcher = RowBatcher(work.pack, spec.batch_rows, spec.seed)
    trace = Trace()
    workers = params.get("workers", 0)
    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs["prefetch_factor"] = params.get("prefetch_factor", 2)
        if params.get("start_method"):
            kwargs["multiprocessing_context"] = params["start_method"]
    dl = DataLoader(TorchWork(work), batch_size=params.get("batch_size", 8), shuffle=False,
                    num_workers=workers, collate_fn=_list_collate, **kwargs)
    for items in dl:
        for origin, doc in items:
            trace.produce([doc])
            if not isinstance(doc, Dropped):
                doc = {**doc, "pixel_values": [p.numpy() for p in doc["pixel_values"]]}
            for rows in batcher.push(origin, doc):
                trace.batch(rows)
    trace.tail(batcher.finish(), batcher.dropped)
    return trace


# --- the raw limit --------------------------------------------------------------

def _limit_worker(work: Work, share: list[tuple[int, Pointer]], ready: Any, start: Any,
                  out: Any) -> None:
    work.fn.setup()  # load the tokenizer before the clock starts, as every loader's worker does
    ready.put(os.getpid())
    start.wait()
    done = []
    for seq, p in share:
        _, doc = work.process(seq, p)
        done.append((now(), seq, None if isinstance(doc, Dropped) else stand_in(doc)))
    out.put(done)


def run_shares(work: Work, procs_n: int, target: Callable[..., None], *extra: Any) -> list:
    """``target(work, share, ready, start, out, *extra)`` in `procs_n` forked processes,
    each on its share of the samples; they start together once every one is ready.
    Returns what they put on ``out``, concatenated and sorted (by time first)."""
    ctx = mp.get_context("fork")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    items = list(enumerate(work.pointers))
    procs = [ctx.Process(target=target, args=(work, items[i::procs_n], ready, start, out, *extra),
                         daemon=True) for i in range(procs_n)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    start.set()
    done = []
    for _ in procs:
        done += out.get(timeout=900)
    for p in procs:
        p.join(timeout=10)
    done.sort(key=lambda x: x[0])
    return done


def run_limit(spec: WorkSpec, params: dict) -> Trace:
    """The same per-sample work in a tight loop in N processes: no loader, no transfer.

    The clock starts when every process has loaded its tokenizer; each process
    works through its share of the samples and keeps the results.
    """
    work = Work.build(spec)
    procs_n = params.get("processes", os.cpu_count() or 1)
    trace = Trace()
    done = run_shares(work, procs_n, _limit_worker)
    trace.t_end = done[-1][0]
    trace.t_first = done[0][0]
    trace.produced = [[t, 1, len(d["tokens"]), int(d["costs"].get("images", 0))]
                      if d is not None else [t, 1, 0, 0] for t, _, d in done]
    # replay the packer on the stand-ins (untimed): the same rows and drops a loader gives
    batcher = RowBatcher(work.pack, spec.batch_rows, spec.seed)
    rows: list[Row] = []
    for _, seq, doc in done:
        p = work.pointers[seq]
        origin = Origin(seq, p.dataset, p.shard, p.index, 0)
        for b in batcher.push(origin, Dropped("dropped") if doc is None else doc):
            rows += b
    rows += batcher.finish()
    trace.tally.add_rows(rows)
    trace.tally.dropped = batcher.dropped
    trace.extra["processes"] = procs_n
    return trace


RUNNERS = {"zephon": run_zephon, "grain": run_grain, "torch": run_torch, "limit": run_limit}
