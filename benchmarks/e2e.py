"""Delivered training batches: every loader packs, batches and collates, as its users would.

Each runner here ends where a training loop begins: the main process holds a
collated batch (the recipe's own collate: ``input``/``labels``/``positions``,
``pixel_values``, ``grid_thw``, ...), ready to go to the device. The clock
records when each batch reached the main process; steady-state rates are
measured on that curve (*delivered*). The per-sample work is
:class:`~zephon_bench.workload.Work`, the packer is the recipe's, the collate
is the recipe's (``Work.collate``), so every loader does the same work and
hands over the same kind of batch:

* zephon-vl: ``for batch in Loader(...)``, the public API, nothing else;
* Grain: per-sample ``map``, packing as a Grain ``IterDataset`` and Grain's
  ``batch(batch_fn=collate)`` before ``mp_prefetch``, so workers pack and
  collate (Grain's ``FirstFitPackIterDataset``/``BestFitPackIterDataset``
  pack fixed-length token features only: they cannot keep a row's images with
  its tokens or cap images per row, so the recipe's packer runs inside a
  Grain ``IterDataset``);
* torch DataLoader: an ``IterableDataset`` that packs its worker's share,
  ``batch_size`` rows per batch and ``collate_fn`` in the workers;
* SPDL: ``PipelineBuilder`` with the per-sample work on a process pool, the
  packer as an ``Aggregator``, the collate on SPDL's thread pool;
* Megatron-Energon: a ``TaskEncoder`` over a crude dataset, the packer in its
  packing hooks, the collate as its ``batch`` (:mod:`zephon_bench.energon_e2e`);
* the raw limit (:mod:`zephon_bench.raw_limit`): the same work, packing and
  collate in N processes or threads with no loader, each batch handed to the
  main process the cheapest way.

A worker's packer sees only its own share of the samples, so rows differ
between loaders; the check is on what every batch carries: the samples
(shard, index, tokens: an order-free checksum), images, patch rows and drops.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from zephon_bench.loaders import LastStageWatch, Trace, now, zephon_execution
from zephon_bench.workload import Work, WorkSpec, sample_checksum

from zephon_core import Dropped, Origin, Pointer
from zephon_core.extend import Row
from zephon_core.internals import StageKind

SIDE_KEYS = ("bench_samples", "bench_dropped")


def sample_ids(rows: Iterable[Row]) -> np.ndarray:
    """int64 ``[samples, 3]``: (shard, index, tokens) of every segment, for the check."""
    ids = [(s.origin.shard, s.origin.index, s.end - s.start) for r in rows for s in r.segments]
    return np.asarray(ids, dtype=np.int64).reshape(-1, 3)


def packed_rows(work: Work, docs: Iterable[tuple[Origin, Any]]) -> Iterator[tuple[Row, int]]:
    """The recipe's packer over `docs`: each row with the drops decided since the last row."""
    packer = work.pack.make(0, work.spec.seed)
    dropped = 0
    for origin, doc in docs:
        if isinstance(doc, Dropped) or packer.push(origin, doc) is not None:
            dropped += 1
        while (row := packer.pop_row()) is not None:
            yield row, dropped
            dropped = 0
    packer.flush()
    while (row := packer.pop_row()) is not None:
        yield row, dropped
        dropped = 0


def collate_rows(work: Work, items: list[tuple[Row, int]], as_numpy: bool = False) -> dict:
    """The recipe's collate of the rows, plus the samples and drops they carry (``bench_*``)."""
    rows = [r for r, _ in items]
    batch = dict(work.collate(rows))
    batch["bench_samples"] = sample_ids(rows)
    batch["bench_dropped"] = np.int64(sum(d for _, d in items))
    if as_numpy:
        return {k: v.numpy() if hasattr(v, "numpy") else v for k, v in batch.items()}
    import torch

    return {k: torch.as_tensor(v) for k, v in batch.items()}


def deliver(trace: Trace, batch: dict, ids: np.ndarray, dropped: int,
            pixels: bool = False) -> None:
    """Record one delivered batch: its time, samples, tokens and images, and the checks."""
    t = now()
    if trace.t_first is None:
        trace.t_first = t
    ids = np.asarray(ids)
    tally = trace.tally
    n, tokens, images = len(ids), int(ids[:, 2].sum()), int(batch["grid_thw"].shape[0])
    tally.samples += n
    tally.tokens += tokens
    tally.images += images
    tally.rows += int(batch["input"].shape[0])
    tally.dropped += int(dropped)
    tally.patches += int(batch["grid_thw"].prod(dim=1).sum())
    for shard, index, tok in ids.tolist():
        tally.checksum = (tally.checksum + sample_checksum(shard, index, tok)) % (1 << 64)
    if pixels:
        tally.pixel_sum = (tally.pixel_sum + pixel_sum(batch["pixel_values"])) % (1 << 64)
    trace.events.append([t, n, tokens, images])


