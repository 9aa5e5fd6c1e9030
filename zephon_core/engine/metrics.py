"""What a loader did, as numbers a training dashboard can plot (see docs/observability.md).

A `MetricsRecorder` belongs to one `Loader`. It reads only what the loader
already has (each delivered step's `StepMeta`, the stage observer's events,
the backlog's bytes, the runners' restart counts, the consumer's timing), never
a payload it would change, so metrics cannot change a batch.

`LoaderMetrics` is one snapshot: totals since the loader started plus rates
over a *window*, the time since the previous snapshot. Each `Loader.metrics()`
call closes a window and starts the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zephon_core.engine.kinds import StageKind
from zephon_core.engine.observe import DRIVER, Span, StageEvent

log = logging.getLogger(__name__)

#: Warn when the consumer waited in ``next()`` for more than this share of the time between
#: its ``next()`` calls, over the last `WAIT_WARN_STEPS` steps (the first step, which starts
#: the workers, is never counted).
WAIT_WARN_SHARE = 0.10
WAIT_WARN_STEPS = 10
#: stage events kept for the readers (older ones are forgotten: a bounded memory)
MAX_EVENTS = 1 << 16
#: stage events kept as they came before they are folded into compact spans
FOLD_EVERY = 1 << 10
#: at most one such warning per this many seconds
WAIT_WARN_EVERY_S = 300.0


@dataclass(frozen=True)
class StageMetrics:
    """One stage of the plan over the window."""

    name: str  #: the stage's name (fused operators joined by "+")
    runner: str  #: "inline", "threads", "processes", or "driver" (stateful stages)
    workers: int  #: workers of its runner (1 for inline and driver stages)
    groups: int  #: groups that finished in the window, all lanes of this rank
    elements: int  #: elements in those groups, dropped ones included
    #: seconds its workers were busy: the integral over the window of min(workers, groups
    #: in flight); for a driver stage the driver thread's seconds on it
    busy_s: float
    utilisation: float  #: busy_s / (window_s x workers), 0..1


@dataclass(frozen=True)
class LoaderMetrics:
    """A snapshot of one rank's loader. Counts are of this rank; ``*_total`` since start.

    Times are seconds, rates per second of wall time over the window, bytes are bytes.
    Dict fields are read-only by convention (the snapshot is never updated).
    """

    step: int  #: steps delivered so far
    steps: int  #: steps delivered in the window
    window_s: float  #: wall seconds of the window
    #: seconds the consumer was blocked in ``next()`` in the window (the exposed wait)
    wait_s: float
    wait_last_s: float  #: the exposed wait of the last step delivered
    #: wait_s / (time between the window's first and last ``next()`` calls + the last wait),
    #: 0..1: the share of the training loop spent waiting for data
    wait_share: float
    samples: int  #: documents delivered in the window (counted at their first token)
    tokens: int  #: tokens of documents in the window's rows (fillers excluded)
    rows: int  #: rows delivered in the window
    samples_per_s: float
    tokens_per_s: float
    #: the documents' ``costs`` in the window (e.g. ``images``, ``vision_tokens``), every
    #: cost seen so far
    costs: Mapping[str, int]
    costs_per_s: Mapping[str, float]
    fill: float  #: tokens / (rows x seq_len) in the window, 0..1
    drops: Mapping[str, int]  #: samples dropped in the window, by reason
    #: share of the window's samples / tokens by dataset name, every dataset (sums to 1
    #: when the window has any)
    mixture_samples: Mapping[str, float]
    mixture_tokens: Mapping[str, float]
    samples_total: int
    tokens_total: int
    drops_total: Mapping[str, int]
    backlog_bytes: int  #: bytes of finished documents this rank's lanes hold now
    backlog_peak_bytes: int  #: the most they held so far
    shm_used_bytes: int  #: bytes in use in /dev/shm now (the whole machine's)
    worker_restarts: int  #: worker processes replaced since start (died or hung)
    stages: tuple[StageMetrics, ...] = field(default=())

    def slowest_stage(self) -> StageMetrics | None:
        """The stage whose workers were busiest in the window (the likely bottleneck)."""
        return max(self.stages, key=lambda s: s.utilisation, default=None)

    def scalars(self, prefix: str = "zephon/") -> dict[str, float]:
        """Flat ``name -> number`` pairs for a metrics logger (TensorBoard, W&B)."""
        out: dict[str, float] = {}
        out[prefix + "wait_per_step_s"] = self.wait_s / self.steps if self.steps else 0.0
        for key in ("wait_last_s", "wait_share", "samples_per_s", "tokens_per_s",
                    "fill", "samples_total", "tokens_total", "backlog_bytes",
                    "backlog_peak_bytes", "shm_used_bytes", "worker_restarts"):
            out[prefix + key] = float(getattr(self, key))
        for k, v in self.costs_per_s.items():
            out[f"{prefix}{k}_per_s"] = float(v)
        for k, v in self.drops.items():
            out[f"{prefix}drops/{k}"] = float(v)
        out[prefix + "drops"] = float(sum(self.drops.values()))
        out[prefix + "drops_total"] = float(sum(self.drops_total.values()))
        for k, v in self.mixture_samples.items():
            out[f"{prefix}mixture_samples/{k}"] = float(v)
        for k, v in self.mixture_tokens.items():
            out[f"{prefix}mixture_tokens/{k}"] = float(v)
        for i, s in enumerate(self.stages):
            name = f"{prefix}stage{i}_{s.name}"
            out[name + "/busy_s"] = s.busy_s
            out[name + "/utilisation"] = s.utilisation
        return out


def busy_seconds(spans: Sequence[tuple[float, float]], workers: int, lo: float,
                 hi: float) -> float:
    """The integral over [lo, hi] of min(workers, spans open): a FIFO pool's busy time."""
    points: list[tuple[float, int]] = []
    for start, end in spans:
        start, end = max(start, lo), min(end, hi)
        if end > start:
            points += [(start, 1), (end, -1)]
    points.sort()
    busy, open_, last = 0.0, 0, lo
    for t, d in points:
        busy += min(workers, open_) * (t - last)
        open_, last = open_ + d, t
    return busy


