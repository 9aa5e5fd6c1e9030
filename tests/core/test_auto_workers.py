"""`Execution(workers="auto")`: process stages sized from measured costs, never a batch changed.

The pool resizes without re-running or reordering a group; the sizer moves
workers toward the stage that costs more, follows a change of the mix, stays
put under noise, and keeps its limits; batches equal those of fixed workers.
"""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.chaos import elements, slow_big, stage
from tests.helpers.core import Spec, World, shm_leftovers, slow_tokens
from zephon_core import ConfigError, Execution, StageEvent
from zephon_core.engine import autoscale, shm
from zephon_core.engine.autoscale import AutoWorkers, split_workers
from zephon_core.engine.execution import parse_workers
from zephon_core.engine.metrics import MetricsRecorder
from zephon_core.engine.processes import ProcessRunner

needs_shm = pytest.mark.skipif(not shm.available(), reason="needs /dev/shm")


# --- the arithmetic -----------------------------------------------------------------
@given(st.dictionaries(st.sampled_from("abcdef"), st.floats(0, 100), min_size=1),
       st.integers(1, 32))
def test_split_gives_one_each_spends_the_budget_and_follows_the_weights(weights, cores):
    split = split_workers(weights, cores)
    assert set(split) == set(weights)
    assert min(split.values()) >= 1
    assert sum(split.values()) == max(cores, len(weights))
    for a in weights:
        for b in weights:
            if weights[a] > weights[b]:
                assert split[a] >= split[b]


def test_workers_auto_is_parsed_alone_and_validated():
    assert parse_workers("auto") == "auto" and parse_workers(["auto"]) == "auto"
    assert parse_workers(["decode=2", "tokenize=1"]) == {"decode": 2, "tokenize": 1}
    with pytest.raises(ConfigError, match="alone"):
        parse_workers(["auto", "decode=2"])
    with pytest.raises(ConfigError, match="auto"):
        Execution(workers="fast")
    assert Execution(workers="auto").auto_workers and not Execution().auto_workers


# --- the pool ------------------------------------------------------------------------
@needs_shm
def test_pool_grows_and_shrinks_while_groups_run_and_answers_are_unchanged():
    runner = ProcessRunner(stage(slow_big), workers=1, name="resize")
    try:
        futures = [runner.submit(elements(i, 2)) for i in range(0, 12, 2)]
        runner.resize(3)
        futures += [runner.submit(elements(i, 2)) for i in range(12, 40, 2)]
        deadline = time.monotonic() + 60
        while len(runner.pids) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(runner.pids) == 3 and runner.workers == 3
        runner.resize(1)  # the two last stop once they answered what they hold
        futures += [runner.submit(elements(i, 2)) for i in range(40, 60, 2)]
        results = [f.result(timeout=120) for f in futures]
        assert [int(r[0][0]) for r in results] == [i % 251 for i in range(0, 60, 2)]
        assert [int(r[1][0]) for r in results] == [(i + 1) % 251 for i in range(0, 60, 2)]
        while len(runner.pids) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(runner.pids) == 1 and runner.workers == 1
        assert runner.restarts == 0  # no worker was killed, no group re-ran
        runner.resize(2)  # and back up
        assert runner.submit(elements(7, 1)).result(timeout=60)[0][0] == 7
    finally:
        runner.close()
    assert not [n for n in shm_leftovers() if n.startswith(runner.prefix)]


@needs_shm
def test_worker_killed_while_retiring_has_its_groups_rerun_elsewhere():
    import os
    import signal

    runner = ProcessRunner(stage(slow_big), workers=2, name="retire")
    try:
        assert runner.submit(elements(0, 2)).result(timeout=60)[0][0] == 0
        futures = [runner.submit(elements(i, 2)) for i in range(2, 30, 2)]
        last = runner.pids[-1]
        runner.resize(1)
        os.kill(last, signal.SIGKILL)
        results = [f.result(timeout=120) for f in futures]
        assert [int(r[0][0]) for r in results] == list(range(2, 30, 2))
        deadline = time.monotonic() + 30
        while len(runner.pids) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runner.pids and last not in runner.pids and runner.workers == 1
    finally:
        runner.close()


# --- the sizer, on synthetic stage events ------------------------------------------
class FakeRunner:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.sizes: list[int] = []

    def resize(self, n: int) -> None:
        self.workers = n
        self.sizes.append(n)


