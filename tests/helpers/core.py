"""Shared helpers of the zephon_core tests.

The functions given to `Map`/`Filter` live here, at module level, so that
process workers (spawn start method) can import them. The builders below turn
a small, hashable `Spec` into a `Recipe` over synthetic in-memory documents,
so the tests need no tokenizer and no files.

Process workers import this module to unpickle the functions, so it imports
only numpy and `zephon_core.errors` at the top: importing torch in every
spawned worker would cost seconds.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from zephon_core import BadSampleError

if TYPE_CHECKING:  # the heavy modules (torch) are imported lazily: workers import this file
    from zephon_core import Execution, Loader, Recipe

VOCAB = 30011


# --- functions run by workers (must be importable, module level) -----------------
def to_tokens(payload: dict) -> dict:
    """A synthetic "tokenizer": the document's tokens are a function of its id and length."""
    if payload.get("bad"):
        raise BadSampleError("corrupt_doc", f"doc {payload['id']}", "synthetic bad sample")
    n = int(payload["n"])
    toks = (np.arange(n, dtype=np.int64) * 7 + int(payload["id"]) * 13 + 1) % VOCAB
    return {"id": int(payload["id"]), "tokens": toks.astype(np.int32)}


def costed_tokens(payload: dict) -> dict:
    """`to_tokens` where about one document in two (of at most 24 tokens) is "costly":
    ``costs["vision"]`` in 2..4, like an image's vision tokens (balanced packing tests)."""
    out = to_tokens(payload)
    doc, n = int(payload["id"]), int(payload["n"])
    if doc % 2 == 0 and 0 < n <= 24:
        out["costs"] = {"vision": 2 + (doc * 7 + n) % 3}
    return out


def slow_tokens(payload: dict) -> dict:
    """`to_tokens` after 20 ms: an artificially expensive operator (workers="auto" tests)."""
    import time

    time.sleep(0.02)
    return to_tokens(payload)


COUNTER = {"tokens": 0}


def counting_tokens(payload: dict) -> dict:
    """`to_tokens` that counts its calls in this process (inline runner: the driver)."""
    COUNTER["tokens"] += 1
    return to_tokens(payload)


PROCESSED: list[int] = []


def recording_tokens(payload: dict) -> dict:
    """`to_tokens` after 30 ms of CPU (a costly sample, like a clip), appending the
    document's id to `PROCESSED` (one thread worker: the order in which the stage served
    the lanes' groups)."""
    import time

    until = time.thread_time() + 0.03
    while time.thread_time() < until:
        pass
    PROCESSED.append(int(payload["id"]))
    return to_tokens(payload)


BALLAST = 16 << 10


def with_ballast(payload: dict) -> dict:
    """`to_tokens` plus a `BALLAST`-byte array (a stand-in for pixels): what a document
    weighs in the loader's backlog."""
    out = to_tokens(payload)
    out["ballast"] = np.full(BALLAST, int(payload["id"]) % 251, dtype=np.uint8)
    return out


def keep(payload: dict) -> bool:
    """Filter predicate: drops about one document in five."""
    return int(payload["id"]) % 5 != 3


def fail_on_id_7(payload: dict) -> dict:
    """A buggy map (an engine fault, not bad content): raises RuntimeError on document 7."""
    if int(payload["id"]) == 7:
        raise RuntimeError("synthetic bug on doc 7")
    return to_tokens(payload)


def malformed_content(payload: dict) -> dict:
    """Content errors a real operator meets: a field of the wrong type, a missing key."""
    doc = int(payload["id"])
    if doc % 9 == 4:
        return to_tokens({**payload, "n": {"not": "a number"}})  # TypeError in int()
    if doc % 9 == 6:
        return to_tokens({"id": doc})  # KeyError: 'n'
    return to_tokens(payload)


def crash_once(payload: dict, marker_dir: str, crash_ids: tuple[int, ...]) -> dict:
    """Kill the worker process the first time it sees one of `crash_ids`.

    A marker file under `marker_dir` remembers the first sighting, so the
    group re-run on a fresh worker goes through.
    """
    doc = int(payload["id"])
    if doc in crash_ids:
        marker = Path(marker_dir) / f"seen-{doc}"
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            os._exit(1)
    return to_tokens(payload)