def pixel_sum(pv: Any) -> int:
    """Order-free exact fingerprint of patch rows (uint8 values, or float32 bit patterns)."""
    a = np.asarray(pv)
    if a.dtype == np.float32:
        a = a.view(np.uint32)
    return int(a.sum(dtype=np.uint64))


def _side(batch: dict) -> tuple[np.ndarray, int]:
    return np.asarray(batch.pop("bench_samples")), int(batch.pop("bench_dropped"))


def _finish(trace: Trace) -> Trace:
    trace.t_end = trace.events[-1][0] if trace.events else now()
    trace.produced = trace.events
    return trace


# --- zephon ------------------------------------------------------------------

def run_zephon(spec: WorkSpec, params: dict) -> Trace:
    """``for batch in Loader(recipe, 0, 1, execution)``; `params["execution"]`: flat `Execution`
    settings (`Execution.from_flat`), `params["background"]`: the loader's driver thread,
    `params["pack"]`: more pack settings of the recipe (``decode_after_pack``)."""
    from zephon_core import Loader

    recipe = spec.recipe(params.get("pack"))
    ex = zephon_execution(dict(params.get("execution", {})))
    pixels = bool(params.get("pixels"))
    trace = Trace()
    watch = LastStageWatch()
    loader = Loader(recipe, 0, 1, ex, observer=watch, background=bool(params.get("background")))
    # the last worker stage: the row decode after the packer where the recipe has one
    workers = [s for s in loader.plan.stages if s.kind in (StageKind.TRANSFORM, StageKind.ROWS)]
    watch.stage = max(s.index for s in workers)
    try:
        trace.extra["plan"] = [f"{s.name}:{s.runner_kind}x{s.workers}" for s in workers]
        for batch in loader:
            meta = loader.last_meta
            ids = np.asarray([(o.shard, o.index, e - s) for row in meta.rows
                              for o, s, e in row], dtype=np.int64).reshape(-1, 3)
            deliver(trace, batch, ids, len(meta.drops), pixels)
        rest = loader.drain()  # the rows after the last full step, and the last drops
        if rest.rows:
            deliver(trace, recipe.collate(rest.rows), sample_ids(rest.rows), 0, pixels)
        trace.tally.dropped += len(rest.drops)
        trace.extra["stage_groups"] = [[t, len(o)] for t, o in watch.groups]
        if loader.sizer is not None:  # workers="auto": the splits it applied, and when
            trace.extra["auto_changes"] = loader.sizer.changes
    finally:
        loader.close()
    return _finish(trace)


# --- Grain -------------------------------------------------------------------

class GrainCollate:
    """Grain ``batch_fn``: the recipe's collate as numpy arrays (they travel via shared memory)."""

    def __init__(self, work: Work) -> None:
        self.work = work

    def __call__(self, items: list[tuple[Row, int]]) -> dict:
        return collate_rows(self.work, list(items), as_numpy=True)


def run_grain(spec: WorkSpec, params: dict) -> Trace:
    import torch
    from zephon_bench.grain_pack import PackRows
    from zephon_bench.loaders import grain_documents, grain_prefetch

    work = Work.build(spec)
    trace = Trace()
    ids = PackRows(grain_documents(work, params), work).batch(spec.batch_rows,
                                                              batch_fn=GrainCollate(work))
    it = iter(grain_prefetch(ids, params))
    try:
        for batch in it:
            samples, dropped = _side(batch)
            batch = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
            deliver(trace, batch, samples, dropped, bool(params.get("pixels")))
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    return _finish(trace)


# --- torch DataLoader -----------------------------------------------------------

class TorchRows:
    """An ``IterableDataset`` of packed rows: each worker processes and packs its share."""

    def __init__(self, work: Work) -> None:
        self.work = work

    def __iter__(self) -> Iterator[tuple[Row, int]]:
        from torch.utils.data import get_worker_info

        items = list(enumerate(self.work.pointers))
        info = get_worker_info()
        if info is not None:
            items = items[info.id::info.num_workers]
        return packed_rows(self.work, (self.work.process(i, p) for i, p in items))