class Sim:
    """Two process stages "a" and "b"; each window every stage finishes `groups` groups of
    its cost per group, spread over its current workers."""

    def __init__(self, budget: int = 4, workers: int = 2) -> None:
        self.rec = MetricsRecorder([("a", "processes", workers), ("b", "processes", workers)],
                                   ["d"], 8)
        self.runners = {0: FakeRunner(workers), 1: FakeRunner(workers)}
        self.sizer = AutoWorkers(self.runners, {0: "a", 1: "b"}, self.rec, budget,
                                 self.rec.set_workers)
        self.t, self.step = 100.0, 0
        self.sizer.after_step(0, self.t)

    def window(self, cost_a: float, cost_b: float, groups: int = 8) -> None:
        w = autoscale.AUTO_WINDOW_S
        for i, cost in ((0, cost_a), (1, cost_b)):
            workers = self.runners[i].workers
            per = min(cost, w * workers / groups)  # a saturated stage fills the window
            for k in range(groups):
                start = self.t + (k // workers) * per
                self.rec.observe(StageEvent(0, i, "ab"[i], "processes", start, start + per,
                                            (None,)))
        self.t += w + 1e-6
        self.step += 10
        self.sizer.after_step(self.step, self.t)

    @property
    def split(self) -> dict[str, int]:
        return self.sizer.changes[-1][1]


def test_sizer_moves_workers_to_the_costly_stage_and_back_when_the_mix_changes():
    sim = Sim(budget=6)
    assert sim.split == {"a": 2, "b": 2}
    for _ in range(4):
        sim.window(0.02, 0.10)  # "b" (say, video decode) costs five times "a"
    assert sim.split == {"a": 1, "b": 5}
    before = len(sim.sizer.changes)
    for _ in range(10):
        sim.window(0.10, 0.02)  # a phase where "a" is the costly one
    assert sim.split == {"a": 5, "b": 1}
    toward_a = [split["a"] for _, split in sim.sizer.changes[before - 1:]]
    assert toward_a == sorted(toward_a) and len(toward_a) <= 5  # steps one way, no back and forth
    assert sum(sim.split.values()) <= 6 and min(sim.split.values()) >= 1
    assert sim.runners[0].workers == 5 and sim.runners[1].workers == 1


def test_sizer_does_not_thrash_under_noise():
    rng = random.Random(0)
    sim = Sim(budget=6, workers=3)
    for _ in range(30):
        sim.window(0.05 * rng.uniform(0.8, 1.2), 0.05 * rng.uniform(0.8, 1.2))
    assert len(sim.sizer.changes) == 1 and sim.split == {"a": 3, "b": 3}


def test_sizer_ignores_the_window_of_a_change_and_thin_windows():
    sim = Sim(budget=6)
    sim.window(0.02, 0.10)
    assert sim.split == {"a": 1, "b": 5}
    sim.window(0.10, 0.02)  # the window in which the new workers start: not measured
    assert sim.split == {"a": 1, "b": 5}
    sim.window(0.10, 0.02, groups=2)  # too few groups to trust
    assert sim.split == {"a": 1, "b": 5}


# --- a real loader ------------------------------------------------------------------
@needs_shm
def test_auto_moves_workers_toward_an_expensive_operator_and_batches_are_unchanged(
        monkeypatch):
    monkeypatch.setattr(autoscale, "AUTO_WINDOW_S", 0.5)
    spec = Spec(shuffle_pos=None, use_filter=False, map_fn=slow_tokens)
    # groups of 8: the sizer trusts a window only with enough groups in it, and these
    # small documents would otherwise go 64 a call (1.3 s of sleeping each)
    ex = Execution(runner="processes", workers="auto", fuse=False, default_workers=4,
                   group_size=8)
    got: list[str] = []
    with World(spec, 1, ex) as w:
        loader = w.loaders[0]
        names = [s.name for s in loader.plan.stages]
        assert names == ["read", "tokens", "pack"]
        assert loader.sizer.changes[0][1] == {"read": 2, "tokens": 2}
        deadline = time.monotonic() + 120
        while (len(got) < 60 or len(loader.sizer.changes) < 2) and time.monotonic() < deadline:
            got.append(w.digest(w.step()))
        split = loader.sizer.changes[-1][1]
        assert split == {"read": 1, "tokens": 3}, loader.sizer.changes
        # the runner starts its third worker when its dispatcher thread next wakes (resize
        # only asks): right after the step that decided it, it may still run two
        until = time.monotonic() + 30
        while loader.runners[1].workers != 3 and time.monotonic() < until:
            time.sleep(0.01)
        assert loader.runners[1].workers == 3 and loader.plan.stages[1].workers == 3
        assert "tokens" in loader.explain() and loader.metrics().stages[1].workers == 3
    with World(spec, 1) as ref:
        want = ref.digests(len(got))
    assert got == want
