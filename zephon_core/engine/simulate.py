"""Rank simulation and the "save on D, resume on D'" harness: the one implementation.

`SimulatedRanks` runs `D` data-parallel ranks in one process and assembles
every global batch; `ElasticRun` runs them on shared runners, saves the
global state at step `k` and resumes it on each `D'`, yielding a `StepRecord`
per global step (batch digest, token and row counts, and with `ledger` the
step's ledger line). `run_digests` is its one-call form behind
`zephon-vl digest`; `demo`, `elastic-demo` and `replay` use it too. For real
torch.distributed ranks, `gathered_batch_digest` is the same batch digest
over the ranks' local batches.

The digests must not change with `D`, with the execution knobs, or across a
save on `D` ranks and a resume on `D'` ranks through the same JSON a user
would store.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephon_core.common.digest import batch_digest
from zephon_core.engine.checkpoint import merge_states
from zephon_core.engine.execution import Execution
from zephon_core.engine.ledger import LedgerWriter, end_entry, reader_keys, step_entry
from zephon_core.engine.loader import Loader
from zephon_core.engine.plan import Plan
from zephon_core.engine.runner_base import Runner
from zephon_core.engine.steps import lane_drops
from zephon_core.errors import NoRowsError
from zephon_core.ops.pack import Row
from zephon_core.spec import Recipe, check_rank_count


@dataclass
class GlobalStep:
    batch: dict
    rows: list[Row]
    #: the step's ledger line (`zephon_core.engine.ledger`), with digests on
    ledger: dict | None = None

    @property
    def tokens(self) -> int:
        return sum(r.num_tokens for r in self.rows)

    @property
    def drops(self) -> int:
        return sum(len(r.drops) for r in self.rows)

    @property
    def documents(self) -> int:
        """Documents that start in this batch (a split document counts once)."""
        return sum(1 for r in self.rows for s in r.segments if s.start == 0)


@dataclass
class StepRecord:
    step: int
    sha256: str
    dp: int
    phase: str
    rows: int
    tokens: int
    fill: float
    drops: int
    seconds: float
    #: the global step itself (batch, rows, ledger line); not part of `report`
    out: GlobalStep | None = field(default=None, repr=False, compare=False)

    def report(self) -> dict:
        """The step as ``zephon-vl digest`` prints it: for people and tools, never read back."""
        return {"step": self.step, "sha256": self.sha256, "dp": self.dp, "phase": self.phase,
                "rows": self.rows, "tokens": self.tokens, "fill": round(self.fill, 4),
                "drops": self.drops, "seconds": round(self.seconds, 4)}


class SimulatedRanks:
    """`D` loaders sharing one set of runners (one process pool per stage, not one per rank).

    With `digests`, each global step carries its ledger line, merged from
    the ranks' lane entries exactly as rank 0 of a real run writes it.
    """

    def __init__(self, recipe: Recipe, dp: int, execution: Execution,
                 runners: dict[int, Runner], digests: bool = False) -> None:
        check_rank_count(dp)
        self.recipe = recipe
        self.dp = dp
        self.digests = digests
        self.loaders = [Loader(recipe, d, dp, execution, runners=runners, gather=False,
                               digests=digests) for d in range(dp)]
        #: the local batches of the last step asked for, rank by rank: when a later rank
        #: had none (the end of the data), those the earlier ranks delivered
        self.partial: list[tuple[Loader, list[Row]]] = []

    @property
    def step(self) -> int:
        return self.loaders[0].step

    def global_step(self) -> GlobalStep | None:
        """The global batch, collated from all ranks' rows in rank order."""
        rows = []
        self.partial = []
        for loader in self.loaders:
            local = loader.next_rows()
            if local is None:
                return None
            rows += local
            self.partial.append((loader, local))
        ledger = None
        if self.digests:
            entries = {lane: e for ld in self.loaders
                       for lane, e in (ld.last_meta.ledger or {}).items()}  # type: ignore[union-attr]
            ledger = step_entry(self.loaders[0].last_meta.step,  # type: ignore[union-attr]
                                entries, len(self.recipe.datasets))
        return GlobalStep(self.recipe.collate(rows), rows, ledger)

    def state_json(self) -> str:
        return json.dumps(merge_states([ld.local_state_dict() for ld in self.loaders]),
                          sort_keys=True)

    def load(self, state_json: str | dict, global_batch_size: int | None = None,
             allow_lane_change: bool = False) -> None:
        state = json.loads(state_json) if isinstance(state_json, str) else state_json
        for loader in self.loaders:
            loader.load_state_dict(state, global_batch_size, allow_lane_change)

    def explain(self) -> str:
        return self.loaders[0].explain()


