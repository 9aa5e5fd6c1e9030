"""Item 4 of issue 12: `Execution.backlog_bytes` bounds the finished documents a rank's
lanes hold, by backpressure: the batches never change, across D and resumes."""

from __future__ import annotations

import dataclasses
import gc
import os
import weakref
from multiprocessing import resource_tracker
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.core import (
    BALLAST,
    DataSpec,
    Spec,
    World,
    divisors,
    reference_digests,
    with_ballast,
)
from zephon_core import ConfigError, Execution, StageStats

# every document weighs BALLAST bytes; a payload shuffle holds finished documents too
SPEC = Spec(datasets=(DataSpec((60, 50, 70), max_len=40),), map_fn=with_ballast,
            num_lanes=4, rows_per_lane=2, seq_len=32)
SHUFFLED = SPEC.but(shuffle_pos="payloads", shuffle_buffer=6)
STEPS = 8


def run(spec: Spec, D: int, ex: Execution, steps: int = STEPS) -> tuple[list[str], list[int]]:
    with World(spec, D, ex) as w:
        return w.digests(steps), [loader.backlog.peak for loader in w.loaders]


@pytest.mark.parametrize("runner", ["inline", "threads", "processes"])
def test_peak_stays_under_the_bound(runner):
    free, free_peak = run(SPEC, 1, Execution(runner="inline", backlog_bytes=None))
    limit = 64 * BALLAST
    assert free_peak[0] > limit + 8 * BALLAST  # without the bound the lanes hold more
    group = 2
    digests, peak = run(SPEC, 1, Execution(runner=runner, backlog_bytes=limit, group_size=group))
    assert digests == free
    # the documented bound: the limit, plus one group of documents per lane of the rank
    assert 0 < peak[0] <= limit + SPEC.num_lanes * group * BALLAST


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.sampled_from([1, 6, 20, 48, 10_000]), D=st.sampled_from(divisors(4)),
       spec=st.sampled_from([SPEC, SHUFFLED]), runner=st.sampled_from(["inline", "threads"]))
def test_batches_do_not_depend_on_the_bound(docs, D, spec, runner):
    """Down to a bound of one document (below what a step needs: the lanes the step waits
    on draw a group at a time), the global batches are those of the reference."""
    digests, _ = run(spec, D, Execution(runner=runner, backlog_bytes=docs * BALLAST))
    assert digests == reference_digests(spec, STEPS)


@pytest.mark.parametrize(("D", "D2"), [(1, 2), (4, 1), (2, 4)])
def test_resume_under_a_tight_bound(D, D2):
    tight = Execution(runner="inline", backlog_bytes=6 * BALLAST)
    k = 3
    with World(SHUFFLED, D, tight) as w:
        head = w.digests(k)
        state = w.state()
    with World(SHUFFLED, D2, tight, state=state) as w2:
        tail = w2.digests(STEPS - k)
    assert head + tail == reference_digests(SHUFFLED, STEPS)


def test_backlog_is_released_when_batches_are_gone():
    with World(SPEC, 1, Execution(runner="inline", backlog_bytes=None)) as w:
        w.digests(3)
        held = w.loaders[0].backlog.held
        assert 0 < held <= w.loaders[0].backlog.peak
        w.loaders[0].drain()
        assert w.loaders[0].backlog.held == 0


def test_bad_bound_is_refused():
    with pytest.raises(ConfigError, match="backlog_bytes"):
        Execution(backlog_bytes=0)


@pytest.mark.parametrize("runner", ["threads", "processes"])
def test_an_observer_keeps_no_document_alive(runner):
    """Finished documents are freed when the last reference goes, observer or not: a
    reference cycle through a group's future would hold every answer (and its shared
    memory) until the cyclic garbage collector happened to run."""
    held = []
    for observer in (None, StageStats()):
        gc.disable()
        try:
            with World(SPEC, 1, Execution(runner=runner, default_workers=2, backlog_bytes=None),
                       observer=observer) as w:
                w.digests(STEPS)
                w.loaders[0].drain()
                held.append(w.loaders[0].backlog.held)
        finally:
            gc.enable()
    assert held == [0, 0]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("runner", ["inline", "processes"])
def test_a_closed_loader_leaves_no_lane_memory_or_file_descriptor(runner):
    """Each array's finalizer held the backlog, the backlog its lanes, the lanes their
    documents: a closed loader's lanes, their shared-memory answers (an open descriptor
    each) and the shards' file handles lived as long as the process (the test suite's
    process passed 1024 descriptors)."""
    ex = Execution(runner=runner, default_workers=2)
    resource_tracker.ensure_running()  # once per process, with a pipe of its own
    gc.collect()
    before = _open_fds()
    with World(SPEC, 1, ex) as w:
        w.digests(3)
        lanes = [weakref.ref(run) for loader in w.loaders for run in loader._runs]
    del w
    gc.collect()
    assert [lane() for lane in lanes] == [None] * len(lanes)
    assert _open_fds() == before


@dataclasses.dataclass(frozen=True)
class Pixels:
    """A dataclass that holds a document's array (as `VisionPatches` does)."""

    values: np.ndarray


class Frames(NamedTuple):
    values: np.ndarray


def ballast_in_dataclass(payload: dict) -> dict:
    out = with_ballast(payload)
    out["ballast"] = Pixels(out["ballast"])
    return out


def ballast_in_namedtuple(payload: dict) -> dict:
    out = with_ballast(payload)
    out["ballast"] = [Frames(out["ballast"])]
    return out


@pytest.mark.parametrize("map_fn", [ballast_in_dataclass, ballast_in_namedtuple])
def test_arrays_inside_records_are_counted(map_fn):
    """The backlog counts an array inside a dataclass or NamedTuple, as the shared-memory
    transport moves it: the same bytes as the bare array, the same batches."""
    free = Execution(runner="inline", backlog_bytes=None)
    digests, peak = run(SPEC, 1, free)
    wrapped = SPEC.but(map_fn=map_fn)
    assert run(wrapped, 1, free)[1] == peak
    tight = Execution(runner="inline", backlog_bytes=6 * BALLAST)
    assert run(wrapped, 1, tight)[0] == reference_digests(wrapped, STEPS)
