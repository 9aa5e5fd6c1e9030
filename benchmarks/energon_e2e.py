"""Megatron-Energon delivering the benchmark's training batches, as an Energon user writes it.

* Data: a copy of the demo shards, prepared once with ``energon prepare
  --non-interactive --split-ratio 1,0,0 --sample-type CrudeWebdataset`` (the
  shards mix captions, conversations, interleaved documents and videos; only a
  crude dataset reads them all). The copy keeps ``.nv-meta/`` out of zephon's
  cache.
* ``get_train_dataset(repeat=False)`` with Energon's shuffle buffer, a
  ``WorkerConfig`` and ``get_loader`` (torch DataLoader workers, persistent
  across passes); one pass per epoch, every sample once.
* The ``TaskEncoder``: ``decoder = None`` and a pass-through cooker hand the raw
  member bytes to ``encode_sample``, which runs zephon's decode + tokenize
  (:meth:`Work.process_read`, the same operators every loader runs after its
  read). ``select_samples_to_pack`` runs the recipe's packer over Energon's
  packing buffer (flushed at the end of each buffer) and
  ``pack_selected_samples`` hands over the row it built; ``batch`` is the
  recipe's collate. Everything but the loop below runs in Energon's workers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_bench.e2e import _finish, _side, collate_rows, deliver
from zephon_bench.loaders import Trace
from zephon_bench.workload import Work, WorkSpec

from zephon_core import Dropped, Origin, Pointer
from zephon_core.extend import Row

#: Energon's packing buffer: documents the packer sees at once (its open bins are flushed
#: at the end of each buffer, so a larger one fills rows better)
PACKING_BUFFER = 256


def prepare(spec: WorkSpec, root: Path) -> Path:
    """Copy the spec's shards to `root` and run ``energon prepare`` there (once; reused
    while the shard names and sizes match)."""
    root.mkdir(parents=True, exist_ok=True)
    names = []
    for shard in spec.shards:
        src, dst = Path(shard), root / Path(shard).name
        if not dst.exists() or dst.stat().st_size != src.stat().st_size:
            shutil.copyfile(src, dst)
            shutil.rmtree(root / ".nv-meta", ignore_errors=True)
        names.append(dst.name)
    stamp = root / ".nv-meta" / "zephon-shards.txt"
    if stamp.exists() and stamp.read_text() == "\n".join(names):
        return root
    exe = Path(sys.executable).with_name("energon")
    cmd = [str(exe) if exe.exists() else "energon", "prepare", "--non-interactive",
           "--split-ratio", "1,0,0", "--sample-type", "CrudeWebdataset", "--no-progress",
           "--force-overwrite", str(root)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}):\n"
                           f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    stamp.write_text("\n".join(names))
    return root


@dataclass
class Doc:
    """One encoded sample; the row the packer made rides on one document of its group,
    and a document the packer refused is marked ``dropped`` (counted by its group)."""

    origin: Origin
    doc: Any
    row: Row | None = None
    dropped: int = 0


def _raw(sample: dict) -> dict:
    return sample


def make_task_encoder(work: Work, where: dict[tuple[str, str], tuple[int, Pointer]]) -> Any:
    import megatron.energon as me

    raw = me.stateless(_raw)

    class ZephonTaskEncoder(me.DefaultTaskEncoder):
        decoder = None  # the bytes go to zephon's decode untouched
        cookers = [me.Cooker(raw)]

        def __init__(self) -> None:
            super().__init__()
            self.ready = False

        def encode_sample(self, sample: dict) -> Doc:
            if not self.ready:
                work.after_read.setup()
                self.ready = True
            seq, p = where[(sample["__shard__"], sample["__key__"])]
            members = {k: v for k, v in sample.items() if not k.startswith("__")}
            origin, doc = work.process_read(
                seq, p, {"__key__": sample["__key__"], "__shard__": sample["__shard__"],
                         **members})
            return Doc(origin, doc)

        def select_samples_to_pack(self, samples: list[Doc]) -> list[list[Doc]]:
            packer = work.pack.make(0, work.spec.seed)
            by_origin = {d.origin: d for d in samples}
            dropped: list[Doc] = []
            rows: list[Row] = []
            for d in samples:
                if isinstance(d.doc, Dropped) or packer.push(d.origin, d.doc) is not None:
                    dropped.append(d)
                while (row := packer.pop_row()) is not None:
                    rows.append(row)
            packer.flush()
            while (row := packer.pop_row()) is not None:
                rows.append(row)
            groups = [[by_origin[seg.origin] for seg in row.segments] for row in rows]
            for group, row in zip(groups, rows, strict=True):
                group[0].row = row
            for d in dropped:
                d.dropped = 1
            if dropped:
                groups[:1] = [dropped + groups[0]] if groups else [dropped]
            return groups

        def pack_selected_samples(self, samples: list[Doc]) -> tuple[Row | None, int]:
            row = next((d.row for d in samples if d.row is not None), None)
            return row, sum(d.dropped for d in samples)

        def batch(self, samples: list[tuple[Row | None, int]]) -> dict:
            rows = [(r, d) for r, d in samples if r is not None]
            batch = collate_rows(work, rows)
            batch["bench_dropped"] += sum(d for r, d in samples if r is None)
            return batch

    return ZephonTaskEncoder()


def run_energon(spec: WorkSpec, params: dict) -> Trace:
    """`params`: ``data`` (a folder prepared by :func:`prepare`; made in a temp folder when
    missing), ``workers``, ``prefetch_factor``, ``shuffle_buffer``, ``packing_buffer``."""
    import tempfile

    import megatron.energon as me
    import torch

    from zephon_vl import WebDatasetReader

    torch.set_num_threads(1)
    work = Work.build(spec)
    data = params.get("data") or prepare(spec, Path(tempfile.mkdtemp(prefix="energon-")))
    reader = WebDatasetReader(list(spec.shards))
    where: dict[tuple[str, str], tuple[int, Pointer]] = {}
    for s in range(reader.num_shards):
        idx = reader.index(s)
        for i, key in enumerate(idx.keys):
            where[(idx.name, key)] = (len(where), Pointer(0, s, i))
    trace = Trace()
    wc = me.WorkerConfig(rank=0, world_size=1, num_workers=params.get("workers", 0))
    ds = me.get_train_dataset(
        str(data), split_part="train", worker_config=wc, batch_size=spec.batch_rows,
        shuffle_buffer_size=params.get("shuffle_buffer", 100), max_samples_per_sequence=100,
        packing_buffer_size=params.get("packing_buffer", PACKING_BUFFER),
        task_encoder=make_task_encoder(work, where), repeat=False)
    loader = me.get_loader(ds, prefetch_factor=params.get("prefetch_factor", 2))
    pixels = bool(params.get("pixels"))
    for _ in range(spec.epochs):
        for batch in loader:
            samples, dropped = _side(batch)
            deliver(trace, batch, samples, dropped, pixels)
    return _finish(trace)
