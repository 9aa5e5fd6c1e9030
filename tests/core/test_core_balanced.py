"""Balanced packing (`BalancedPack`): equal cost per lane and step, with every guarantee.

Synthetic documents (`costed_tokens`): one in three carries a "vision" cost.
Properties: every document once (or dropped for its recorded reason), rows
within `seq_len`, the same global batches at every `D`, the same batches after
a resume on another `D`, a damaged state refused; and on a fixed mixture the
worst step's max/mean over lanes of the cost is far lower than `Pack`'s.
"""

from __future__ import annotations

import statistics

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.core import (
    DataSpec,
    Spec,
    World,
    costed_tokens,
    divisors,
    reference_digests,
)
from tests.helpers.ledger import Ledger, check_ledger, lane_streams, owners
from zephon_core import BalancedPack, BalanceSettings, CheckpointError, ConfigError, Execution
from zephon_core.internals import combiner_state

COST = "vision"


def balanced(budget: float = 3.0, rows: int = 2, heavy_every: int = 0, heavy: float = 0.0,
             split_text: bool = True, lookahead: int = 2, seq_len: int = 32) -> BalancedPack:
    targets = BalanceSettings(budget, heavy_every=heavy_every, heavy_budget=heavy,
                              lookahead=lookahead, split_text=split_text)
    return BalancedPack(seq_len, COST, targets, rows_per_group=rows)


def spec_for(combiner: BalancedPack, data_seed: int = 3, sizes: tuple[int, ...] = (30, 21),
             epochs: int | None = None) -> Spec:
    return Spec(datasets=(DataSpec(sizes, max_len=40, data_seed=data_seed),
                          DataSpec((14, 9), max_len=20, data_seed=data_seed + 1, weight=0.5)),
                num_lanes=4, rows_per_lane=combiner.rows_per_group, shuffle_pos="pointers",
                seq_len=combiner.seq_len, overlong="split" if combiner.split_text else "drop",
                map_fn=costed_tokens, combiner=combiner, epochs=epochs)


