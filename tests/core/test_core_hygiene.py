"""Process pools leave nothing behind and survive dying workers without changing data.

Documents here are long (up to 3000 tokens, int32), so worker results cross
the process boundary through /dev/shm files, which must all be gone after
`close()` or after an error, as must every worker process.
"""

from __future__ import annotations

import functools
import mmap
import os
import signal
import threading
import time

import psutil
import pytest

from tests.helpers.core import (
    TIMED_OUT,
    DataSpec,
    Spec,
    World,
    build_recipe,
    crash_once,
    fail_on_id_7,
    reference_digests,
    shm_leftovers,
    within,
)
from zephon_core import Execution, Loader, batch_digest
from zephon_core.engine.processes import ProcessRunner

pytestmark = pytest.mark.slow

LONG = Spec(datasets=(DataSpec((15, 12, 9), max_len=3000, data_seed=7),), num_lanes=4,
            rows_per_lane=1, seq_len=2048, max_open_bins=2, shuffle_buffer=4)
PROCS = Execution(runner="processes", default_workers=2, group_size=2, prefetch=3)
DEADLINE = 25  # seconds; a healthy run takes a few (pool start included)


def worker_children() -> list[psutil.Process]:
    """Live child processes, except multiprocessing's resource tracker (one per interpreter)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if any("resource_tracker" in part for part in p.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        out.append(p)
    return out


def ours() -> list[str]:
    return [n for n in shm_leftovers() if n.startswith(f"zephon-{os.getpid()}-")]


def assert_clean(before: set[int]) -> None:
    deadline = time.monotonic() + 2.0
    while True:
        left = [p for p in worker_children() if p.pid not in before]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"child processes left: {[(p.pid, p.name()) for p in left]}"
    assert not ours(), f"shared-memory files left: {ours()}"


def close_and_settle(w: World) -> None:
    """Close a world whose pool is stuck, and let its threads end before failing.

    (A dispatcher thread that dies while pytest formats the failure makes both
    format tracebacks at once, which CPython 3.11 does not survive: "AST
    constructor recursion depth mismatch".)
    """
    runners = [r for loader in w.loaders for r in loader.runners.values()]
    threads = [r._thread for r in runners if isinstance(r, ProcessRunner)]
    w.close()
    for t in threads:
        t.join(timeout=5)
    for t in threading.enumerate():  # the caller's thread, if it wakes up on the close
        if t.name == "zephon-test-deadline":
            t.join(timeout=1)


def _is_shm_view(a) -> bool:
    while a is not None:
        if isinstance(a, mmap.mmap):
            return True
        a = getattr(a, "base", None) if not isinstance(a, memoryview) else a.obj
    return False


def test_close_leaves_no_process_and_no_shm():
    before = {p.pid for p in worker_children()}
    ref = reference_digests(LONG, 4)
    with World(LONG, 1, PROCS) as w:
        loader = w.loaders[0]
        pids = [pid for r in loader.runners.values() if isinstance(r, ProcessRunner)
                for pid in r.pids]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        rows = w.step()
        assert batch_digest(w.recipe.collate(rows)) == ref[0]
        assert any(_is_shm_view(s.payload["tokens"]) for row in rows for s in row.segments), \
            "long token arrays should come back as views of shared memory"
        assert w.digests(3) == ref[1:]  # and groups of the next steps are in flight now
        loader.close()  # the loader owns its pool: close() alone must release it
        assert_clean(before)
    for p in pids:
        try:
            assert psutil.Process(p).status() == psutil.STATUS_ZOMBIE, f"worker {p} alive"
        except psutil.NoSuchProcess:
            pass


def test_error_in_a_worker_leaves_nothing_behind():
    """A bug in a Map (not a BadSampleError) raised mid-iteration, inside `with Loader`."""
    before = {p.pid for p in worker_children()}
    spec = LONG.but(map_fn=fail_on_id_7)
    recipe = build_recipe(spec)
    with pytest.raises(RuntimeError) as info:
        with Loader(recipe, 0, 1, PROCS) as loader:
            for _ in range(50):
                loader.next_rows()
    msg = str(info.value)
    assert "synthetic bug on doc 7" in msg, msg
    assert "lane" in msg and "stage" in msg, msg
    assert_clean(before)


def test_killed_worker_is_restarted_and_data_unchanged():
    """SIGKILL a worker after several steps (with prefetch, it usually holds groups)."""
    before = {p.pid for p in worker_children()}
    steps = 9
    ref = reference_digests(LONG, steps)
    ex = Execution(runner="processes", default_workers=2, group_size=2, prefetch=4,
                   prefetch_steps=2)
    with World(LONG, 1, ex) as w:
        (runner,) = [r for r in w.loaders[0].runners.values() if isinstance(r, ProcessRunner)]
        got = w.digests(1)
        victims = []
        for k in range(4):
            settle = time.monotonic() + 15  # the previous victim is replaced before the next kill
            while set(victims) & set(runner.pids) and time.monotonic() < settle:
                time.sleep(0.05)
            victim = runner.pids[k % 2]
            victims.append(victim)
            os.kill(victim, signal.SIGKILL)
            more = within(DEADLINE, lambda: w.digests(2))
            if more is TIMED_OUT:
                close_and_settle(w)
                pytest.fail(f"no batch {DEADLINE}s after SIGKILL of worker {victim}: the pool "
                            f"did not recover (restarts={runner.restarts})")
            got += more
        assert got == ref
        deadline = time.monotonic() + 15  # a death is noticed, then a worker is spawned

        def replaced() -> bool:
            return runner.restarts >= len(victims) and not set(victims) & set(runner.pids)

        while not replaced() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runner.restarts >= len(victims), runner.restarts
        assert not set(victims) & set(runner.pids), (victims, runner.pids)
        assert len(runner.pids) == 2 and all(psutil.pid_exists(p) for p in runner.pids)
    assert_clean(before)


def test_worker_exiting_on_a_sample_is_rerun_without_changing_data(tmp_path):
    """A Map that calls os._exit(1) the first time it sees a document: the group is
    re-run on a fresh worker and the batches are those of the reference run."""
    before = {p.pid for p in worker_children()}
    steps = 6
    ref = reference_digests(LONG, steps)
    crash_ids = (3, 1005)
    spec = LONG.but(map_fn=functools.partial(crash_once, marker_dir=str(tmp_path),
                                             crash_ids=crash_ids))
    with World(spec, 2, PROCS, shared_runners=True) as w:
        got = within(DEADLINE, lambda: w.digests(steps))
        if got is TIMED_OUT:
            close_and_settle(w)
            pytest.fail(f"no result {DEADLINE}s after a worker exited on a document "
                        f"(markers: {sorted(p.name for p in tmp_path.iterdir())})")
        assert got == ref
        restarts = sum(r.restarts for r in w.runners.values() if isinstance(r, ProcessRunner))
    seen = sorted(p.name for p in tmp_path.iterdir())
    assert seen, "no document of crash_ids was processed: the test proves nothing"
    assert restarts >= len(seen), (restarts, seen)
    assert_clean(before)
