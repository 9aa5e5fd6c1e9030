"""Mixture schedules (`Phase`): the mixture changes at a step, deterministically.

Guarantee 1 must survive a schedule: every batch is a function of the data and
the recipe only, at every D, across resumes, whatever the execution knobs.
The semantics (engine.phases, docs/elastic-changes.md): lane `l` starts phase
`p` at the draw `phase_lag` draws after the first one it pushes to the
combiner once its rows of steps `< start_step` are complete; so steps before
`start_step` hold old-phase draws only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.core import DataSpec, Spec, World, divisors, reference_digests
from zephon_core import CheckpointError, ConfigError, Execution, Phase
from zephon_core.engine.ledger import lane_entries, mixture_shares, step_entry

DATA = (DataSpec((30, 17, 25), max_len=30, data_seed=1),
        DataSpec((11, 9, 14), max_len=20, data_seed=2, weight=0.5),
        DataSpec((23,), max_len=25, data_seed=3, weight=0.0))
EXECUTIONS = [Execution(runner="inline"),
              Execution(runner="inline", group_size=1, prefetch=1),
              Execution(runner="threads", group_size=3, prefetch=4, default_workers=2),
              Execution(runner="threads", group_size=8, prefetch=2, fuse=False)]

weights = st.dictionaries(st.sampled_from(["ds0", "ds1", "ds2"]),
                          st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=1).filter(
    lambda w: sum(w.values()) > 0)


@st.composite
def schedules(draw) -> tuple[Phase, ...]:
    starts = sorted(draw(st.sets(st.integers(0, 6), min_size=1, max_size=3)))
    return tuple(Phase(s, draw(weights)) for s in starts)


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(L=st.sampled_from([1, 2, 4, 8]), phases=schedules(), lag=st.sampled_from([0, 2, 32]),
       shuffle_pos=st.sampled_from([None, "pointers", "payloads"]),
       k=st.integers(0, 8), ex=st.sampled_from(EXECUTIONS), ex2=st.sampled_from(EXECUTIONS),
       mix_by=st.sampled_from(["samples", "tokens"]), data=st.data())
def test_a_schedule_gives_the_same_batches_at_every_D_knob_and_resume(
        L, phases, lag, shuffle_pos, k, ex, ex2, mix_by, data):
    # a phase may also change the global batch size (engine.batches)
    sizes = data.draw(st.lists(st.sampled_from([None, 1, 3]), min_size=len(phases),
                               max_size=len(phases)))
    phases = tuple(Phase(p.start_step, p.weights, None if g is None else g * L)
                   for p, g in zip(phases, sizes, strict=True))
    spec = Spec(datasets=DATA, num_lanes=L, rows_per_lane=2, shuffle_pos=shuffle_pos,
                shuffle_buffer=5, phases=phases, phase_lag=lag, mix_by=mix_by)
    steps = 9
    ref = reference_digests(spec, steps)
    D = data.draw(st.sampled_from(divisors(L)))
    D2 = data.draw(st.sampled_from(divisors(L)))
    with World(spec, D, ex) as w:
        assert w.digests(k) == ref[:k]
        state = w.state()
    with World(spec, D2, ex2, state=state) as w2:
        assert w2.digests(steps - k) == ref[k:]


def _datasets_by_step(spec: Spec, steps: int, D: int = 1,
                      ex: Execution | None = None) -> list[list[list[set[int]]]]:
    """Per step, per lane, per row: the datasets of its samples."""
    r = spec.rows_per_lane
    out = []
    with World(spec, D, ex) as w:
        for _ in range(steps):
            rows = w.step()
            out.append([[{s.origin.dataset for s in row.segments} for row in rows[i:i + r]]
                        for i in range(0, len(rows), r)])
    return out


@pytest.mark.parametrize("lag", [0, 5])
@pytest.mark.parametrize("shuffle_pos", [None, "pointers", "payloads"])
def test_steps_before_a_phase_hold_only_the_old_mixture(lag, shuffle_pos):
    start = 3
    spec = Spec(datasets=DATA[:2], num_lanes=4, rows_per_lane=2, shuffle_pos=shuffle_pos,
                shuffle_buffer=4, phases=(Phase(0, {"ds0": 1.0}), Phase(start, {"ds1": 1.0})),
                phase_lag=lag)
    seen = _datasets_by_step(spec, 14, 2, Execution(runner="threads", group_size=2))
    for t, lanes in enumerate(seen):
        for rows in lanes:
            held = set().union(*rows)
            if t < start:
                assert held == {0}, (t, rows)
    # the new phase arrives in every lane and, once it has, the old one is gone for good
    assert all(set().union(*rows) == {1} for rows in seen[-1])


def test_without_a_lag_the_new_phase_starts_right_after_the_boundary():
    """One open bin, nothing shuffled after the source, `phase_lag = 0`: the only old
    sample at or after the boundary is the one that did not fit the last old row, and it
    begins each lane's first row of the new phase."""
    start = 2
    spec = Spec(datasets=DATA[:2], num_lanes=2, rows_per_lane=2, shuffle_pos=None,
                use_filter=False, max_open_bins=1,
                phases=(Phase(0, {"ds0": 1.0}), Phase(start, {"ds1": 1.0})), phase_lag=0)
    with World(spec, 1) as w:
        steps = [w.step() for _ in range(5)]
    r = spec.rows_per_lane
    for lane in range(spec.num_lanes):
        rows = [row for rows in steps for row in rows[lane * r:(lane + 1) * r]]
        first_new = rows[start * r]
        datasets = [s.origin.dataset for s in first_new.segments]
        assert datasets[0] == 0 and set(datasets[1:]) <= {1}, datasets
        assert all(s.origin.dataset == 1 for row in rows[start * r + 1:] for s in row.segments)
        assert all(s.origin.dataset == 0 for row in rows[:start * r] for s in row.segments)