class EventLog:
    """The stage events of one loader, read by several readers, each with its own cursor.

    Cheap where it is paid every group: the lanes `add` a compact span (the
    driver thread, the only writer; no `StageEvent` is built for it); every
    `FOLD_EVERY` spans go into a chunk, the oldest forgotten past `MAX_EVENTS`.
    A reader (`since`) gets the spans after its cursor and a new cursor; the
    metrics snapshot and the worker sizer (`engine/autoscale.py`) read apart,
    so neither takes events from the other. Readers may be other threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._raw: list[Span] = []
        self._chunks: deque[list[Span]] = deque(maxlen=max(1, MAX_EVENTS // FOLD_EVERY))
        self._folded = 0  #: spans ever folded (the sequence number of the next one)

    def add(self, span: Span) -> None:
        raw = self._raw
        raw.append(span)
        if len(raw) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        with self._lock:
            raw, self._raw = self._raw, []
            self._chunks.append(raw)
            self._folded += len(raw)

    def cursor(self) -> int:
        """A cursor at the end: `since` with it returns only what comes later."""
        with self._lock:
            return self._folded + len(self._raw)

    def since(self, cursor: int) -> tuple[list[Span], int]:
        """The spans observed after `cursor` (those still kept), and the cursor past them."""
        with self._lock:
            raw = self._raw
            m = len(raw)  # the writer only appends while we hold the lock
            out: list[Span] = []
            first = self._folded - sum(len(c) for c in self._chunks)
            for chunk in self._chunks:
                end = first + len(chunk)
                if end > cursor:
                    out += chunk[max(0, cursor - first):]
                first = end
            out += raw[max(0, cursor - first):m]
            return out, self._folded + m


@dataclass
class _Window:
    start: float
    steps: int = 0
    rows: int = 0
    samples: int = 0
    tokens: int = 0
    wait_s: float = 0.0
    first_call: float | None = None
    costs: Counter = field(default_factory=Counter)
    drops: Counter = field(default_factory=Counter)
    ds_samples: Counter = field(default_factory=Counter)
    ds_tokens: Counter = field(default_factory=Counter)


class MetricsRecorder:
    """Counts what a loader delivers; the lanes add each observed group to its `events`.

    `stages`: ``(name, runner kind, workers)`` by stage index; `restarts`,
    `backlog` and `shm_used`: read at snapshot time.
    """

    def __init__(self, stages: Sequence[tuple[str, str, int]], dataset_names: Sequence[str],
                 seq_len: int, restarts: Callable[[], int] = lambda: 0,
                 backlog: Callable[[], tuple[int, int]] = lambda: (0, 0),
                 shm_used: Callable[[], int] = lambda: 0,
                 wait_warn_share: float | None = WAIT_WARN_SHARE) -> None:
        self._stages = list(stages)
        self._names = list(dataset_names)
        self._seq_len = seq_len
        self._restarts, self._backlog, self._shm_used = restarts, backlog, shm_used
        self.events = EventLog()
        self._cursor = 0
        self._win = _Window(time.monotonic())
        self.step = 0
        self.samples_total = 0
        self.tokens_total = 0
        self.drops_total: Counter = Counter()
        self.wait_last_s = 0.0
        self._call_at: float | None = None
        self._recent: deque[tuple[float, float]] = deque(maxlen=WAIT_WARN_STEPS)
        self.wait_warn_share = wait_warn_share
        self._warned_at = -float("inf")
        self._cost_keys: set[str] = set()  # every cost seen: a dashboard's series never end

    # --- inputs --------------------------------------------------------------
    def observe(self, event: StageEvent) -> None:
        """Record an observed group given as a `StageEvent` (the lanes add spans directly)."""
        self.events.add((event.stage, event.start, event.end, len(event.origins)))

    def delivered(self, step: int, rows: Sequence[Any], drops: Sequence[tuple[Any, str]]) -> None:
        """Step `step` reached the consumer: its rows and the drops decided with them."""
        w = self._win
        w.steps += 1
        w.rows += len(rows)
        for row in rows:
            for seg in row.segments:
                dataset = seg.origin.dataset
                if dataset < 0:  # a row filler, not data
                    continue
                name = self._names[dataset]
                n = seg.end - seg.start
                w.tokens += n
                w.ds_tokens[name] += n
                if seg.start == 0:
                    w.samples += 1
                    w.ds_samples[name] += 1
                    costs = seg.payload.get("costs") if isinstance(seg.payload, dict) else None
                    if costs:
                        w.costs.update(costs)
        for _, reason in drops:
            w.drops[reason] += 1
        self.step = step + 1

    def next_started(self, now: float) -> None:
        """The consumer called ``next()`` at `now` (``time.monotonic()``)."""
        if self._win.first_call is None:
            self._win.first_call = now
        self._call_at = now

    def next_returned(self, now: float) -> None:
        """``next()`` returned a batch at `now`; check the slow-data rule."""
        if self._call_at is None:
            return
        wait = now - self._call_at
        self.wait_last_s = wait
        self._win.wait_s += wait
        if self.step > 1:
            self._recent.append((self._call_at, wait))
        self._check_wait(now)

    # --- the warning -----------------------------------------------------------
    def _check_wait(self, now: float) -> None:
        share = self.wait_warn_share
        if share is None or len(self._recent) < WAIT_WARN_STEPS:
            return
        span = now - self._recent[0][0]
        waited = sum(w for _, w in self._recent)
        if span <= 0 or waited <= share * span or now - self._warned_at < WAIT_WARN_EVERY_S:
            return
        self._warned_at = now
        slow = self._slowest(now)
        log.warning("zephon: the training loop waited %.0f%% of its last %d steps for data "
                    "(%.3f s of %.3f s; the rule: more than %.0f%%). Slowest stage: %s. "
                    "Give it more workers (Execution(workers={...})) or see "
                    "docs/observability.md", 100 * waited / span, len(self._recent), waited,
                    span, 100 * share, slow)

    def set_workers(self, stage: int, workers: int) -> None:
        """The worker count of `stage` changed (`Execution(workers="auto")`)."""
        name, runner, _ = self._stages[stage]
        self._stages[stage] = (name, runner, workers)

    def _slowest(self, now: float) -> str:
        events, _ = self.events.since(self._cursor)  # the window goes on
        stages = self.stage_metrics(events, self._win.start, now)
        s = max(stages, key=lambda s: s.utilisation, default=None)
        if s is None:
            return "none observed"
        return (f"{s.name!r} ({s.runner}, {s.workers} worker(s), {100 * s.utilisation:.0f}% "
                "busy)")

    # --- snapshot --------------------------------------------------------------
    def stage_metrics(self, events: Sequence[Span], lo: float,
                      hi: float) -> tuple[StageMetrics, ...]:
        """Each stage's groups, elements and busy time in [lo, hi] from `events`."""
        span = max(hi - lo, 1e-9)
        by_stage: dict[int, list[tuple[int, float, float, int]]] = {}
        for e in events:
            by_stage.setdefault(e[0], []).append(e)
        out = []
        for i, (name, runner, workers) in enumerate(self._stages):
            mine = by_stage.get(i, [])
            spans = [(s, e) for _, s, e, _ in mine]
            if runner == DRIVER:
                workers = 1
                busy = sum(min(e, hi) - max(s, lo) for s, e in spans if e > lo)
            else:
                busy = busy_seconds(spans, workers, lo, hi)
            out.append(StageMetrics(name, runner, workers, len(mine),
                                    sum(e[3] for e in mine), busy,
                                    min(1.0, busy / (span * workers))))
        return tuple(out)

    def snapshot(self) -> LoaderMetrics:
        """Close the window: its metrics, and the totals so far."""
        now = time.monotonic()
        w = self._win
        events, self._cursor = self.events.since(self._cursor)
        self._win = _Window(now)
        self.samples_total += w.samples
        self.tokens_total += w.tokens
        self.drops_total.update(w.drops)
        span = max(now - w.start, 1e-9)
        loop = (self._call_at or now) - (w.first_call or now) + self.wait_last_s
        held, peak = self._backlog()

        self._cost_keys.update(w.costs)
        costs = {k: w.costs.get(k, 0) for k in sorted(self._cost_keys)}

        def shares(c: Counter) -> dict[str, float]:
            total = sum(c.values())
            return {k: c.get(k, 0) / total if total else 0.0 for k in self._names}

        return LoaderMetrics(
            step=self.step, steps=w.steps, window_s=span, wait_s=w.wait_s,
            wait_last_s=self.wait_last_s,
            wait_share=min(1.0, w.wait_s / loop) if loop > 0 else 0.0,
            samples=w.samples, tokens=w.tokens, rows=w.rows,
            samples_per_s=w.samples / span, tokens_per_s=w.tokens / span,
            costs=costs, costs_per_s={k: v / span for k, v in costs.items()},
            fill=w.tokens / (w.rows * self._seq_len) if w.rows else 0.0,
            drops=dict(sorted(w.drops.items())),
            mixture_samples=shares(w.ds_samples), mixture_tokens=shares(w.ds_tokens),
            samples_total=self.samples_total, tokens_total=self.tokens_total,
            drops_total=dict(sorted(self.drops_total.items())),
            backlog_bytes=held, backlog_peak_bytes=peak, shm_used_bytes=self._shm_used(),
            worker_restarts=self._restarts(),
            stages=self.stage_metrics(events, w.start, now))


def recorder_for(loader: Any, wait_warn_share: float | None) -> MetricsRecorder:
    """The recorder of `loader` (a `Loader` with its plan, runners and backlog built)."""
    from zephon_core.engine import shm

    stages = []
    for st in loader.plan.stages:
        if st.kind not in (StageKind.TRANSFORM, StageKind.ROWS):
            stages.append((st.name, DRIVER, 1))
        else:
            runner = loader.runners.get(st.index)
            workers = runner.workers if runner is not None else st.workers
            stages.append((st.name, st.runner_kind, int(workers)))

    def restarts() -> int:
        return sum(r.restarts for r in loader.runners.values())

    def backlog() -> tuple[int, int]:
        return loader.backlog.held, loader.backlog.peak

    def shm_used() -> int:
        space = shm.space()
        return space.total - space.free

    return MetricsRecorder(stages, [d.name for d in loader.recipe.datasets],
                           loader.recipe.seq_len, restarts, backlog, shm_used,
                           wait_warn_share)
