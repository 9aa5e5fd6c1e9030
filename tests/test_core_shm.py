"""Pooled shared-memory answers: a file is reused only once nothing can read it any more."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import shm
from zephon_core.records import Element
from zephon_core.runners import ProcessRunner

pytestmark = pytest.mark.skipif(not shm.available(), reason="needs /dev/shm")


def message(tag: int, n: int) -> dict:
    return {"tag": tag, "pixels": np.full(n, tag % 251, dtype=np.uint8),
            "ids": np.arange(tag, tag + n // 8, dtype=np.int64)}


def intact(msg: dict) -> bool:
    tag, n = msg["tag"], len(msg["pixels"])
    return bool((msg["pixels"] == tag % 251).all()
                and (msg["ids"] == np.arange(tag, tag + n // 8)).all())


def test_pooled_file_is_reused_only_after_release():
    pool = shm.SegmentPool(f"zephon-{os.getpid()}-t-", max_segments=2)
    released: list[str] = []
    try:
        a = pool.pack(message(1, 100_000))
        got_a = shm.unpack(a, released.append)
        b = pool.pack(message(2, 100_000))
        assert a.pooled and b.pooled and a.segment != b.segment
        got_b = shm.unpack(b, released.append)
        c = pool.pack(message(3, 100_000))  # both files held by the receiver: one-shot file
        assert not c.pooled
        got_c = shm.unpack(c, released.append)
        assert not (shm.SHM_DIR / c.segment).exists()
        assert all(map(intact, (got_a, got_b, got_c)))
        del got_a
        gc.collect()
        assert released == [a.segment]
        pool.release(released)
        d = pool.pack(message(4, 50_000))
        assert d.segment == a.segment
        got_d = shm.unpack(d, released.append)
        assert intact(got_d) and intact(got_b)
    finally:
        pool.close()
    assert intact(got_d) and intact(got_b)  # unlinked names, mappings still readable


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(4096, 1_500_000), st.booleans()), min_size=1,
                max_size=30),
       st.integers(1, 4))
def test_pool_never_overwrites_a_held_message(plan, max_segments):
    """Any sizes, any pattern of holding and dropping: every held message stays intact."""
    pool = shm.SegmentPool(f"zephon-{os.getpid()}-t-", max_segments=max_segments)
    released: list[str] = []
    held = []
    try:
        for tag, (size, keep) in enumerate(plan):
            pool.release(released)
            released.clear()
            got = shm.unpack(pool.pack(message(tag, size)), released.append)
            assert intact(got)
            if keep:
                held.append(got)
            del got
            gc.collect()
            assert all(map(intact, held))
            assert len(pool._maps) <= max_segments
    finally:
        pool.close()


def test_process_runner_answers_stay_intact_while_held():
    """Hold every answer of a long run (the pool fills and falls back), drop some: no answer
    is ever overwritten by a later one."""
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


def answers_of(k: int, out: list[np.ndarray]) -> bool:
    return all((a == (3 * k + j) % 251).all() for j, a in enumerate(out))


def group(start: int) -> list[Element]:
    return [Element(i, i, None) for i in range(start, start + 3)]


def shm_stage():
    from zephon_core.operators import Map, StageFn

    return StageFn([Map(grow_one, name="grow")])


def grow_one(x: int) -> np.ndarray:
    return np.full(200_000, x % 251, dtype=np.uint8)