# --- synthetic data -------------------------------------------------------------
@dataclass(frozen=True)
class DataSpec:
    shard_sizes: tuple[int, ...]
    max_len: int = 40
    data_seed: int = 0
    weight: float = 1.0
    bad_every: int = 0  # every k-th document (by id) raises BadSampleError; 0: none


def make_shards(ds: DataSpec, dataset: int) -> list[list[dict]]:
    rng = np.random.default_rng([ds.data_seed, dataset])
    shards = []
    for s, size in enumerate(ds.shard_sizes):
        docs = []
        for i in range(size):
            doc_id = dataset * 100_000 + s * 1000 + i
            doc = {"id": doc_id, "n": int(rng.integers(0, ds.max_len + 1))}
            if ds.bad_every and doc_id % ds.bad_every == 1:
                doc["bad"] = True
            docs.append(doc)
        shards.append(docs)
    return shards


@dataclass(frozen=True)
class Spec:
    """Everything that decides the data of a test recipe."""

    datasets: tuple[DataSpec, ...] = (DataSpec((12, 7, 20)),)
    num_lanes: int = 4
    rows_per_lane: int = 2
    seed: int = 0
    epochs: int | None = None
    shuffle_shards: bool = True
    shuffle_within: bool = True
    block_size: int = 8
    shuffle_pos: str | None = "pointers"  # None | "pointers" (before Read) | "payloads"
    shuffle_buffer: int = 8
    use_filter: bool = True
    seq_len: int = 32
    mode: str = "best_fit"
    max_open_bins: int = 4
    overlong: str = "split"
    on_error: str = "raise"
    map_fn: Any = None  # default: to_tokens
    combiner: Any = None  # the CombinerOp that ends the pipeline; default: Pack(seq_len, ...)
    phases: tuple = ()  # Phase(start_step, weights) of a mixture schedule
    phase_lag: int = 32
    mix_by: str = "samples"
    row_ops: tuple = ()  # RowTransforms after the combiner

    @property
    def global_batch_size(self) -> int:
        return self.num_lanes * self.rows_per_lane

    def but(self, **changes: Any) -> Spec:
        return replace(self, **changes)