def test_with_a_lag_the_first_new_phase_draw_is_the_documented_one():
    """The rule of docs/elastic-changes.md, with `phase_lag > 0` and no shuffle: draw `n` is
    the lane's first of the new phase iff `R(n - 1 - phase_lag) >= B`, where `R(m)` is the rows
    the combiner has made once draws `0..m` reached it (each element's trigger is its own
    draw). `R` is recomputed here by feeding a fresh combiner the lane's delivered samples in
    draw order. After the switch the old phase is never drawn again: the old samples in rows
    from the first one holding a new-phase sample on are those the combiner held then."""
    start, lag = 2, 3
    spec = Spec(datasets=DATA[:2], num_lanes=2, rows_per_lane=2, shuffle_pos=None,
                use_filter=False, phases=(Phase(0, {"ds0": 1.0}), Phase(start, {"ds1": 1.0})),
                phase_lag=lag)
    r, steps = spec.rows_per_lane, 8
    with World(spec, 1, Execution(runner="threads", group_size=2, prefetch=3)) as w:
        out = [w.step() for _ in range(steps)]
        state = w.state()
        combiner_op, seed = w.recipe.combiner, w.recipe.seed
    B = start * r
    for lane in range(spec.num_lanes):
        rows = [row for rows in out for row in rows[lane * r:(lane + 1) * r]]
        payloads = {s.origin: s.payload for row in rows for s in row.segments}
        ordered = sorted(payloads, key=lambda o: o.seq)
        first_new = min(o.seq for o in ordered if o.dataset == 1)
        assert all(o.dataset == 0 for o in ordered if o.seq < first_new)
        # R(m) for every old draw m, from a fresh combiner fed in draw order
        fresh, made, R = combiner_op.make(lane, seed), [], [0] * first_new
        for o in ordered:
            if o.seq >= first_new:
                break
            assert fresh.push(o, payloads[o]) is None
            while (row := fresh.pop_row()) is not None:
                made.append([(s.origin, s.start, s.end) for s in row.segments])
            R[o.seq] = len(made)  # a draw dropped before the combiner leaves R as it was
        R = [max(R[:m + 1]) for m in range(first_new)]
        predicted = next(n for n in range(1 + lag, first_new + 1) if R[n - 1 - lag] >= B)
        assert first_new == predicted, (lane, first_new, predicted)
        assert predicted > next(n for n in range(1, first_new + 1) if R[n - 1] >= B), \
            "the lag did not move the switch: this test would not see it"
        assert state["lanes"][str(lane)]["phase_gate"]["start_draws"] == [predicted]
        # rows before B hold old draws only; from the first row with a new-phase sample on,
        # the old samples are exactly those the combiner held when the new phase began
        assert made == [[(s.origin, s.start, s.end) for s in row.segments]
                        for row in rows[:len(made)]]  # the same rows as the lane's
        held = {o for o in ordered if o.seq < first_new} - {
            s.origin for row in rows[:len(made)] for s in row.segments}
        switch = next(i for i, row in enumerate(rows)
                      if any(s.origin.dataset == 1 for s in row.segments))
        assert switch >= len(made) >= B
        late_old = {s.origin for row in rows[switch:] for s in row.segments
                    if s.origin.dataset == 0}
        assert late_old <= held, sorted(late_old - held)
        assert all(s.origin.dataset == 0 for row in rows[:B] for s in row.segments)