def resumed_ledger_path(path: str | os.PathLike, dp: int) -> Path:
    """Where a resume on `dp` ranks writes its ledger: ``run.jsonl`` -> ``run.resumed-d4.jsonl``."""
    p = Path(path)
    return p.with_name(f"{p.stem}.resumed-d{dp}{p.suffix or '.jsonl'}")


class ElasticRun:
    """Simulated ranks on one set of runners: run on `D`, save at step `k`, resume on each `D'`.

    `ledger` (a path): the run on `D` writes it, each resume on `D'` writes
    `resumed_ledger_path(ledger, D')`; compare them with `zephon-vl verify`.
    """

    def __init__(self, make_recipe: Callable[[], Recipe], execution: Execution | None = None,
                 ledger: str | os.PathLike | None = None, digests: bool = False) -> None:
        self.make_recipe = make_recipe
        self.execution = execution or Execution()
        self.ledger = ledger
        self.digests = digests or ledger is not None
        self.recipe = make_recipe()
        self.runners = Plan(self.recipe.ops, self.execution, digests=self.digests,
                            row_ops=self.recipe.row_ops).make_runners()
        self.state: str | None = None

    def ranks(self, dp: int, recipe: Recipe | None = None) -> SimulatedRanks:
        return SimulatedRanks(recipe or self.make_recipe(), dp, self.execution, self.runners,
                              self.digests)

    def steps(self, sim: SimulatedRanks, stop: int, phase: str,
              writer: LedgerWriter | None = None) -> Iterator[StepRecord]:
        """Global steps from `sim`'s current step up to `stop` (fewer at the end of the data)."""
        for t in range(sim.step, stop):
            t0 = time.perf_counter()
            out = sim.global_step()
            if out is None:
                if t == 0:
                    raise nothing_delivered(sim, writer)
                return
            capacity = len(out.rows) * sim.recipe.seq_len
            if writer is not None and out.ledger is not None:
                writer.write(out.ledger)
            yield StepRecord(t, batch_digest(out.batch), sim.dp, phase,
                             len(out.rows), out.tokens, out.tokens / capacity,
                             out.drops, time.perf_counter() - t0, out)

    def _writer(self, path: str | os.PathLike | None, recipe: Recipe) -> LedgerWriter | None:
        return LedgerWriter(path, recipe.fingerprint()) if path is not None else None

    def run(self, dp: int, steps: int, save_at: int | None = None,
            resume_dp: list[int] | None = None,
            on_state: Callable[[str], None] | None = None,
            resume_global_batch_size: int | None = None,
            resume_recipe: Callable[[], Recipe] | None = None) -> Iterator[StepRecord]:
        """The uninterrupted run on `dp` ranks (phase ``run``), then each resume (``resumed@K``,
        with `resume_global_batch_size` from step K on if given; on `resume_recipe`'s
        recipe if given: another lane count is then changed on purpose).

        With `save_at`, the global state is taken after `save_at` steps (kept
        as `self.state`, passed to `on_state`) and, after the uninterrupted
        run, restored on each of `resume_dp` (default: `dp`).
        """
        for d, what in [(dp, "dp"), *((d2, "a resume's dp") for d2 in resume_dp or [])]:
            check_rank_count(d, what)  # before the run, not after it
        sim = self.ranks(dp, self.recipe)
        writer = self._writer(self.ledger, sim.recipe)
        try:
            yield from self.steps(sim, steps if save_at is None else save_at, "run", writer)
            if save_at is None:
                return
            self.state = sim.state_json()
            if on_state is not None:
                on_state(self.state)
            yield from self.steps(sim, steps, "run", writer)
        finally:
            if writer is not None:
                writer.close()
        for d2 in resume_dp or [dp]:
            yield from self.resume(self.state, d2, steps, f"resumed@{save_at}",
                                   global_batch_size=resume_global_batch_size,
                                   recipe=resume_recipe() if resume_recipe else None)

    def resume(self, state: str | dict, dp: int, steps: int,
               phase: str = "resumed", ledger: str | os.PathLike | None = None,
               global_batch_size: int | None = None,
               recipe: Recipe | None = None) -> Iterator[StepRecord]:
        """Restore `state` on `dp` ranks and run up to step `steps`; the restore time is
        counted in the first step's seconds. With `recipe` (the same recipe with
        another lane count), the lane count changes (`Loader.load_state_dict`'s
        ``allow_lane_change``)."""
        sim = self.ranks(dp, recipe)
        t0 = time.perf_counter()
        sim.load(state, global_batch_size, allow_lane_change=recipe is not None)
        restore_s = time.perf_counter() - t0
        if ledger is None and self.ledger is not None:
            ledger = resumed_ledger_path(self.ledger, dp)
        writer = self._writer(ledger, sim.recipe)
        try:
            first = True
            for rec in self.steps(sim, steps, phase, writer):
                if first:
                    rec.seconds += restore_s
                    first = False
                yield rec
        finally:
            if writer is not None:
                writer.close()

    def close(self) -> None:
        for r in self.runners.values():
            r.close()

    def __enter__(self) -> ElasticRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def nothing_delivered(sim: SimulatedRanks, writer: LedgerWriter | None) -> NoRowsError:
    """The error of a run whose data ended before its first step: how many rows the lanes
    made and which drops, by reason, took the rest (every rank drained to the end of its
    data first, so the counts are the data's, not the moment's). With a ledger, its
    `end_entry` line lists every drop."""
    recipe = sim.recipe
    rows, drops = 0, []
    for loader, local in sim.partial:  # ranks that delivered their part of step 0
        r = len(local) // len(loader.lanes)
        for k, lane in enumerate(loader.lanes):
            mine = local[k * r:(k + 1) * r]
            rows += len(mine)
            drops += [(lane, o, why, detail) for (o, why), detail in lane_drops(mine, (), {})]
    for d in (loader.drain() for loader in sim.loaders):
        rows += len(d.rows)
        drops += [(lane, o, why, detail) for lane, (o, why), detail
                  in zip(d.drop_lanes, d.drops, d.drop_details, strict=True)]
    drops.sort(key=lambda x: (x[0], x[1].seq))  # lane order: the same list at every D
    keys = reader_keys(recipe) if drops else None
    if writer is not None:
        writer.write(end_entry(0, rows, drops, keys))
    by_reason: dict[str, list] = {}
    for drop in drops:
        by_reason.setdefault(drop[2], []).append(drop)
    parts = []
    for reason, found in sorted(by_reason.items(), key=lambda x: (-len(x[1]), x[0])):
        _, o, _, detail = found[0]
        key = keys(o.dataset, o.shard, o.index) if keys else None
        example = o.where() + (f" {key!r}" if key else "") + (f": {detail}" if detail else "")
        parts.append(f"{len(found)} {reason} (e.g. {example})")
    r = sim.loaders[0].batches.r_at(0)
    dropped = f"{len(drops)} samples dropped: {'; '.join(parts)}" if drops else "none dropped"
    return NoRowsError(
        f"the run delivered no batch: its data ({recipe.epochs} epoch(s)) ended before the "
        f"first step. The lanes made {rows} rows (a step needs {r * recipe.num_lanes} rows, "
        f"{r} per lane) and {dropped}. Fix the data or the settings these reasons name, or "
        "give the run more data; `zephon-vl inspect-data --recipe R` shows what each dataset "
        "keeps and drops, and the ledger (--ledger PATH) lists every drop")


