"""The compiled plan: a recipe's operators as stages, fused where the execution allows.

The *recipe* (operators and their settings) decides the data. The
*execution* (runner, workers per operator, group size, prefetch) decides only
where and when work happens; it is never part of a checkpoint fingerprint.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from zephon_core.engine.execution import Execution
from zephon_core.engine.kinds import RunnerKind, StageKind
from zephon_core.engine.observe import StageStats
from zephon_core.engine.runner_base import Runner
from zephon_core.engine.runners import InlineRunner, RunnerSpec, make_runner
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import AccumulatorOp, CombinerOp, Operator, StageFn, Transform
from zephon_core.ops.row_transform import RowStageFn, RowTransform

log = logging.getLogger(__name__)

#: the most samples per worker call when `Execution.group_size` is none: `GROUP_SIZE`, or
#: `SMALL_GROUP_SIZE` for a stage none of whose outputs held more than `SMALL_OUTPUT_BYTES`
#: (arrays, bytes, text: a document's token ids, not pixels). The cap keeps decoded media
#: from piling up, which small outputs never do, while every call costs the driver about
#: the same: on text, groups of 64 instead of 8 cut its CPU per token by a third (issue 39)
GROUP_SIZE, SMALL_GROUP_SIZE, SMALL_OUTPUT_BYTES = 8, 64, 64 * 1024


def sample_cap(execution: Execution, small: bool) -> int:
    """The most samples one call of a stage may carry; `small`: all it put out so far was
    small (`SMALL_OUTPUT_BYTES`)."""
    if execution.group_size is not None:
        return execution.group_size
    return SMALL_GROUP_SIZE if small else GROUP_SIZE
#: the stages a runner runs: transforms, and row transforms after the combiner
_RUN = (StageKind.TRANSFORM, StageKind.ROWS)


@dataclass
class Stage:
    """One step of the compiled lane pipeline."""

    index: int
    kind: StageKind
    ops: list[Operator]
    runner_kind: RunnerKind = RunnerKind.INLINE
    workers: int = 1

    @property
    def name(self) -> str:
        return "+".join(o.name for o in self.ops)


def unknown_operators(ops: list[Operator], execution: Execution) -> str:
    """A message naming the operators `execution` sets workers or runners for that `ops`
    lacks (e.g. a typo: ``--workers decod=2``), or "" when there are none."""
    transforms = [o.name for o in ops if isinstance(o, Transform | RowTransform)]
    named = set() if isinstance(execution.workers, str) else set(execution.workers)
    unknown = sorted((named | set(execution.runners)) - set(transforms))
    if not unknown:
        return ""
    return (f"workers or runners set for {unknown}, which this recipe does not run; its "
            f"operators with workers: {', '.join(transforms)}")


def runner_of(op: Transform, execution: Execution, last: Stage | None) -> tuple[RunnerKind, int]:
    """Where transform `op` runs, after stage `last`: `Execution.runner_for`, except that an
    operator that rides along (``rides_along = True``: a cheap map such as `MinTokens`)
    under ``runner="auto"``, with no runner or worker count of its own, runs where the
    transform stage before it runs, and so in the same worker call. In the driver its work
    is a few instructions, but a stage of its own costs the driver a group, a future and a
    hand-over per group, and a key, two queue moves and a hook call per element."""
    kind, workers = execution.runner_for(op)
    own = op.name in execution.runners or (isinstance(execution.workers, dict)
                                           and op.name in execution.workers)
    if (getattr(op, "rides_along", False) and execution.runner == "auto" and not own
            and last is not None and last.kind is StageKind.TRANSFORM):
        return last.runner_kind, last.workers
    return kind, workers


class Plan:
    """Operators compiled into stages: fused transforms, accumulators, the combiner, then
    the row transforms (`row_ops`, `RowTransform`: stateless work on each finished row)."""

    def __init__(self, ops: list[Operator], execution: Execution, lanes: int = 1,
                 digests: bool = False, row_ops: list[RowTransform] | tuple = ()) -> None:
        names = [o.name for o in [*ops, *row_ops]]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError(f"operator names must be unique; repeated: {sorted(dup)}")
        if not ops or not isinstance(ops[-1], CombinerOp):
            raise ConfigError("a pipeline must end with a CombinerOp that makes the rows per "
                              "lane, such as Pack(seq_len=...)")
        extra = [o.name for o in ops[:-1] if isinstance(o, CombinerOp)]
        if extra:
            raise ConfigError(f"only the last operator may combine elements into rows; move or "
                              f"remove {extra}")
        unknown = unknown_operators([*ops, *row_ops], execution)
        if unknown:  # an Execution may serve several recipes; user input is checked strictly
            log.warning("%s", unknown)
        self.ops = ops
        self.execution = execution
        self.digests = digests
        self.stages: list[Stage] = []
        for op in ops:
            if isinstance(op, Transform):
                last = self.stages[-1] if self.stages else None
                kind, workers = runner_of(op, execution, last)
                if (execution.fuse and last is not None and last.kind is StageKind.TRANSFORM
                        and (last.runner_kind, last.workers) == (kind, workers)):
                    last.ops.append(op)
                else:
                    self.stages.append(Stage(len(self.stages), StageKind.TRANSFORM, [op], kind,
                                             workers))
            elif isinstance(op, AccumulatorOp):
                self.stages.append(Stage(len(self.stages), StageKind.ACCUMULATOR, [op]))
            elif isinstance(op, CombinerOp):
                self.stages.append(Stage(len(self.stages), StageKind.COMBINER, [op]))
            else:
                raise ConfigError(f"operator {op.name!r} is neither a Transform, an "
                                  "AccumulatorOp nor a CombinerOp (a RowTransform goes in the "
                                  "recipe's row_ops)")
        self.row_ops = list(row_ops)
        self._add_row_stages(execution)
        if execution.auto_workers:
            self._split_budget()
        workers = max((s.workers for s in self.stages if s.runner_kind is not RunnerKind.INLINE),
                      default=1)
        if execution.auto_workers:  # room for the most workers a stage may be given
            workers = max(workers, execution.worker_budget())
        self.prefetch = execution.prefetch or max(2, -(-2 * workers // max(lanes, 1)))
        #: the most elements a lane may hold in its transforms and inboxes
        self.max_in_flight = self.prefetch * sample_cap(execution, small=True)

    def _add_row_stages(self, execution: Execution) -> None:
        """The row transforms after the combiner, fused like transforms (same runner and
        workers)."""
        for op in self.row_ops:
            if not isinstance(op, RowTransform):
                raise ConfigError(f"row operator {op.name!r} is not a RowTransform")
            kind, workers = execution.runner_for(op)  # type: ignore[arg-type]
            last = self.stages[-1]
            if (execution.fuse and last.kind is StageKind.ROWS
                    and (last.runner_kind, last.workers) == (kind, workers)):
                last.ops.append(op)
            else:
                self.stages.append(Stage(len(self.stages), StageKind.ROWS, [op], kind, workers))

    @property
    def combiner_index(self) -> int:
        """The combiner's stage (the last one unless row transforms follow it)."""
        return next(s.index for s in self.stages if s.kind is StageKind.COMBINER)

    @property
    def row_stages(self) -> list[Stage]:
        """The stages of the row transforms, in order (none without `row_ops`)."""
        return [s for s in self.stages if s.kind is StageKind.ROWS]

    def _split_budget(self) -> None:
        """``workers="auto"``: the process stages start with equal shares of the budget
        (at least one each); `engine/autoscale.py` moves them by measured cost."""
        from zephon_core.engine.autoscale import split_workers

        sized = [s for s in self.stages if s.runner_kind is RunnerKind.PROCESSES]
        split = split_workers({str(s.index): 1.0 for s in sized},
                              self.execution.worker_budget())
        for s in sized:
            s.workers = split[str(s.index)]

    @property
    def combiner(self) -> CombinerOp:
        """The last operator of `ops`, which makes the rows."""
        return self.ops[-1]  # type: ignore[return-value]

    @property
    def last_transform(self) -> int | None:
        """The stage whose outputs reach the combiner unchanged (accumulators keep payloads)."""
        return max((s.index for s in self.stages if s.kind is StageKind.TRANSFORM), default=None)

    def stage_fn(self, stage: Stage) -> StageFn | RowStageFn:
        """With `digests` (the ledger), the last transform stage hashes each sample it makes."""
        if stage.kind is StageKind.ROWS:
            return self.row_stage_fn(stage)
        return StageFn(list(stage.ops),  # type: ignore[arg-type]
                       digests=self.digests and stage.index == self.last_transform,
                       storage=self.execution.storage())

    def row_stage_fn(self, stage: Stage) -> RowStageFn:
        """A row stage's transforms fused (`stage.kind` is ROWS)."""
        return RowStageFn(list(stage.ops), self.execution.storage())  # type: ignore[arg-type]

    def prefix_fn(self, upto: int) -> StageFn:
        """All transforms before stage `upto`, fused: recomputes a payload from a pointer."""
        return StageFn([op for s in self.stages[:upto] if s.kind is StageKind.TRANSFORM
                        for op in s.ops],  # type: ignore[misc]
                       storage=self.execution.storage())

    def release_remote_operators(self, runners: dict[int, Runner]) -> None:
        """`Transform.release` on every operator of the stages that run in spawned worker
        processes or Ray tasks (each loads its own): this process lets go of what it loaded
        to build the recipe or to recompute payloads on restore. Forked workers share the
        driver's copy, so releasing it would free no memory and cost time (a tokenizer:
        0.2 s before the first batch)."""
        remote = (RunnerKind.PROCESSES, RunnerKind.RAY)
        for s in self.stages:
            if (s.kind in _RUN and s.runner_kind in remote
                    and not runners[s.index].forked):
                for op in s.ops:
                    op.release()  # type: ignore[attr-defined]

    def make_runners(self) -> dict[int, Runner]:
        return {s.index: make_runner(RunnerSpec.from_execution(self.execution, s),
                                     self.stage_fn(s))  # type: ignore[arg-type]
                for s in self.stages if s.kind in _RUN}

    def runners_for(self, given: dict[int, Runner] | None) -> dict[int, Runner]:
        """`given` (a caller's runners), or this plan's own when None. A row stage the
        given runners lack (built from a plan without `row_ops`) runs inline: the same
        rows, in the driver."""
        if given is None:
            return self.make_runners()
        missing = {s.index: InlineRunner(self.stage_fn(s))  # type: ignore[arg-type]
                   for s in self.row_stages if s.index not in given}
        return {**given, **missing} if missing else given

    def explain(self, lanes: int | None = None, rows_per_lane: int | None = None,
                stats: StageStats | None = None) -> str:
        """The stages in order; with `stats`, under each stage what it was observed doing."""
        ex = self.execution
        totals = stats.totals() if stats is not None else {}
        lines = [f"zephon plan (per lane, in order; {ex.budget_note()}):"]
        lines.append("  source: pointers from the work source (no I/O)")
        for s in self.stages:
            if s.kind is StageKind.TRANSFORM:
                par = "in the driver thread" if s.runner_kind is RunnerKind.INLINE else \
                    f"{s.workers} {s.runner_kind.singular if s.workers == 1 else s.runner_kind}"
                if s.runner_kind is RunnerKind.RAY:
                    par = (f"{s.workers} Ray task{'s' if s.workers > 1 else ''} at once"
                           + (f" on nodes with {ex.ray_resources}" if ex.ray_resources else ""))
                lines.append(f"  stage {s.index}: {s.name} [stateless, {s.runner_kind}, {par}; "
                             f"groups of {_groups(ex)}, up to {self.prefetch} groups in flight "
                             "per lane]")
            elif s.kind is StageKind.ROWS:
                lines.append(f"  stage {s.index}: {s.name} [row transform: each finished row, "
                             f"{s.runner_kind}, {s.workers} worker(s)]")
            elif s.kind is StageKind.ACCUMULATOR:
                lines.append(f"  stage {s.index}: {s.name} [accumulator, per-lane state, driver]")
            else:
                lines.append(f"  stage {s.index}: {s.name} [combiner: makes the rows, per-lane "
                             "state, driver]")
            if stats is not None:
                seen = totals.get(s.index)
                lines.append("    " + (seen.describe() if seen else "observed: nothing yet"))
        tail = "  tail: lane multiplexer -> local batch in lane order"
        if lanes is not None and rows_per_lane is not None:
            tail += f" ({lanes} lanes x {rows_per_lane} rows per step)"
        lines.append(tail + f"; {ex.prefetch_steps} step(s) prefetched")
        return "\n".join(lines)


def _groups(ex: Execution) -> str:
    """The group size `explain` shows."""
    if ex.group_size is not None:
        return str(ex.group_size)
    return f"{GROUP_SIZE} ({SMALL_GROUP_SIZE} while its outputs stay small)"
