"""Pooled shared-memory answers: a file is reused only once nothing can read it any more."""

from __future__ import annotations

import gc
import mmap
import os
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import Element
from zephon_core.engine import shm, shm_receive
from zephon_core.engine.processes import ProcessRunner

pytestmark = pytest.mark.skipif(not shm.available(), reason="needs /dev/shm")


def message(tag: int, n: int) -> dict:
    return {"tag": tag, "pixels": np.full(n, tag % 251, dtype=np.uint8),
            "ids": np.arange(tag, tag + n // 8, dtype=np.int64)}


def intact(msg: dict) -> bool:
    tag, n = msg["tag"], len(msg["pixels"])
    return bool((msg["pixels"] == tag % 251).all()
                and (msg["ids"] == np.arange(tag, tag + n // 8)).all())


def send(pool: shm.SegmentPool, tag: int, size: int, released: list[str],
         mappings: shm.Mappings | None = None) -> tuple[str, dict]:
    """One message through the pool; returns its file's name and the received message."""
    packed = pool.pack([message(tag, size)])
    (item,) = packed.items
    (got,) = shm.unpack(packed, released.append, mappings)
    return item, got


def test_pooled_file_is_reused_only_after_release():
    grain = shm.SegmentPool.GRAIN
    pool = shm.SegmentPool(f"zephon-{os.getpid()}-t-", max_bytes=2 * grain)
    released: list[str] = []
    try:
        a, got_a = send(pool, 1, 100_000, released)
        b, got_b = send(pool, 2, 100_000, released)
        assert a.pooled and b.pooled and a.segment != b.segment
        c, got_c = send(pool, 3, 100_000, released)  # both files held: one-shot file
        assert not c.pooled and not (shm.SHM_DIR / c.segment).exists()
        assert all(map(intact, (got_a, got_b, got_c)))
        del got_a
        gc.collect()
        assert released == [a.segment]
        pool.release(released)
        d, got_d = send(pool, 4, 50_000, released)
        assert d.segment == a.segment
        assert intact(got_d) and intact(got_b)
        packed = pool.pack([message(5, 10_000), {"no": "arrays"}, message(6, 10_000)])
        got = shm.unpack(packed, released.append)
        assert intact(got[0]) and got[1] == {"no": "arrays"} and intact(got[2])
        assert packed.items[0].segment != packed.items[2].segment  # one file per item
    finally:
        pool.close()
    assert intact(got_d) and intact(got_b)  # unlinked names, mappings still readable


def test_past_the_mapping_budget_answers_are_copied_and_released_at_once(monkeypatch):
    """Each held mapping costs a file descriptor: past the budget the receiver copies."""
    monkeypatch.setattr(shm_receive, "_held", shm_receive._MappingBudget())
    shm_receive._held.limit = 1
    pool = shm.SegmentPool(f"zephon-{os.getpid()}-t-")
    released: list[str] = []
    try:
        a, got_a = send(pool, 1, 100_000, released)
        assert released == [] and shm_receive._held.held == 1
        b, got_b = send(pool, 2, 100_000, released)
        assert released == [b.segment] and shm_receive._held.held == 1  # copied, file free again
        assert not isinstance(got_b["pixels"].base, mmap.mmap)
        pool.release(released)
        c, got_c = send(pool, 3, 100_000, released)  # reuses b's file: b's copy unharmed
        assert c.segment == b.segment
        assert intact(got_a) and intact(got_b) and intact(got_c)
        del got_a
        gc.collect()
        assert shm_receive._held.held == 0 and a.segment in released
    finally:
        pool.close()


def test_a_burst_of_held_answers_does_not_keep_the_pool_large():
    """Files grown for a burst are removed once they sit free for `idle_takes` items (and
    named in the next answer, so a receiver that keeps mappings lets go); files in steady
    use are kept."""
    grain = shm.SegmentPool.GRAIN
    pool = shm.SegmentPool(f"zephon-{os.getpid()}-t-", idle_takes=6)
    released: list[str] = []
    try:
        burst = [send(pool, tag, 3 * grain, released) for tag in range(5)]
        burst_files = {item.segment for item, _ in burst}
        assert pool.bytes >= 5 * 3 * grain
        del burst
        gc.collect()
        assert set(released) == burst_files
        dropped: set[str] = set()
        for tag in range(5, 20):  # steady: one small answer at a time, released at once
            pool.release(released)
            released.clear()
            packed = pool.pack([message(tag, 100_000)])
            dropped.update(packed.dropped)
            (got,) = shm.unpack(packed, released.append)
            assert intact(got)
            del got
            gc.collect()
        steady = pool.names()  # one burst file serves every small answer
        assert len(steady) == 1 and steady < burst_files
        assert pool.bytes == (shm.SHM_DIR / next(iter(steady))).stat().st_size
        assert dropped == burst_files - steady
        assert not any((shm.SHM_DIR / n).exists() for n in dropped)
    finally:
        pool.close()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(4096, 1_500_000), st.booleans()), min_size=1,
                max_size=30),
       st.integers(1, 12), st.booleans(), st.integers(0, 8))
def test_pool_never_overwrites_a_held_message(plan, grains, kept_mappings, idle_takes):
    """Any sizes, any pattern of holding and dropping, with or without the receiver keeping
    its mappings, any idle trim: every held message stays intact, and kept mappings are of
    files the pool still has."""
    pool = shm.SegmentPool(f"zephon-{os.getpid()}-t-", max_bytes=grains * shm.SegmentPool.GRAIN,
                           idle_takes=idle_takes)
    mappings = shm.Mappings() if kept_mappings else None
    released: list[str] = []
    held = []
    try:
        for tag, (size, keep) in enumerate(plan):
            pool.release(released)
            released.clear()
            item, got = send(pool, tag, size, released, mappings)
            assert intact(got)
            if keep:
                held.append(got)
            del got
            gc.collect()
            assert all(map(intact, held))
            assert pool.bytes <= pool.max_bytes
            if mappings is not None:
                # the files the pool removed were named in its last answer and forgotten
                assert mappings.names() <= pool.names()
    finally:
        pool.close()


def test_kept_mapping_is_reused_and_released_per_answer():
    """A file read through kept mappings is mapped once; each answer in it is released when
    its own arrays are gone, and a later answer in the same file reads the new bytes."""
    pool = shm.SegmentPool(f"zephon-{os.getpid()}-t-")
    mappings = shm.Mappings()
    released: list[str] = []
    try:
        a, got_a = send(pool, 1, 100_000, released, mappings)
        assert len(mappings.names()) == 1 and released == []
        pixels = got_a["pixels"][10:20]  # a slice alone keeps the answer
        del got_a
        gc.collect()
        assert released == []
        del pixels
        gc.collect()
        assert released == [a.segment]
        pool.release(released)
        b, got_b = send(pool, 2, 60_000, released, mappings)
        assert b.segment == a.segment and len(mappings.names()) == 1 and intact(got_b)
    finally:
        pool.close()


def answers_of(k: int, out: list[np.ndarray]) -> bool:
    return all((a == (3 * k + j) % 251).all() for j, a in enumerate(out))


def test_process_runner_answers_stay_intact_while_held():
    """Hold most answers of a long run (the pool fills and falls back), drop the others: no
    answer is ever overwritten by a later one."""
    runner = ProcessRunner(shm_stage(), workers=2, name="shm-test")
    try:
        futures = [runner.submit(group(i)) for i in range(0, 120, 3)]
        kept = []
        for k, fut in enumerate(futures):
            out = fut.result(timeout=60)
            if k % 3:
                kept.append((k, out))
        for k, fut in enumerate(runner.submit(group(i)) for i in range(0, 60, 3)):
            assert answers_of(k, fut.result(timeout=60))
        assert all(answers_of(k, out) for k, out in kept)
    finally:
        runner.close()


def group(start: int) -> list[Element]:
    return [Element(i, i, None) for i in range(start, start + 3)]


def shm_stage():
    from zephon_core import Map
    from zephon_core.ops.contract import StageFn

    return StageFn([Map(grow_one, name="grow")])


def grow_one(x: int) -> np.ndarray:
    return np.full(200_000, x % 251, dtype=np.uint8)


def test_a_forked_child_does_not_keep_its_parents_owner_lock():
    """Workers fork by default where it is safe: a child must not hold the driver's
    owner lock, or once the driver dies its workers' `abandon` finds the lock held (by
    themselves) and leaves the lock file in /dev/shm."""
    prefix = f"zephon-forktest-{os.getpid()}-"
    owner = shm.OwnerLock(prefix)
    pid = os.fork()
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    try:
        os.close(owner.fd)  # the driver dies: only the child could hold the lock now
        owner.fd = -1
        shm.abandon(prefix, wait_s=1.0)
        assert not list(shm.SHM_DIR.glob(f"{prefix}*")), "the child kept the lock"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        shm.abandon(prefix)