def run_digests(make_recipe: Callable[[], Recipe], dp: int, steps: int,
                execution: Execution | None = None, save_at: int | None = None,
                resume_dp: list[int] | None = None,
                on_state: Callable[[str], None] | None = None,
                ledger: str | os.PathLike | None = None,
                resume_global_batch_size: int | None = None,
                resume_recipe: Callable[[], Recipe] | None = None) -> Iterator[StepRecord]:
    """Yield one record per global step of the uninterrupted run on `dp` ranks.

    With `save_at`, the global state is also taken after `save_at` steps and,
    after the uninterrupted run, restored on each of `resume_dp` (phase
    ``resumed@K``; on `resume_recipe`'s recipe, another lane count, if given),
    whose records follow. See `ElasticRun` for `ledger`.
    """
    with ElasticRun(make_recipe, execution, ledger) as run:
        yield from run.run(dp, steps, save_at, resume_dp, on_state, resume_global_batch_size,
                           resume_recipe)


def gathered_batch_digest(local: dict) -> str | None:
    """On real torch.distributed ranks: the batch digest of the global batch, on rank 0.

    Every rank calls it with its local batch (tensors, rows along dim 0; 0-d
    tensors are shared); the batches are all-gathered in rank order, so the
    digest equals `SimulatedRanks`' for the same step. Other ranks get None.
    """
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    out = {}
    for name in sorted(local):
        t = local[name]
        if t.dim() == 0:
            out[name] = t
            continue
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([t.shape[0]]))
        longest = int(max(s.item() for s in sizes))
        padded = torch.zeros((longest, *t.shape[1:]), dtype=t.dtype)
        padded[:t.shape[0]] = t
        parts = [torch.zeros_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        out[name] = torch.cat([p[:int(n.item())] for p, n in zip(parts, sizes, strict=True)])
    return batch_digest(out) if dist.get_rank() == 0 else None