def build_recipe(spec: Spec) -> Recipe:
    from zephon_core import (
        Dataset,
        Filter,
        InMemoryReader,
        Map,
        Pack,
        PackSettings,
        Read,
        Recipe,
        Shuffle,
        ShuffleSettings,
    )

    readers = [InMemoryReader(make_shards(d, j), name=f"ds{j}")
               for j, d in enumerate(spec.datasets)]
    ops: list[Any] = []
    if spec.shuffle_pos == "pointers":
        ops.append(Shuffle(spec.shuffle_buffer))
    ops.append(Read(readers))
    ops.append(Map(spec.map_fn or to_tokens, name="tokens", on_error=spec.on_error))
    if spec.shuffle_pos == "payloads":
        ops.append(Shuffle(spec.shuffle_buffer))
    if spec.use_filter:
        ops.append(Filter(keep, name="keep"))
    ops.append(spec.combiner or Pack(spec.seq_len, PackSettings(spec.mode, spec.max_open_bins,
                                                                spec.overlong)))
    return Recipe(
        datasets=[Dataset(f"ds{j}", r, d.weight)
                  for j, (r, d) in enumerate(zip(readers, spec.datasets, strict=True))],
        ops=ops,
        global_batch_size=spec.global_batch_size,
        num_lanes=spec.num_lanes,
        seed=spec.seed,
        epochs=spec.epochs,
        shuffle=ShuffleSettings(spec.shuffle_shards, spec.shuffle_within, spec.block_size),
        phases=list(spec.phases),
        phase_lag=spec.phase_lag,
        mix_by=spec.mix_by,
        row_ops=list(spec.row_ops),
    )


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --- simulated ranks ------------------------------------------------------------
class World:
    """D loaders of one recipe in one process: rank d of D, global batch = ranks in order."""

    def __init__(self, spec: Spec, D: int, execution: Execution | None = None,
                 shared_runners: bool = False, state: dict | None = None,
                 observer: Any = None, lane_hooks: Any = None) -> None:
        from zephon_core import Execution, Loader
        from zephon_core.engine.plan import Plan

        self.spec = spec
        self.recipe = build_recipe(spec)
        self.execution = execution or Execution(runner="inline")
        self.runners = (Plan(self.recipe.ops, self.execution).make_runners()
                        if shared_runners else None)
        self.loaders: list[Loader] = []
        try:
            for d in range(D):
                self.loaders.append(Loader(self.recipe, d, D, self.execution,
                                           runners=self.runners, observer=observer,
                                           lane_hooks=lane_hooks))
            if state is not None:
                for loader in self.loaders:
                    loader.load_state_dict(state)
        except BaseException:
            self.close()
            raise

    def step(self) -> list | None:
        """The global batch's rows, or None when a rank ran out of data."""
        parts = [loader.next_rows() for loader in self.loaders]
        if any(p is None for p in parts):
            return None
        return [row for p in parts for row in p]

    def digest(self, rows: list) -> str:
        from zephon_core import batch_digest

        return batch_digest(self.recipe.collate(rows))

    def digests(self, steps: int) -> list[str]:
        out = []
        for _ in range(steps):
            rows = self.step()
            if rows is None:
                break
            out.append(self.digest(rows))
        return out

    def state(self) -> dict:
        """The merged global state, JSON round-tripped (checkpoints are data)."""
        from zephon_core import merge_states

        merged = merge_states([loader.local_state_dict() for loader in self.loaders])
        return json.loads(json.dumps(merged))

    def close(self) -> None:
        for loader in self.loaders:
            loader.close()
        if self.runners is not None:
            for r in self.runners.values():
                r.close()
            self.runners = None

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run_digests(spec: Spec, D: int = 1, execution: Execution | None = None, steps: int = 6,
                shared_runners: bool = False) -> list[str]:
    with World(spec, D, execution, shared_runners) as w:
        return w.digests(steps)


_REFERENCE: dict[tuple[Spec, int], list[str]] = {}


def reference_digests(spec: Spec, steps: int) -> list[str]:
    """The reference run: one rank, inline runner, default execution (memoized)."""
    from hypothesis import assume

    from zephon_core import Execution, NoRowsError

    key = (spec, steps)
    if key not in _REFERENCE:
        try:
            _REFERENCE[key] = run_digests(spec, 1, Execution(runner="inline"), steps)
        except NoRowsError:
            assume(False)  # a recipe that drops every document has no batches to compare
    return _REFERENCE[key]


def merge_states(states: list[dict]) -> dict:
    from zephon_core import merge_states as merge

    return merge(states)


def finite_rank_main(rank: int, world: int, init_file: str, spec: Spec, out: str) -> None:
    """One real rank (a spawned process, gloo): run to the end of the data, write what it saw."""
    import torch.distributed as dist

    from zephon_core import Execution, Loader, batch_digest

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        recipe = build_recipe(spec)
        digests = []
        with Loader(recipe, rank, world, Execution(runner="inline")) as loader:
            for _ in range(10_000):
                rows = loader.next_rows()
                if rows is None:
                    break
                digests.append(batch_digest(recipe.collate(rows)))
        Path(out).write_text(json.dumps({"rank": rank, "digests": digests}))
    finally:
        dist.destroy_process_group()


TIMED_OUT = object()


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """`fn()` run on a helper thread; its value, or TIMED_OUT if it has not returned in time
    (the suite must fail, not hang, when the engine deadlocks; no pytest-timeout needed)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            result["error"] = exc

    t = threading.Thread(target=target, name="zephon-test-deadline", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        return TIMED_OUT
    if "error" in result:
        raise result["error"]
    return result["value"]


def shm_leftovers() -> list[str]:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return []
    return sorted(p.name for p in shm.glob("zephon-*"))