def test_within_a_phase_the_deficit_rule_restarts():
    """A phase's mixture is its own from its first draw: history does not skew it."""
    spec = Spec(datasets=DATA[:2], num_lanes=1, rows_per_lane=4, shuffle_pos=None,
                phases=(Phase(0, {"ds0": 1.0}), Phase(2, {"ds0": 1.0, "ds1": 1.0})),
                phase_lag=0)
    with World(spec, 1) as w:
        w.digests(6)
        src = w.state()["lanes"]["0"]["source"]
    assert src["phase"] == 1
    n = src["draws"] - src["phase_start"]
    assert abs(src["phase_counts"][0] - n / 2) <= 1 and src["counts"][1] == src["phase_counts"][1]


def test_datasets_join_and_leave_at_phases_exactly_by_draw():
    """Every sample drawn in phase p comes from a dataset weighted > 0 in p: ds2 (weight 0
    at first) joins at phase 1, ds0 leaves at phase 2; the ledger names each sample's
    phase, and a step's mixture lists every dataset of the recipe, 0 for one it holds none of."""
    from tests.helpers.core import build_recipe
    from zephon_core.engine.plan import Plan
    from zephon_core.engine.simulate import SimulatedRanks

    phases = (Phase(2, {"ds0": 1.0, "ds1": 1.0, "ds2": 2.0}), Phase(4, {"ds1": 1.0, "ds2": 1.0}))
    spec = Spec(datasets=DATA, num_lanes=4, rows_per_lane=2, shuffle_pos="payloads",
                shuffle_buffer=3, phases=phases, phase_lag=3)
    allowed = [{0, 1}, {0, 1, 2}, {1, 2}]
    recipe = build_recipe(spec)
    ex = Execution(runner="threads", group_size=2)
    runners = Plan(recipe.ops, ex, digests=True).make_runners()
    try:
        sim = SimulatedRanks(recipe, 2, ex, runners, digests=True)
        seen = set()
        for _ in range(14):
            entry = sim.global_step().ledger
            for row in entry["rows"]:
                for sample in row["samples"]:
                    assert sample["dataset"] in allowed[sample["phase"]], sample
                    seen.add(sample["phase"])
            mix = entry["mixture"]
            assert set(mix["tokens"]) == set(mix["samples"]) == {"0", "1", "2"}
            assert {int(k) for k, v in mix["tokens"].items() if v} <= set().union(
                *(allowed[p] for p in mix["phases"]))
        assert seen == {0, 1, 2}
        assert mix["tokens"]["0"] == mix["samples"]["0"] == 0  # ds0 has left by the last step
    finally:
        for loader in sim.loaders:
            loader.close()
        for r in runners.values():
            r.close()


def test_the_ledger_shows_the_realized_mixture():
    spec = Spec(datasets=DATA[:2], num_lanes=2, rows_per_lane=2, shuffle_pos=None,
                phases=(Phase(0, {"ds0": 1.0}), Phase(3, {"ds1": 1.0})), phase_lag=0)
    names = ["ds0", "ds1"]
    shares = []
    with World(spec, 1) as w:
        for t in range(8):
            rows = w.step()
            entry = step_entry(t, lane_entries(list(range(2)), 2, rows))
            entry = json.loads(json.dumps(entry))
            tokens = sum(len(s.payload["tokens"][s.start:s.end]) for row in rows
                         for s in row.segments if s.origin.dataset == 0)
            assert entry["mixture"]["tokens"].get("0", 0) == tokens
            shares.append(mixture_shares(entry, names))
    assert all(s == {"ds0": 1.0, "ds1": 0.0} for s in shares[:3])
    assert shares[-1] == {"ds0": 0.0, "ds1": 1.0}


def test_a_bad_schedule_is_refused():
    base = Spec(datasets=DATA[:2], num_lanes=2, rows_per_lane=1)
    for phases, match in [((Phase(2, {"ds9": 1.0}),), "unknown datasets"),
                          ((Phase(3, {"ds0": 1.0}), Phase(3, {"ds1": 1.0})), "increasing"),
                          ((Phase(1, {"ds0": 0.0}),), "positive sum")]:
        with pytest.raises(ConfigError, match=match):
            World(base.but(phases=phases), 1)


