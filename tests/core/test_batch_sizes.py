"""A global batch size that changes (phases, or a resume that asks): lane rows stay, steps move.

Step `t` takes rows ``[R(t), R(t) + r(t))`` of every lane, `R(t)` the rows
per lane of the steps before it (engine.batches): so every lane's rows are
the rows of the static run, at every D, across resumes and knobs.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.core import DataSpec, Spec, World, divisors
from zephon_core import CheckpointError, ConfigError, Execution, Phase
from zephon_core.engine.batches import BatchSchedule

BASE = Spec(datasets=(DataSpec((30, 17, 25), max_len=30, data_seed=1),
                      DataSpec((11, 9), max_len=20, data_seed=2, weight=0.5)),
            num_lanes=4, rows_per_lane=2, shuffle_pos="payloads", shuffle_buffer=5)
EXECUTIONS = [Execution(runner="inline"),
              Execution(runner="threads", group_size=3, prefetch=4, default_workers=2)]


def _lane_rows(w: World, steps: int, L: int, rows_of: list[int]) -> list[list[tuple]]:
    """Run `steps` steps; split each global batch into its lanes' rows."""
    per_lane: list[list[tuple]] = [[] for _ in range(L)]
    for _ in range(steps):
        rows = w.step()
        assert rows is not None
        rows_of.append(len(rows))
        r = len(rows) // L
        for lane in range(L):
            per_lane[lane] += [tuple((s.origin, s.start, s.end) for s in row.segments)
                               for row in rows[lane * r:(lane + 1) * r]]
    return per_lane


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(L=st.sampled_from([1, 2, 4]), sizes=st.lists(st.tuples(st.integers(1, 6),
                                                              st.integers(1, 3)), max_size=2),
       k=st.integers(0, 6), resume_r=st.one_of(st.none(), st.integers(1, 3)),
       ex=st.sampled_from(EXECUTIONS), data=st.data())
def test_lane_rows_are_the_static_runs_whatever_the_batch_sizes(L, sizes, k, resume_r, ex,
                                                                 data):
    phases = tuple(Phase(s, global_batch_size=r * L) for s, r in sorted(dict(sizes).items()))
    spec = BASE.but(num_lanes=L, phases=phases)
    steps = 8
    D = data.draw(st.sampled_from(divisors(L)))
    D2 = data.draw(st.sampled_from(divisors(L)))
    rows_of: list[int] = []
    with World(spec, D, ex) as w:
        head = _lane_rows(w, k, L, rows_of)
        state = w.state()
    G = None if resume_r is None else resume_r * L
    with World(spec, D2, ex) as w2:
        for loader in w2.loaders:
            loader.load_state_dict(state, global_batch_size=G)
        tail = _lane_rows(w2, steps - k, L, rows_of)
    with World(BASE.but(num_lanes=L), 1) as ref:
        static = _lane_rows(ref, sum(rows_of) // (2 * L) + 1, L, [])
    for lane in range(L):
        got = head[lane] + tail[lane]
        assert got == static[lane][:len(got)]
    want = BatchSchedule.build(L, 2 * L, [(p.start_step, p.global_batch_size) for p in phases],
                               [] if G is None else [(k, G)])
    assert rows_of == [want.r_at(t) * L for t in range(steps)]


def test_a_resize_holds_until_the_next_phase_that_sets_one_and_is_kept_in_the_state():
    spec = BASE.but(phases=(Phase(5, global_batch_size=4),))
    with World(spec, 2) as w:
        w.digests(2)
        state = w.state()
    with World(spec, 4) as w2:
        for loader in w2.loaders:
            loader.load_state_dict(state, global_batch_size=12)
        assert [len(w2.step()) for _ in range(4)] == [12, 12, 12, 4]
        later = w2.state()
    assert later["global_batch_sizes"] == [[2, 12]]
    with World(spec, 1, state=later) as w3:  # a plain resume keeps the recorded change
        assert [len(w3.step()) for _ in range(2)] == [4, 4]


def test_an_unrequested_change_is_refused_naming_the_field():
    with World(BASE, 2) as w:
        w.digests(2)
        state = w.state()
    with pytest.raises(CheckpointError, match=r"fingerprint\.global_batch_size is 8 in the "
                                              r"checkpoint but 12 here"):
        World(BASE.but(rows_per_lane=3), 1, state=state)
    with pytest.raises(ConfigError, match="multiple of num_lanes"):
        with World(BASE, 1) as w:
            w.loaders[0].load_state_dict(state, global_batch_size=6)
    with pytest.raises(ConfigError, match="multiple of num_lanes"):
        World(BASE.but(phases=(Phase(2, global_batch_size=6),)), 1)


def test_a_damaged_resize_record_is_refused():
    with World(BASE, 1) as w:
        w.digests(1)
        state = w.state()
    state["global_batch_sizes"] = [[1, "x"]]
    with pytest.raises(CheckpointError, match="global_batch_sizes"):
        World(BASE, 1, state=state)


def test_a_phase_at_step_0_sets_the_first_batch_size():
    spec = BASE.but(phases=(Phase(0, global_batch_size=4),))
    with World(spec, 2) as w:
        assert [len(w.step()) for _ in range(3)] == [4, 4, 4]
        state = w.state()
    with World(spec, 4, state=state) as w2:
        assert len(w2.step()) == 4