class TorchCollate:
    def __init__(self, work: Work) -> None:
        self.work = work

    def __call__(self, items: list[tuple[Row, int]]) -> dict:
        return collate_rows(self.work, items)


def run_torch(spec: WorkSpec, params: dict) -> Trace:
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    torch.set_num_threads(1)
    work = Work.build(spec)
    trace = Trace()
    workers = params.get("workers", 0)
    kwargs: dict[str, Any] = {"prefetch_factor": params.get("prefetch_factor", 2)} \
        if workers > 0 else {}
    ds = type("TorchRowsDataset", (TorchRows, IterableDataset), {})(work)
    dl = DataLoader(ds, batch_size=spec.batch_rows, num_workers=workers,
                    collate_fn=TorchCollate(work), **kwargs)
    for batch in dl:
        samples, dropped = _side(batch)
        deliver(trace, batch, samples, dropped, bool(params.get("pixels")))
    return _finish(trace)


# --- SPDL ------------------------------------------------------------------------

_SPDL_WORK: list[Work] = []


def _spdl_init(work: Work) -> None:
    work.fn.setup()
    _SPDL_WORK[:] = [work]


def _spdl_process(item: tuple[int, Pointer]) -> tuple[Origin, Any]:
    return _SPDL_WORK[0].process(*item)


def _spdl_aggregator(work: Work) -> Any:
    from spdl.pipeline.defs import Aggregator

    class PackBatches(Aggregator):
        """The recipe's packer as an SPDL aggregator: documents in, batches of rows out."""

        def __init__(self) -> None:
            self.packer = work.pack.make(0, work.spec.seed)
            self.rows: list[tuple[Row, int]] = []
            self.dropped = 0

        def _pop(self) -> None:
            while (row := self.packer.pop_row()) is not None:
                self.rows.append((row, self.dropped))
                self.dropped = 0

        def accumulate(self, item: tuple[Origin, Any]) -> list | None:
            origin, doc = item
            if isinstance(doc, Dropped) or self.packer.push(origin, doc) is not None:
                self.dropped += 1
            self._pop()
            if len(self.rows) >= work.spec.batch_rows:
                out, self.rows = self.rows[:work.spec.batch_rows], self.rows[work.spec.batch_rows:]
                return out
            return None

        def flush(self) -> list | None:
            self.packer.flush()
            self._pop()
            out, self.rows = self.rows, []
            return out or None

    return PackBatches()


def run_spdl(spec: WorkSpec, params: dict) -> Trace:
    from concurrent.futures import ProcessPoolExecutor

    from spdl.pipeline import PipelineBuilder

    work = Work.build(spec)
    workers = params.get("workers", 2)
    trace = Trace()
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                               initializer=_spdl_init, initargs=(work,))
    pipeline = (PipelineBuilder()
                .add_source(list(enumerate(work.pointers)))
                .pipe(_spdl_process, executor=pool, concurrency=params.get("concurrency",
                                                                           2 * workers),
                      output_order="input")
                .aggregate(_spdl_aggregator(work))
                .pipe(lambda items: collate_rows(work, items))
                .add_sink(params.get("buffer", 2))
                .build(num_threads=params.get("threads", 2)))
    try:
        with pipeline.auto_stop():
            for batch in pipeline:
                samples, dropped = _side(batch)
                deliver(trace, batch, samples, dropped, bool(params.get("pixels")))
    finally:
        pool.shutdown(cancel_futures=True)
    return _finish(trace)


# --- the raw limit ----------------------------------------------------------------

def run_limit(spec: WorkSpec, params: dict) -> Trace:
    """The raw limit (:mod:`zephon_bench.raw_limit`): the same work, packing and collate
    with no loader, in processes or threads, each batch handed to the main process."""
    from zephon_bench.raw_limit import run_limit as run

    return run(spec, params)


RUNNERS = {"zephon": run_zephon, "grain": run_grain, "torch": run_torch, "spdl": run_spdl,
           "limit": run_limit}


def run_energon(spec: WorkSpec, params: dict) -> Trace:
    """Megatron-Energon (:mod:`zephon_bench.energon_e2e`; needs ``megatron-energon``)."""
    from zephon_bench.energon_e2e import run_energon as run

    return run(spec, params)


RUNNERS["energon"] = run_energon