def test_a_checkpoint_refuses_a_changed_schedule_naming_the_field():
    spec = Spec(datasets=DATA[:2], num_lanes=2, rows_per_lane=1,
                phases=(Phase(2, {"ds1": 1.0}),))
    with World(spec, 1) as w:
        w.digests(1)
        state = w.state()
    for other, field in [(spec.but(phases=(Phase(3, {"ds1": 1.0}),)), "phases"),
                         (spec.but(phases=()), "phase"),
                         (spec.but(phase_lag=4), "phase_lag")]:
        with pytest.raises(CheckpointError, match=field):
            World(other, 1, state=state)
    static = Spec(datasets=DATA[:2], num_lanes=2, rows_per_lane=1)
    with World(static, 1) as w:
        w.digests(1)
        old = w.state()
    with pytest.raises(CheckpointError, match=r"fingerprint\.phase"):
        World(spec, 1, state=old)


def test_toml_phases_build_the_schedule(tmp_path: Path):
    from zephon_core.recipes.assets import text_corpus
    from zephon_core.recipes.registry import recipe_from_toml

    shards = text_corpus()
    path = tmp_path / "two.toml"
    path.write_text(TWO_PHASES.format(a=json.dumps([str(p) for p in shards[:2]]),
                                      b=json.dumps([str(p) for p in shards[3:]])))
    recipe = recipe_from_toml(path)
    assert recipe.phases == [Phase(3, {"b": 1.0, "a": 1.0})] and recipe.phase_lag == 8
    assert recipe.mix_by == "tokens" and recipe.fingerprint()["mix_by"] == "tokens"
    assert recipe.schedule() == ([0, 3], [[3.0, 1.0], [1.0, 1.0]])
    path.write_text(path.read_text().replace("start_step = 3", "start = 3"))
    with pytest.raises(ConfigError, match=r"two\.toml: \[\[phases\]\] #1 needs start_step"):
        recipe_from_toml(path)


TWO_PHASES = """
kind = "text"
seq_len = 256
global_batch_size = 8
num_lanes = 4
shuffle_buffer = 16
phase_lag = 8
mix_by = "tokens"
[[datasets]]
name = "a"
files = {a}
weight = 3.0
[[datasets]]
name = "b"
files = {b}
[[phases]]
start_step = 3
weights = {{ a = 1.0, b = 1.0 }}
"""


@pytest.mark.parametrize("lag", [0, 16])
def test_token_shares_follow_the_weights(lag):
    """Long and short documents 1:1 by tokens: about five short ones per long one, and the
    realized token share near 1/2 (by samples it would be near 5/6 for the long ones)."""
    data = (DataSpec((200, 150), max_len=40, data_seed=4),
            DataSpec((300, 250), max_len=8, data_seed=5))
    spec = Spec(datasets=data, num_lanes=2, rows_per_lane=2, seq_len=64, shuffle_pos=None,
                use_filter=False, mix_by="tokens", phase_lag=lag)
    tokens = [0, 0]
    with World(spec, 2, Execution(runner="threads", group_size=4)) as w:
        for _ in range(30):
            for row in w.step():
                for s in row.segments:
                    tokens[s.origin.dataset] += s.end - s.start
    share = tokens[0] / sum(tokens)
    assert 0.45 < share < 0.55, tokens
    by_samples = spec.but(mix_by="samples")
    with World(by_samples, 1) as w:
        t2 = [0, 0]
        for _ in range(30):
            for row in w.step():
                for s in row.segments:
                    t2[s.origin.dataset] += s.end - s.start
    assert t2[0] / sum(t2) > 0.7, t2


def test_phases_tokens_and_batch_sizes_under_the_processes_runner():
    """The same batches with worker processes as inline (guarantee 1: runner type)."""
    spec = Spec(datasets=DATA, num_lanes=4, rows_per_lane=1, shuffle_pos="payloads",
                shuffle_buffer=4, mix_by="tokens", phase_lag=6,
                phases=(Phase(2, {"ds1": 1.0, "ds2": 1.0}, 8), Phase(4, {"ds0": 1.0}, 4)))
    ref = reference_digests(spec, 7)
    with World(spec, 2, Execution(runner="processes", default_workers=2, group_size=2)) as w:
        assert w.digests(7) == ref
