"""Simulate `D` data-parallel ranks in one process and hash every global batch.

This is the offline proof behind `zephon-vl digest`: the digests must not
change with `D`, with the execution knobs, or across a save on `D` ranks and
a resume on `D'` ranks through the same JSON a user would store.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from zephon_core.common.digest import batch_digest
from zephon_core.engine.checkpoint import merge_states
from zephon_core.engine.execution import Execution
from zephon_core.engine.loader import Loader
from zephon_core.engine.plan import Plan
from zephon_core.engine.runners import Runner
from zephon_core.ops.pack import Row
from zephon_core.recipes.recipe import Recipe


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

    def to_json(self) -> dict:
        return {"step": self.step, "sha256": self.sha256, "dp": self.dp, "phase": self.phase,
                "rows": self.rows, "tokens": self.tokens, "fill": round(self.fill, 4),
                "drops": self.drops, "seconds": round(self.seconds, 4)}


@dataclass
class GlobalStep:
    batch: dict
    rows: list[Row]

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


class SimulatedRanks:
    """`D` loaders sharing one set of runners (one process pool per stage, not one per rank)."""

    def __init__(self, recipe: Recipe, dp: int, execution: Execution,
                 runners: dict[int, Runner]) -> None:
        self.recipe = recipe
        self.dp = dp
        self.loaders = [Loader(recipe, d, dp, execution, runners=runners, gather=False)
                        for d in range(dp)]

    def global_step(self) -> GlobalStep | None:
        """The global batch, collated from all ranks' rows in rank order."""
        rows = []
        for loader in self.loaders:
            local = loader.next_rows()
            if local is None:
                return None
            rows += local
        return GlobalStep(self.recipe.collate(rows), rows)

    def state_json(self) -> str:
        return json.dumps(merge_states([ld.local_state_dict() for ld in self.loaders]),
                          sort_keys=True)

    def load(self, state_json: str) -> None:
        state = json.loads(state_json)
        for loader in self.loaders:
            loader.load_state_dict(state)


def run_digests(make_recipe: Callable[[], Recipe], dp: int, steps: int,
                execution: Execution | None = None, save_at: int | None = None,
                resume_dp: list[int] | None = None,
                on_state: Callable[[str], None] | None = None) -> Iterator[StepRecord]:
    """Yield one record per global step of the uninterrupted run on `dp` ranks.

    With `save_at`, the global state is also taken after `save_at` steps and,
    after the uninterrupted run, restored on each of `resume_dp` (phase
    ``resumed@K``), whose records follow.
    """
    execution = execution or Execution()
    recipe = make_recipe()
    runners = Plan(recipe.ops, execution).make_runners()
    try:
        sim = SimulatedRanks(recipe, dp, execution, runners)
        stop = steps if save_at is None else save_at
        yield from _steps(sim, 0, stop, "run")
        if save_at is None:
            return
        state = sim.state_json()
        if on_state is not None:
            on_state(state)
        yield from _steps(sim, save_at, steps, "run")
        for d2 in resume_dp or [dp]:
            sim2 = SimulatedRanks(make_recipe(), d2, execution, runners)
            t0 = time.perf_counter()
            sim2.load(state)
            restore_s = time.perf_counter() - t0
            for rec in _steps(sim2, save_at, steps, f"resumed@{save_at}"):
                if rec.step == save_at:
                    rec.seconds += restore_s
                yield rec
    finally:
        for r in runners.values():
            r.close()


def _steps(sim: SimulatedRanks, start: int, stop: int, phase: str) -> Iterator[StepRecord]:
    capacity = sim.recipe.global_batch_size * sim.recipe.seq_len
    for t in range(start, stop):
        t0 = time.perf_counter()
        out = sim.global_step()
        if out is None:
            return
        yield StepRecord(t, batch_digest(out.batch), sim.dp, phase, sim.recipe.global_batch_size,
                         out.tokens, out.tokens / capacity, out.drops, time.perf_counter() - t0)
