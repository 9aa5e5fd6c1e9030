"""Every runner measures the CPU its workers spend in each transform (issue 24.3's profile)."""

from __future__ import annotations

import time

import pytest

from tests.helpers.chaos import elements, plus_one, spin_cpu_10ms
from zephon_core import Map
from zephon_core.engine.processes import ProcessRunner
from zephon_core.engine.runner_base import timed_call
from zephon_core.engine.runners import InlineRunner, ThreadRunner
from zephon_core.ops.contract import StageFn


def two_ops() -> StageFn:
    return StageFn([Map(spin_cpu_10ms, name="spin"), Map(plus_one, name="plus")])


@pytest.mark.parametrize("make", [lambda fn: InlineRunner(fn),
                                  lambda fn: ThreadRunner(fn, 2),
                                  lambda fn: ProcessRunner(fn, 2, name="cpu")],
                         ids=["inline", "threads", "processes"])
def test_runners_measure_cpu_per_transform(make):
    runner = make(two_ops())
    try:
        assert runner.cpu_seconds() in ((), (0.0, 0.0))
        futures = [runner.submit(elements(i, 3)) for i in range(0, 12, 3)]
        assert [x for f in futures for x in f.result(timeout=120)] == list(range(1, 13))
        spin, plus = runner.cpu_seconds()
        assert spin >= 12 * 0.01 * 0.99  # 12 elements of 10 ms of CPU each
        assert spin < 12 * 0.01 + 1.0  # CPU, not the wall time of a busy machine
        assert 0 <= plus < spin / 5
    finally:
        runner.close()


def test_a_stage_is_timed_per_transform_and_a_plain_function_as_one_part():
    out, cpu = timed_call(two_ops(), elements(0, 2), time.thread_time)
    assert out == [1, 2] and len(cpu) == 2 and cpu[0] >= 0.0198
    out, cpu = timed_call(lambda els: [e.payload for e in els], elements(0, 2), time.thread_time)
    assert out == [0, 1] and len(cpu) == 1