MODES = st.sampled_from([
    dict(budget=1.5), dict(budget=1.5, split_text=False), dict(budget=2.0, rows=1),
    dict(budget=1.5, heavy_every=3, heavy=8.0), dict(budget=1.0, lookahead=1),
])
SLOW = settings(max_examples=6, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.slow
@SLOW
@given(mode=MODES, data_seed=st.integers(0, 50), D=st.sampled_from([1, 2, 4]))
def test_every_document_once_and_rows_within_seq_len(mode, data_seed, D):
    spec = spec_for(balanced(**mode), data_seed, epochs=1)
    streams = lane_streams(spec)
    owner = owners(streams)
    ledger = Ledger()
    with World(spec, D, Execution(group_size=3)) as w:
        for loader in w.loaders:
            while loader.next_rows() is not None:
                meta = loader.last_meta
                ledger.add_rows(meta.lanes, meta.rows, spec.rows_per_lane)
                ledger.add_drops(owner, meta.drops)
            ledger.add_drained(loader.drain(), owner)
    check_ledger(spec, streams, ledger)


@SLOW
@given(mode=MODES, data_seed=st.integers(0, 50), data=st.data())
def test_same_batches_at_every_D_and_after_a_resume_on_another_D(mode, data_seed, data):
    spec = spec_for(balanced(**mode), data_seed)
    steps = 7
    ref = reference_digests(spec, steps)
    D = data.draw(st.sampled_from(divisors(spec.num_lanes)), label="D")
    D2 = data.draw(st.sampled_from(divisors(spec.num_lanes)), label="D2")
    k = data.draw(st.integers(1, steps - 1), label="k")
    with World(spec, D) as w:
        assert w.digests(k) == ref[:k]
        state = w.state()
    with World(spec, D2, Execution(runner="threads", default_workers=2), state=state) as w2:
        assert w2.digests(steps - k) == ref[k:]


def _lane_costs(spec: Spec, steps: int) -> list[list[int]]:
    """Per step, the cost each lane's rows carry (one rank per lane)."""
    out = []
    with World(spec, spec.num_lanes) as w:
        for _ in range(steps):
            out.append([sum(int((s.payload.get("costs") or {}).get(COST, 0))
                            for row in loader.next_rows() for s in row.segments)
                        for loader in w.loaders])
    return out


def test_balance_improves_on_a_fixed_mixture():
    steps = 24
    mode = balanced(budget=1.55, rows=4)  # the data's mean cost per row
    plain = _lane_costs(spec_for(mode).but(combiner=None), steps)
    even = _lane_costs(spec_for(mode), steps)

    def ratios(costs: list[list[int]]) -> list[float]:
        return [max(c) / max(statistics.mean(c), 1e-9) for c in costs]

    assert statistics.mean(sum(c) for c in even) > 0
    assert max(ratios(plain)) > 2.0 and statistics.median(ratios(plain)) > 1.5
    assert max(ratios(even)) <= 1.25 and statistics.median(ratios(even)) <= 1.1


def test_state_holds_the_buffers_and_a_damaged_one_is_refused():
    spec = spec_for(balanced())
    with World(spec, 2) as w:
        w.digests(3)
        state = w.state()
    packers = [combiner_state(lane) for lane in state["lanes"].values()]
    assert all(p["group"] == 3 for p in packers)
    assert any(p["costly"] or p["text"] for p in packers)

    def damaged(edit) -> dict:
        import json

        copy = json.loads(json.dumps(state))
        edit(combiner_state(next(iter(copy["lanes"].values()))))
        return copy

    edits = [lambda p: p.__setitem__("group", -1),
             lambda p: p.__setitem__("costly", "x"),
             lambda p: p["text"].append([0, 0, 0, 0, 0, 5, 3]),
             lambda p: p["ready"].append([[0, 0, 0, 0, 0, 0, 99]])]
    for edit in edits:
        with World(spec, 1) as w2, pytest.raises(CheckpointError):
            w2.loaders[0].load_state_dict(damaged(edit))


def test_settings_are_checked():
    with pytest.raises(ConfigError, match=r"BalanceSettings\.budget must be > 0; got 0"):
        balanced(budget=0)
    with pytest.raises(ConfigError, match="heavy_budget"):
        balanced(budget=3.0, heavy_every=3, heavy=2.0)
    with pytest.raises(ConfigError, match="heavy_every"):
        balanced(heavy_every=1, heavy=10.0)
    assert balanced(heavy_every=3, heavy=12.0).target(2) == 12.0
    assert balanced(heavy_every=3, heavy=12.0).target(0) == pytest.approx((18 - 12) / 2)


@pytest.mark.parametrize("kind", ["costly only", "text only", "costly then text"])
def test_one_sided_streams_lose_nothing(kind):
    import numpy as np

    from zephon_core import Origin

    op = balanced(budget=2.0, rows=3)
    packer = op.make(0, 0)

    def doc(i: int, costly: bool) -> dict:
        out = {"tokens": np.arange(5 + i % 20, dtype=np.int32)}
        if costly:
            out["costs"] = {COST: 1 + i % 4}
        return out

    docs = {"costly only": [True] * 90, "text only": [False] * 90,
            "costly then text": [True] * 60 + [False] * 60}[kind]
    rows = []
    for i, costly in enumerate(docs):
        assert packer.push(Origin(i, 0, 0, i, 0), doc(i, costly)) is None
        while (row := packer.pop_row()) is not None:
            rows.append(row)
    assert packer.held_origins() or rows
    packer.flush()
    while (row := packer.pop_row()) is not None:
        rows.append(row)
    assert not packer.held_origins()
    seen: dict[int, int] = {}
    for row in rows:
        assert 0 < row.num_tokens <= op.seq_len
        for s in row.segments:
            seen[s.origin.seq] = seen.get(s.origin.seq, 0) + s.length
    assert seen == {i: 5 + i % 20 for i in range(len(docs))}
