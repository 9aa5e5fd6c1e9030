"""The loader of one data-parallel rank: its lanes, the tail multiplexer, checkpoints
(the end of the data, `leftover` and `drain`: `engine/loader_end.py`)."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, wait
from typing import TYPE_CHECKING, Any

from zephon_core.common.jsontext import is_count
from zephon_core.data.readers import shard_lengths
from zephon_core.data.sources import Dataset, DatasetOrder, LaneSource
from zephon_core.data.storage_settings import storage_settings
from zephon_core.engine.autoscale import sizer_for
from zephon_core.engine.background import BackgroundSteps
from zephon_core.engine.backlog import Backlog
from zephon_core.engine.batches import BatchSchedule
from zephon_core.engine.checkpoint import (
    check_state,
    gather_global_state,
    lane_changes_of,
    make_state,
    migrate_state,
    resized_of,
)
from zephon_core.engine.execution import Execution
from zephon_core.engine.lane import LaneRun
from zephon_core.engine.ledger import RankLedger, lane_entries, reader_keys
from zephon_core.engine.loader_end import LoaderEnd
from zephon_core.engine.metrics import WAIT_WARN_SHARE, LoaderMetrics, recorder_for
from zephon_core.engine.observe import StageObserver, StageStats
from zephon_core.engine.phases import PhaseGate
from zephon_core.engine.plan import Plan, sample_cap
from zephon_core.engine.rank_hooks import LaneHookFactory, RankHooks
from zephon_core.engine.relane import change_lanes
from zephon_core.engine.runner_base import Runner
from zephon_core.engine.steps import Step, StepMeta, collate_rows
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import Row
from zephon_core.records import Origin
from zephon_core.spec import Recipe

if TYPE_CHECKING:
    from zephon_core.engine.torch_dataset import LoaderDataset

log = logging.getLogger(__name__)


def empty_dataset_message(j: int, dataset: Dataset, shards: int) -> str:
    names = [str(dataset.reader.shard_identity(s).get("name", s)) for s in range(min(shards, 3))]
    where = f"{shards} shard(s): {', '.join(names)}{', ...' if shards > 3 else ''}"
    return (f"dataset {j} ({dataset.name!r}) has no samples in its {where}; check its paths "
            "and that the files hold samples")


class Loader(BackgroundSteps, LoaderEnd):
    """An iterator of local batches for rank `dp_rank` of `dp_world_size`.

    Local batch `t` is, in lane order, rows `[t*r, (t+1)*r)` of each of this
    rank's lanes; concatenating ranks `0..D-1` gives the global batch, which is
    therefore the same for every `D` dividing `L`.

    With `background=True` a driver thread runs the lanes and collates up to
    `execution.prefetch_steps` batches ahead of the consumer (so packing and
    collation overlap the training step); `state_dict()` still describes the
    last batch the consumer received.

    `observer` is called with a `StageEvent` for every group of elements
    through every stage of every lane (see `zephon_core.engine.observe`; a
    `StageStats` totals them for `explain`). It sees counts, times and
    origins, never payloads, so it cannot change a batch.

    `ledger` (a path) appends one line per global step to a ledger file (see
    `zephon_core.engine.ledger`; rank 0 writes, the lanes' entries are
    gathered over gloo). `digests=True` computes the per-sample digests and
    `StepMeta.ledger` without writing (the simulated ranks write one ledger).
    Neither changes a batch.

    `metrics()` returns a `LoaderMetrics` snapshot (see
    `zephon_core.engine.metrics` and docs/observability.md); with `on_metrics`
    it is called with one every `metrics_every` steps. A warning is logged
    when the consumer waits in ``next()`` more than `wait_warn_share` of its
    loop (None: never). `stage_metrics=False` leaves the stages unobserved
    (no per-stage busy time, two clock reads and a tuple less per group of
    each stage; see docs/observability.md). None of them changes a batch.

    `lane_hooks(lane)` gives each lane hooks of the caller's own (`LaneHook`,
    docs/architecture.md "To add a lane concern"), after the built-in ones.
    """

    def __init__(self, recipe: Recipe, dp_rank: int = 0, dp_world_size: int = 1,
                 execution: Execution | None = None, microbatches: int = 1,
                 runners: dict[int, Runner] | None = None, gather: bool = True,
                 background: bool = False, observer: StageObserver | None = None,
                 ledger: str | os.PathLike | None = None, digests: bool = False,
                 on_metrics: Callable[[LoaderMetrics], None] | None = None,
                 metrics_every: int = 100,
                 wait_warn_share: float | None = WAIT_WARN_SHARE,
                 stage_metrics: bool = True, lane_hooks: LaneHookFactory | None = None) -> None:
        self.recipe = recipe
        self.observer = observer
        self.lane_hooks = lane_hooks
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.lanes = recipe.lanes_of(dp_rank, dp_world_size)
        self.local_rows = recipe.rows_per_lane * len(self.lanes)
        self.microbatches = microbatches
        #: global batch sizes a resume asked for: (step, G), in the state from then on
        self.resized: list[tuple[int, int]] = []
        #: lane-count changes of the resumes so far: (step, old L, new L), in the state too
        self.lane_changes: list[tuple[int, int, int]] = []
        self._set_batches()
        self.execution = execution or Execution()
        self.digests = digests or ledger is not None
        self.plan = Plan(recipe.ops, self.execution, len(self.lanes), self.digests, recipe.row_ops)
        sizes = self._read_data()
        self.ledger = RankLedger(ledger, self.fingerprint, gather) if ledger is not None else None
        self._owns_runners = runners is None
        self.runners = self.plan.runners_for(runners)
        self.plan.release_remote_operators(self.runners)  # read while the recipe was built
        self.gather = gather
        self._sizes = sizes
        self._orders = [DatasetOrder(sz, recipe.seed, j, recipe.shuffle)
                        for j, sz in enumerate(sizes)]
        self._failed: BaseException | None = None
        #: finished documents this rank's lanes hold (`Execution.backlog_bytes` bounds it)
        self.backlog = Backlog(self.execution.backlog_bytes,
                               sample_cap(self.execution, small=False))
        self._end_group = _end_of_data_group(recipe)
        self.background = background
        self._thread: threading.Thread | None = None
        self._unsent: dict[str, Any] = {}
        self.step = 0
        self._produced = 0
        self.last_meta: StepMeta | None = None
        self.end_of_data: list[tuple[int, int]] = []
        self._closed = False
        self.on_metrics, self.metrics_every = on_metrics, metrics_every
        self._recorder = recorder_for(self, wait_warn_share)
        self._spans = self._recorder.events.add if stage_metrics else None
        #: sizes the process stages with `Execution(workers="auto")` (None otherwise)
        # runners given by the caller may serve other loaders too: never resized here
        self.sizer = (sizer_for(self.execution, self.plan, self.runners, self._recorder)
                      if stage_metrics and self._owns_runners else None)
        if self.execution.auto_workers and not stage_metrics:
            log.warning("zephon: workers='auto' measures the stages: with stage_metrics=False "
                        "the process stages keep equal shares of the worker budget")
        self._build_lanes(None)

    def _read_data(self) -> list[list[int]]:
        """The recipe's fingerprint and shard sizes (read where the data is: URLs need the
        execution's storage settings); refuses a dataset without samples."""
        recipe = self.recipe
        with storage_settings(self.execution.storage()):  # shard stats and indexes: URLs
            self.fingerprint = recipe.fingerprint()
            self._keys = reader_keys(recipe) if self.digests else None
            sizes = [shard_lengths(d.reader) for d in recipe.datasets]
            for j, sz in enumerate(sizes):
                if not sum(sz):
                    raise ConfigError(empty_dataset_message(j, recipe.datasets[j], len(sz)))
        return sizes

    def _set_batches(self) -> None:
        r = self.recipe
        self.batches = BatchSchedule.build(r.num_lanes, r.global_batch_size, r.batch_sizes(),
                                           self.resized)
        for step, per_lane in self.batches.changes:
            local = per_lane * len(self.lanes)
            if self.microbatches < 1 or local % self.microbatches:
                raise ConfigError(f"the local batch of {local} rows (from step {step}) cannot be "
                                  f"split into {self.microbatches} equal microbatches")

    def _build_lanes(self, snapshots: dict[int, dict] | None) -> None:
        r = self.recipe
        self._runs = []
        #: with a mixture schedule: each lane's phase gate (the ledger names phases)
        self._gates: dict[int, PhaseGate] = {}
        self._warming = True
        schedule = r.schedule()
        hooks = RankHooks(self.backlog, self.plan.max_in_flight if self.digests else None,
                          self._spans, self.observer, self.lane_hooks)
        for lane in self.lanes:
            src = LaneSource(self._orders, [d.weight for d in r.datasets], lane, r.num_lanes,
                             r.epochs, schedule=schedule[1] if schedule else None)
            if schedule:
                starts = [self.batches.rows_before(s) for s in schedule[0]]
                self._gates[lane] = PhaseGate(src, starts, r.phase_lag, r.mix_by == "tokens",
                                              len(r.datasets))
            run = LaneRun(lane, self.plan, self.runners, src, r.seed, self.batches.r_at(0),
                          hooks.for_lane(lane, self._gates.get(lane)),
                          None if self.batches.static else self.batches)
            if snapshots is not None:
                run.restore(snapshots[lane])
            self._runs.append(run)
        self.backlog.serve(self._runs)
        self._snapshots = {run.lane: run.snapshot() for run in self._runs} \
            if snapshots is None else dict(snapshots)

    # --- iteration ---------------------------------------------------------
    def __iter__(self) -> Loader:
        return self

    def next_rows(self) -> list[Row] | None:
        """The local batch's rows in lane order, or None at the end of the data."""
        if self._thread is not None:
            raise RuntimeError("next_rows() is not available with background=True; iterate")
        step = self._advance()
        if step is None:
            return None
        self._deliver(step)
        return step.rows

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("the loader is closed")
        if self._failed is not None:
            raise RuntimeError("the loader stopped on an error at step "
                               f"{self._produced}: {self._failed}; load a checkpoint "
                               "(load_state_dict) to continue") from self._failed

    def _advance(self) -> Step | None:
        """Run the lanes; a failure leaves the loader unusable rather than silently short."""
        self._check_usable()
        try:
            with storage_settings(self.execution.storage()):
                return self._advance_lanes()
        except BaseException as exc:
            self._failed = exc
            raise

    def _pump_lanes(self) -> None:
        """Pump every lane once; if none could move, wait for a result in flight."""
        progressed = False
        for run in self._runs:
            progressed |= run.pump()
        if not progressed:
            heads = [f for run in self._runs for f in run.head_futures()]
            if not heads:
                raise RuntimeError("zephon pipeline stalled with no work in flight (a bug): "
                                   f"lanes {self.lanes}, step {self._produced}")
            wait(heads, timeout=min(60.0, self.execution.stall_seconds or 60.0),
                 return_when=FIRST_COMPLETED)

    def stall_report(self, seconds: float) -> str:
        """The watchdog's log line: how long without a row, and each lane's drops by reason."""
        stats = [run.stats() for run in self._runs]
        lanes = "; ".join(
            f"lane {s.lane}: {s.draws_since_row} drawn since its last row, drops "
            f"{dict(sorted(s.dropped.items())) or 'none'}" for s in stats)
        hints = sorted({h for run in self._runs for h in run.drop_hints()})
        why = ("; ".join(hints) if hints else "many drops mean the data does not fit the "
               "recipe, none mean slow reads or workers (see explain())")
        return (f"zephon: no new row for {seconds:.0f} s on rank {self.dp_rank} (step "
                f"{self._produced}): {lanes}. {why}")

    def _advance_lanes(self) -> Step | None:
        """Run the lanes until each has `r` more rows; take them (driver thread only)."""
        t = self._produced
        r = self.batches.r_at(t)
        self._request(t + 1)
        full = self._fill(r)
        if not self._every_rank_has_a_batch(full):
            self.end_of_data = [(run.lane, run.ready()) for run in self._runs]
            return None
        rows: list[Row] = []
        drops: list[tuple[Origin, str]] = []
        snaps: dict[int, dict] = {}
        for run in self._runs:
            taken = run.take(r)
            rows += taken.rows
            drops += taken.drops
            assert taken.snapshot is not None, "a step's last row carries the lane's snapshot"
            snaps[run.lane] = taken.snapshot
        self._warming = False
        self._request(t + 2)
        for run in self._runs:
            run.pump()
        meta = StepMeta(self._produced, list(self.lanes),
                        [[(s.origin, s.start, s.end) for s in row.segments] for row in rows],
                        drops)
        if self.digests:
            phase_of = ({lane: gate.phase_of for lane, gate in self._gates.items()}
                        if self.recipe.schedule() else None)
            meta.ledger = lane_entries(self.lanes, r, rows, self._keys, phase_of)
        self._produced += 1
        return Step(rows, snaps, meta)

    def _request(self, steps: int) -> None:
        """Ask every lane for the rows of the first `steps` steps plus the prefetched ones
        (`Execution.prefetch_steps`): lanes draw ahead by that much and no more. Until the
        loader's first step after it starts or restores, only that step's rows, in small
        groups (`LaneRun.request`): the time to the first batch is the work it needs."""
        warming = self._warming
        rows = self.batches.rows_before(steps + (0 if warming else self.execution.prefetch_steps))
        for run in self._runs:
            run.request(rows, warming)

    def _fill(self, r: int) -> bool:
        """Pump until every lane has `r` ready rows (True) or one has finished short
        (False); log the stall report while no lane makes a row."""
        stall = self.execution.stall_seconds
        made, since = -1, 0.0
        while not (full := all(run.ready() >= r for run in self._runs)):
            if any(run.finished and run.ready() < r for run in self._runs):
                break
            self._pump_lanes()
            if stall is not None:
                now, rows = time.monotonic(), sum(run.rows_made for run in self._runs)
                if rows != made:
                    made, since = rows, now
                elif now - since >= stall:
                    log.warning("%s", self.stall_report(now - since))
                    since = now
        return full


    def _deliver(self, step: Step) -> None:
        """The consumer has the step: its snapshots become the loader's state."""
        self._snapshots.update(step.snapshots)
        self.last_meta = step.meta
        self.step = step.meta.step + 1
        if self.ledger is not None and step.meta.ledger is not None:
            self.ledger.record(step.meta.step, step.meta.ledger)
        self._recorder.delivered(step.meta.step, step.rows, step.meta.drops)
        if self.sizer is not None:
            self.sizer.after_step(step.meta.step, time.monotonic())
        if self.on_metrics is not None and self.metrics_every > 0 \
                and self.step % self.metrics_every == 0:
            self.on_metrics(self.metrics())

    def metrics(self) -> LoaderMetrics:
        """This rank's metrics: totals so far, rates since the previous call."""
        return self._recorder.snapshot()

    def _collate(self, rows: list[Row]) -> Any:
        pin = self.execution.pin_memory
        if self.microbatches == 1:
            return collate_rows(self.recipe.collate, rows, pin)
        k = len(rows) // self.microbatches
        return [collate_rows(self.recipe.collate, rows[i:i + k], pin)
                for i in range(0, len(rows), k)]

    def _collate_step(self, step: Step) -> Any:
        start = time.perf_counter()
        batch = self._collate(step.rows)
        step.meta.collate_s = time.perf_counter() - start
        return batch

    def __next__(self) -> Any:
        self._recorder.next_started(time.monotonic())
        batch = self._next_batch()
        self._recorder.next_returned(time.monotonic())
        return batch

    def _next_batch(self) -> Any:
        if not self.background:
            step = self._advance()
            if step is None:
                raise StopIteration
            self._deliver(step)
            return self._collate_step(step)
        if self._thread is None:
            self._start_background()
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._stop_background()
            raise item
        if item is None:
            self._stop_background()
            raise StopIteration
        step, batch = item
        self._deliver(step)
        return batch

    # --- checkpoint --------------------------------------------------------
    def local_state_dict(self) -> dict:
        """This rank's lanes only, at the last step boundary delivered."""
        return make_state(self.fingerprint, self.step, self._snapshots, self.recipe.num_lanes,
                          self.resized, self.lane_changes)

    def state_dict(self) -> dict:
        """The global state when torch.distributed is initialized (identical on every rank).

        Without torch.distributed it is this rank's local state; merge the
        states of all ranks with `merge_states` to resume on another rank count.
        """
        local = self.local_state_dict()
        if self.gather:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                return gather_global_state(local)
        return local

    def load_state_dict(self, state: dict, global_batch_size: int | None = None,
                        allow_lane_change: bool = False) -> None:
        """Continue exactly where `state` was taken, on this loader's rank count.

        `global_batch_size` changes `G` from the state's step on (a multiple of
        `L`; until the next phase that sets one): the lanes' rows stay the same,
        only the steps that take them change (docs/elastic-changes.md).

        `allow_lane_change=True` accepts a state of the same recipe with another
        lane count: its remaining work is re-dealt to this recipe's lanes
        (`zephon_core.change_lanes`, docs/elastic-changes.md), the same at every
        rank count. Without it, another lane count is refused.
        """
        state = migrate_state(state)
        if allow_lane_change and isinstance(state, dict) and \
                state.get("num_lanes") != self.recipe.num_lanes:
            with storage_settings(self.execution.storage()):
                state = change_lanes(state, self.recipe, self._sizes, self.fingerprint)
        resized = resized_of(state)
        saved = BatchSchedule.build(self.recipe.num_lanes, self.recipe.global_batch_size,
                                    self.recipe.batch_sizes(), resized)
        check_state(state, self.fingerprint, self.lanes, self.recipe.ops,
                    saved.rows_before(state["step"])
                    if isinstance(state, dict) and is_count(state.get("step")) else None,
                    [d.reader for d in self.recipe.datasets])
        step = int(state["step"])
        if global_batch_size is not None and \
                global_batch_size != saved.r_at(step) * self.recipe.num_lanes:
            resized = [*[c for c in resized if c[0] != step], (step, global_batch_size)]
        before = self.resized
        self.resized = resized
        self.lane_changes = lane_changes_of(state)
        try:
            self._set_batches()
        except ConfigError:
            self.resized = before
            self._set_batches()
            raise
        self._stop_background()
        snaps = {lane: state["lanes"][str(lane)] for lane in self.lanes}
        self.step = self._produced = int(state["step"])
        self._failed = None
        self._build_lanes(snaps)
        self.plan.release_remote_operators(self.runners)  # loaded to recompute payloads
        if self.ledger is not None:
            self.ledger.restart()

    def as_torch_dataset(self) -> LoaderDataset:
        """This loader as a torch `IterableDataset` whose ``state_dict()`` is this loader's
        (for a `StatefulDataLoader` with ``batch_size=None, num_workers=0``; docs/frameworks.md)."""
        from zephon_core.engine.torch_dataset import LoaderDataset

        return LoaderDataset(self)

    # --- lifecycle -----------------------------------------------------------
    def explain(self, stats: StageStats | None = None) -> str:
        """The plan of this rank; with `stats` (the loader's observer), what each stage did."""
        r = self.recipe
        head = (f"recipe {r.name}: L={r.num_lanes} lanes, G={r.global_batch_size} rows/step "
                f"({r.rows_per_lane} per lane), S={r.seq_len}; rank {self.dp_rank}/"
                f"{self.dp_world_size} owns lanes {self.lanes[0]}..{self.lanes[-1]}")
        return head + "\n" + self.plan.explain(len(self.lanes), r.rows_per_lane, stats)

    def close(self) -> None:
        if self._closed:
            return
        self._stop_background()
        self._closed = True
        if self.ledger is not None:
            self.ledger.close()
        if self._owns_runners:
            for runner in self.runners.values():
                runner.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _end_of_data_group(recipe: Recipe) -> Callable[[], Any] | None:
    """With epochs on several ranks: a gloo group on which the ranks agree the data ended.

    A weak reference: torch's registry owns the group, so destroy_process_group
    frees it and its threads before interpreter shutdown (see checkpoint.gloo_group).
    """
    if recipe.epochs is None:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return weakref.ref(dist.new_group(backend="gloo"))
    return None
