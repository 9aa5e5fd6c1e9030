"""`Execution`: where and how fast work runs, never what the data is."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zephon_core.common.settings import (
    check_settings,
    from_flat,
    parse_items,
    setting,
    to_flat,
)
from zephon_core.common.system import ranks_on_this_machine, usable_cores, worker_budget
from zephon_core.data.storage_settings import Coalesce, RetryPolicy, StorageSettings
from zephon_core.engine.kinds import RAY_CONNECT_TIMEOUT, RUNNERS, START_METHODS, RunnerKind
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import Transform

#: `Execution(workers=AUTO)`: the rank's worker budget split by measured cost
AUTO = "auto"


def parse_op_values(spec: str | Iterable[str], cast: Callable[[str], object] = int,
                    what: str = "N") -> dict:
    """Per-operator settings from ``OP=VALUE`` items: ``"decode=2,tokenize=1"`` or a list of
    such strings (the command line's repeated ``--workers``) -> ``{"decode": 2, "tokenize": 1}``.

    The one parser behind the command line and the TorchTitan config, so both
    accept and refuse the same spellings.
    """
    items = [spec] if isinstance(spec, str) else list(spec)
    out: dict = {}
    for item in items:
        out.update(parse_items(item, cast, f"OP={what}"))
    return out


def parse_workers(spec: str | Iterable[str]) -> dict[str, int] | str:
    """``"decode=2,tokenize=1"`` -> ``{"decode": 2, "tokenize": 1}`` (see `parse_op_values`);
    ``"auto"`` -> ``"auto"`` (`Execution.workers`: sized from measured costs)."""
    items = [spec] if isinstance(spec, str) else list(spec)
    if [i.strip() for i in items] == [AUTO]:
        return AUTO
    if any(i.strip() == AUTO for i in items):
        raise ConfigError("workers 'auto' sizes every process stage: give it alone, without "
                          f"OP=N items (got {items})")
    return parse_op_values(items, int, "N")


def parse_runners(spec: str | Iterable[str]) -> dict[str, str]:
    """``"read=threads"`` -> ``{"read": "threads"}`` (see `parse_op_values`)."""
    return parse_op_values(spec, str, "KIND")


def parse_resources(spec: str | Iterable[str]) -> dict[str, float]:
    """``"zephon_cpu=1"`` -> ``{"zephon_cpu": 1.0}``: `Execution.ray_resources` from the
    command line or the TorchTitan config (see `parse_op_values`)."""
    return parse_op_values(spec, float, "N")


@dataclass(frozen=True)
class Execution:
    """Where and how fast work runs; changing any of it never changes a batch.

    Frozen, like `Recipe`: a changed execution is a new one
    (``dataclasses.replace(ex, group_size=4)``), checked again by its declarations.

    These defaults are the only ones: the command line's flags and the
    TorchTitan config's fields take theirs from here. The default is the fast
    path, ``runner="auto"``: each operator's own preference, processes for
    read, decode and tokenize, inline for cheap maps; ``inline`` runs
    everything in the calling thread (the reference, and the cheapest for tiny
    runs); ``ray`` runs stateless stages as tasks on a Ray cluster (docs/ray.md,
    needs ``pip install 'zephon-vl[ray]'``). `runners` and `workers` override the
    runner and worker count per operator name; ``workers="auto"`` sizes the
    process stages while the loader runs: the worker budget (`default_workers`,
    else the machine's) split over them by the busy time each is measured to
    need, changed when the mix of samples changes (`engine/autoscale.py`,
    docs/observability.md). Process and Ray stages default
    to the machine's worker budget (`default_workers=None`: usable cores //
    ranks on this machine, torchrun's ``LOCAL_WORLD_SIZE``, at least 1; for Ray,
    the tasks of one rank and stage running at once), thread stages to one
    thread; an explicit setting wins.
    Consecutive transforms with the same runner and worker count are fused
    into one stage (one worker call per group). `retry` and `coalesce` govern
    reads from URLs (docs/storage.md); every stage carries them to its workers.
    """

    runner: str = setting(
        "auto", choices=("auto", *RUNNERS),
        help="default runner of every operator (auto: each operator's own: processes for "
        "read, decode and tokenize, fused into one stage)")
    runners: dict[str, str] = setting(
        default_factory=dict, metavar="OP=KIND", parse=lambda text: parse_runners(text),
        help="runner of one operator, e.g. read=threads (the others keep `runner`)")
    workers: dict[str, int] | str = setting(
        default_factory=dict, metavar="OP=N|auto", parse=lambda text: parse_workers(text),
        help="workers of one operator, e.g. tokenize=2; auto: split the rank's budget over "
        "the process stages by their measured cost while the run goes (never changes a batch)")
    default_workers: int | None = setting(
        None, min=1, help="workers of every operator not in `workers` (none: usable cores // ranks "
        "on this machine for process and Ray stages, one thread for thread stages)")
    group_size: int | None = setting(
        None, unit="samples", min=1, help="the most samples per worker call (none: 8, or 64 for "
        "a stage whose outputs all stayed under 64 KiB, such as token ids). A lane sends "
        "about 0.1 s of the stage's measured CPU per call: costly samples, clips or large "
        "photos, go in smaller groups, so fewer decoded ones wait for rows wanted steps later")
    prefetch: int | None = setting(
        None, unit="groups", min=1,
        help="groups in flight per lane and stage (none: enough to give "
        "every worker two groups, at least 2, so many lanes do not pile up finished "
        "documents in memory)")
    prefetch_steps: int = setting(1, unit="steps", min=0,
                                  help="steps collated ahead of the trainer")
    start_method: str = setting(
        "auto", choices=START_METHODS, help="how process workers start (multiprocessing). "
        "auto: fork on Linux when every Python thread but the starting one is zephon's own "
        "and torch has not initialized CUDA (workers share the loaded tokenizer and libraries: "
        "a sooner first batch, less memory), else spawn (safe beside a trainer's threads; "
        "a higher steady rate on CPU-bound media, docs/benchmarks.md)")
    fuse: bool = setting(True, help="fuse consecutive transforms with the same runner and "
                         "worker count into one stage (one worker call per group)")
    group_timeout: float | None = setting(
        300.0, unit="seconds", above=0, help="a process worker may spend this long on one group "
        "before it is killed and replaced and the group re-run (none: wait forever). A "
        "healthy group takes well under a second, a slow read or a long video seconds: 300 s "
        "never fires on those, yet a hang surfaces, naming its samples, before torch's "
        "10-minute collective timeout kills the job with no hint. A worker still starting "
        "with groups dealt to it gets this long or the pool's start patience (at least 60 "
        "s), whichever is longer")
    stall_seconds: float | None = setting(
        60.0, unit="seconds", above=0,
        help="log each lane's drops by reason after this long without "
        "a new row on any of the rank's lanes, repeated while it lasts (none: never). Only a "
        "log line: it never stops the run")
    stall_drops: int | None = setting(
        2000, unit="samples", min=1, help="a lane that drops this many consecutive samples (none "
        "reaching a row or an open bin in between) stops with a NoRowsError naming the "
        "reasons, e.g. seq_len smaller than every sample (none: never). Where it stops is a "
        "function of the lane's data, not of timing")
    #: how reads from URLs are retried (`RetryPolicy`): a deadline, never a skipped sample
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: how a group's neighbouring samples in one remote shard share a range request
    coalesce: Coalesce = field(default_factory=Coalesce)
    backlog_bytes: int | None = setting(
        256 << 20, unit="bytes", min=1, help="bytes of finished documents (decoded pixels, tokens: "
        "packer bins, rows waiting for their step, prefetched steps) one rank's lanes may "
        "hold before they stop drawing new samples (backpressure, never drops; none: no "
        "bound). See engine/backlog.py for what may pass it")
    collate_in: str = setting(
        "driver", choices=("driver", "thread"), help="with a background loader, where a step "
        "is collated: driver (after the lanes, in the driver thread) or thread (a thread of "
        "its own; measured slower on 2 busy cores, see docs/collate.md)")
    pin_memory: bool = setting(False, help="collate into page-locked memory (CUDA hosts), "
                               "ready for a non_blocking copy")
    ray_address: str | None = setting(
        None, metavar="HOST:PORT", help="with the ray runner: the cluster's head (none: "
        "RAY_ADDRESS, else the latest cluster started on this machine, else a local Ray "
        "instance; docs/ray.md)")
    ray_connect_timeout: float = setting(
        RAY_CONNECT_TIMEOUT, unit="seconds", above=0,
        help="with the ray runner and a cluster's address "
        "(ray_address or RAY_ADDRESS): how long to wait for its head to answer and the "
        "connection to be made before the run stops with an error naming the address (Ray "
        "itself retries for many minutes)")
    ray_resources: dict[str, float] = setting(
        default_factory=dict, metavar="NAME=N", parse=lambda text: parse_resources(text),
        help="with the ray runner: custom resources every task asks for besides one CPU, "
        "e.g. zephon_cpu=1, offered only by the CPU-only node pool (ray start --resources), "
        "so tasks never take the trainers' CPUs")

    @classmethod
    def from_flat(cls, flat: Mapping[str, Any]) -> Execution:
        """An `Execution` from flat names (``retry_deadline``, ``backlog_bytes``), typed
        or spelled as on the command line: the one path of the command line and the
        TorchTitan config (`zephon_core.common.settings`)."""
        return from_flat(cls, flat)

    def to_flat(self) -> dict[str, Any]:
        """The flat view: flat name -> value, what `from_flat` reads back."""
        return to_flat(self)

    def __post_init__(self) -> None:
        if isinstance(self.workers, str) and self.workers != AUTO:
            raise ConfigError(f"workers must map operator names to counts, or be {AUTO!r}; "
                              f"got {self.workers!r}")
        check_settings(self)
        for op, kind in self.runners.items():
            if kind not in (*RUNNERS, AUTO):
                raise ConfigError(f"Execution.runners names runner {kind!r} for {op!r}; "
                                  f"choose one of {', '.join((AUTO, *RUNNERS))}")
        bad = {k: v for k, v in self.ray_resources.items()
               if not isinstance(k, str) or isinstance(v, bool)
               or not isinstance(v, int | float) or not v > 0}
        if bad:
            raise ConfigError(f"ray_resources must map resource names to amounts > 0, e.g. "
                              f"{{'zephon_cpu': 1}}; got {bad}")

    @property
    def auto_workers(self) -> bool:
        """Whether the process stages are sized while the loader runs (``workers="auto"``)."""
        return self.workers == AUTO

    def worker_budget(self) -> int:
        """The process workers of one stage by default; with ``workers="auto"``, of all of
        them together: `default_workers`, else the machine's budget."""
        return self.default_workers if self.default_workers is not None else worker_budget()

    def storage(self) -> StorageSettings:
        """The settings the engine installs wherever shards are opened and read."""
        return StorageSettings(self.retry, self.coalesce)

    def runner_for(self, t: Transform) -> tuple[RunnerKind, int]:
        """Where `t` runs and with how many workers."""
        name = self.runners.get(t.name, self.runner)
        if name == AUTO:
            name = t.default_runner or RunnerKind.INLINE
        kind = RunnerKind(name)
        if kind is RunnerKind.INLINE:
            return kind, 1
        default = self.default_workers
        if default is None:
            default = worker_budget() if kind in (RunnerKind.PROCESSES, RunnerKind.RAY) else 1
        if isinstance(self.workers, str):  # auto: `Plan` splits the budget afterwards
            return kind, default
        return kind, self.workers.get(t.name, default)

    def budget_note(self) -> str:
        """How the default process worker count was chosen, for `explain()`."""
        what = ("process workers (auto: all process stages together, split by measured cost)"
                if self.auto_workers else "default process workers")
        if self.default_workers is not None:
            return f"{what}: {self.default_workers} (set explicitly)"
        return (f"{what}: {worker_budget()} = {usable_cores()} usable cores "
                f"// {ranks_on_this_machine()} rank(s) on this machine (LOCAL_WORLD_SIZE)")
