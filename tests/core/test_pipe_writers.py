"""A worker's queued group never waits behind another worker's (engine/pipe_sender.py).

A group larger than a pipe's buffer is written only as its busy worker reads it, after
the group it runs; with one writer for every pipe, the groups queued after it for idle
workers waited as long (decode after packing: a row's encoded bytes, megabytes).
"""

from __future__ import annotations

import time

import pytest

from tests.helpers.chaos import sleep_then_size
from zephon_core import Element, Map, Origin
from zephon_core.engine import shm
from zephon_core.engine.processes import ProcessRunner
from zephon_core.ops.contract import StageFn

pytestmark = pytest.mark.skipif(not shm.available(), reason="needs /dev/shm")


def group(i: int, sleep: float, blob: int = 0) -> list[Element]:
    return [Element(i, {"sleep": sleep, "blob": b"x" * blob}, Origin(i, 0, 1, i, 0))]


def test_an_idle_worker_gets_its_group_while_another_worker_reads_a_large_one_later():
    """Fails on the old sender: the quick group came after the 3 s one, behind the 16 MB
    group queued for the busy worker. (The other worker's 0.5 s group keeps it the less
    busy one while the groups are dealt, however slowly this test runs.)"""
    runner = ProcessRunner(StageFn([Map(sleep_then_size, name="sleepy")]), workers=2,
                           name="writers", start_method="fork")
    try:
        assert [f.result(timeout=60) for f in
                (runner.submit(group(0, 0.0)), runner.submit(group(1, 0.0)))] == [[0], [0]]
        busy = runner.submit(group(2, 3.0))              # worker 0, 3 s
        runner.submit(group(3, 0.5))                      # worker 1, 0.5 s
        large = runner.submit(group(4, 0.0, 16 << 20))    # queued for worker 0 (busy)
        start = time.monotonic()
        quick = runner.submit(group(5, 0.0))              # queued for worker 1
        assert quick.result(timeout=60) == [0]
        waited = time.monotonic() - start
        assert large.result(timeout=60) == [16 << 20] and busy.result(timeout=60) == [0]
    finally:
        runner.close()
    assert waited < 2.0, f"the quick group waited {waited:.2f} s behind the busy worker's"
