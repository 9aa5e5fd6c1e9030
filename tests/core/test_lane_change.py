"""A new lane count on resume (`change_lanes`, ``allow_lane_change=True``).

The properties, over L, L2, D, D2, the save step K, the data and the
execution knobs of the saving run:

* every sample not delivered or dropped before the checkpoint is delivered
  (its segments tile its tokens) or dropped with the reason its content calls
  for, exactly once, after it (single dataset, one epoch: every sample of the
  data is accounted for, before or after);
* the batches after the change are the same at every D2 dividing L2 and
  whatever the runner, workers, group size and prefetch of the saving run and
  of the resumed run are (each drawn);
* a checkpoint taken after the change resumes on another D with the same
  batches, and can change the lane count again, deterministically.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.core import DataSpec, Spec, World, costed_tokens, divisors, keep, make_shards
from zephon_core import (
    BalancedPack,
    CheckpointError,
    ConfigError,
    Execution,
    Loader,
    Phase,
    change_lanes,
    merge_states,
)
from zephon_core.recipes.text import text_demo

G = 8
ONE = (DataSpec((40, 27, 55), max_len=70, data_seed=5, bad_every=23),)
TWO = (DataSpec((30, 21), max_len=50, data_seed=2, weight=2.0),
       DataSpec((25, 18), max_len=30, data_seed=3, bad_every=11))


def spec_for(datasets, lanes: int, **kw) -> Spec:
    return Spec(datasets=datasets, num_lanes=lanes, rows_per_lane=G // lanes, epochs=1,
                seq_len=32, on_error="drop", block_size=16, **kw)


class Fates:
    """Where every sample (dataset, shard, index, epoch) went: row segments and drops."""

    def __init__(self) -> None:
        self.spans: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
        self.drops: dict[tuple, list[str]] = defaultdict(list)

    def rows(self, rows) -> None:
        for row in rows:
            for s in row.segments:
                if s.origin.dataset >= 0:  # not a filler
                    self.spans[tuple(s.origin)[1:]].append((s.start, s.end))

    def dropped(self, drops) -> None:
        for o, reason in drops:
            self.drops[tuple(o)[1:]].append(reason)

    def step(self, rows) -> None:
        self.rows(rows)
        self.dropped([d for row in rows for d in row.drops])

    def check(self, spec: Spec) -> None:
        for key in set(self.spans) | set(self.drops):
            ds, shard, index, _ = key
            doc = make_shards(spec.datasets[ds], ds)[shard][index]
            if doc.get("bad"):
                want = "corrupt_doc"
            elif not keep(doc):
                want = "filtered"
            elif doc["n"] == 0:
                want = "empty"
            else:
                want = None
            if want is not None:
                assert key not in self.spans, (key, self.spans[key])
                assert self.drops[key] == [want], (key, self.drops[key])
                continue
            assert key not in self.drops, (key, self.drops[key])
            spans = sorted(self.spans[key])
            assert spans[0][0] == 0 and spans[-1][1] == doc["n"], (key, spans, doc["n"])
            for (_, e), (s, _) in zip(spans, spans[1:], strict=False):
                assert e == s, f"segments of {key} do not tile [0, {doc['n']}): {spans}"

    def every_sample(self, spec: Spec) -> None:
        seen = set(self.spans) | set(self.drops)
        want = {(j, s, i, 0) for j, d in enumerate(spec.datasets)
                for s, n in enumerate(d.shard_sizes) for i in range(n)}
        assert seen == want, (sorted(want - seen)[:5], sorted(seen - want)[:5])


def save(spec: Spec, D: int, K: int, ex: Execution, fates: Fates | None = None) -> dict | None:
    with World(spec, D, ex) as w:
        for _ in range(K):
            rows = w.step()
            if rows is None:
                return None
            if fates is not None:
                fates.step(rows)
        return w.state()


def resumed(spec: Spec, D: int, state: dict, steps: int | None = None,
            fates: Fates | None = None, save_after: int | None = None,
            ex: Execution | None = None):
    """Digests of the resumed run (to the end, then drained into `fates`), and with
    `save_after` the global state after that many steps; `ex` its knobs (inline if None)."""
    with World(spec, D, ex) as w:
        for loader in w.loaders:
            loader.load_state_dict(state, allow_lane_change=True)
        digests, later = [], None
        while steps is None or len(digests) < steps:
            if save_after is not None and len(digests) == save_after:
                later = w.state()
            rows = w.step()
            if rows is None:
                break
            if fates is not None:
                fates.step(rows)
            digests.append(w.digest(rows))
        if fates is not None and steps is None:
            for loader in w.loaders:
                drained = loader.drain()
                fates.rows(drained.rows)
                fates.dropped(drained.drops)
        return digests, later


KNOBS = [Execution(runner="inline"), Execution(runner="inline", group_size=3, prefetch=1),
         Execution(runner="threads", group_size=2, prefetch=3, prefetch_steps=2),
         Execution(runner="threads", group_size=8, prefetch=2, default_workers=2, fuse=False)]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(L=st.sampled_from([1, 2, 4, 8]), L2=st.sampled_from([1, 2, 4, 8]),
       K=st.integers(1, 9), data=st.data(), datasets=st.sampled_from([ONE, TWO]),
       shuffle_pos=st.sampled_from(["pointers", "payloads", None]))
def test_lane_change_property(L, L2, K, data, datasets, shuffle_pos):
    old, new = spec_for(datasets, L, shuffle_pos=shuffle_pos), \
        spec_for(datasets, L2, shuffle_pos=shuffle_pos)
    D = data.draw(st.sampled_from(divisors(L)), "D")
    a, b = data.draw(st.sampled_from(KNOBS), "knobs A"), data.draw(st.sampled_from(KNOBS), "B")
    fates = Fates()
    state = save(old, D, K, a, fates)
    if state is None:
        return  # the data ended before K
    other = save(old, data.draw(st.sampled_from(divisors(L)), "D'"), K, b)
    runs = {}
    for D2 in divisors(L2):  # each resume with its own knobs: the batches are the same
        ex2 = data.draw(st.sampled_from(KNOBS), f"knobs of the resume at D2={D2}")
        runs[D2], _ = resumed(new, D2, state, fates=fates if D2 == 1 else None, ex=ex2)
    fates.check(new)
    if datasets is ONE:
        fates.every_sample(new)
    assert len(set(map(tuple, runs.values()))) == 1, "the resumed batches differ with D2 or knobs"
    again, _ = resumed(new, data.draw(st.sampled_from(divisors(L2)), "D2'"), other,
                       ex=data.draw(st.sampled_from(KNOBS), "knobs of the resume of B"))
    assert again == runs[1], "the resumed batches differ with the saving run's knobs"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(L=st.sampled_from([2, 4, 8]), L2=st.sampled_from([1, 2, 4, 8]),
       L3=st.sampled_from([1, 2, 4, 8]), K=st.integers(1, 5), M=st.integers(1, 4),
       data=st.data())
def test_a_changed_run_resumes_and_changes_again(L, L2, L3, K, M, data):
    """After a change: a later checkpoint resumes on any D dividing L2 with the same batches,
    and a second change is deterministic and still exactly once."""
    specs = {n: spec_for(ONE, n) for n in {L, L2, L3}}
    fates = Fates()
    state = save(specs[L], data.draw(st.sampled_from(divisors(L)), "D"), K, KNOBS[0], fates)
    steps, later = resumed(specs[L2], 1, state, steps=M + 30, save_after=M)
    if later is None:
        return
    assert later.get("lane_changes", []) == ([[K, L, L2]] if L != L2 else [])
    D2 = data.draw(st.sampled_from(divisors(L2)), "D2")
    again, _ = resumed(specs[L2], D2, later, steps=30)
    assert again == steps[M:M + 30]
    # the second change: pre-change samples of the first resume, then the second resume
    with World(specs[L2], 1) as w:
        w.loaders[0].load_state_dict(state, allow_lane_change=True)
        for _ in range(M):
            fates.step(w.step())
    thirds = [resumed(specs[L3], D3, later, fates=fates if D3 == 1 else None)[0]
              for D3 in divisors(L3)]
    assert all(t == thirds[0] for t in thirds)
    fates.check(specs[L3])
    fates.every_sample(specs[L3])


def test_same_lanes_resume_is_unchanged():
    """allow_lane_change with the state's own lane count is a plain resume."""
    spec = spec_for(ONE, 4)
    state = save(spec, 2, 3, KNOBS[0])
    with World(spec, 1, state=state) as w:
        plain = w.digests(5)
    assert resumed(spec, 2, state, steps=5)[0] == plain


def test_another_lane_count_is_refused_unless_asked():
    state = save(spec_for(ONE, 4), 1, 2, KNOBS[0])
    with World(spec_for(ONE, 8), 1) as w:
        with pytest.raises(CheckpointError, match=r"fingerprint.num_lanes.*allow_lane_change"):
            w.loaders[0].load_state_dict(state)


def _balanced() -> BalancedPack:
    return BalancedPack(32, "vision", {"budget": 3.0}, rows_per_group=2)


@pytest.mark.parametrize(("changes", "why"), [
    # each lane's phase gate counts its rows and settled draws from step 0
    (dict(phases=(Phase(3, {"ds0": 1.0, "ds1": 1.0}),)), r"mixture schedule.*from step 0"),
    # each lane's token deficits are its own settled tallies from step 0
    (dict(mix_by="tokens"), r"mix_by='tokens'.*token.*from step 0.*mix_by='samples'"),
    # balanced packing's groups are a lane's G / L rows
    (dict(combiner=_balanced(), map_fn=costed_tokens),
     r"balanced packing.*G / L.*Pack"),
])
def test_lane_change_refuses_what_it_cannot_redeal(changes, why):
    """Each refusal names its reason and what to do (resume with the checkpoint's lanes)."""
    spec = spec_for(TWO, 4).but(**changes)
    state = save(spec, 1, 2, KNOBS[0])
    with World(spec.but(num_lanes=8, rows_per_lane=1), 1) as w:
        with pytest.raises(ConfigError, match=why + r".*checkpoint's lane count \(4\)"):
            w.loaders[0].load_state_dict(state, allow_lane_change=True)
        with pytest.raises(ConfigError, match=why):
            change_lanes(state, w.recipe)


def test_lane_change_refuses_a_damaged_state():
    spec = spec_for(ONE, 4)
    state = save(spec, 1, 3, KNOBS[0])
    bad = json.loads(json.dumps(state))
    bad["lanes"]["1"]["source"]["draws"] += 1
    with World(spec_for(ONE, 8), 1) as w:
        with pytest.raises(CheckpointError, match="lane 1"):
            w.loaders[0].load_state_dict(bad, allow_lane_change=True)
        relaned = change_lanes(state, w.recipe)
        relaned["lanes"]["3"]["source"]["relaned"]["stride"] = 4
        with pytest.raises(CheckpointError, match="relaned"):
            w.loaders[0].load_state_dict(relaned)


def test_the_new_state_holds_only_what_was_buffered():
    """Restore cost: the re-dealt state holds the old lanes' rows and held samples and, per
    dataset, the positions the old lanes had not reached below the furthest one; none of it
    grows with the steps trained (text-demo, 4 and 40 steps)."""
    sizes = {}
    for K in (4, 40):
        recipe = text_demo(num_lanes=8)
        with Loader(recipe, 0, 1, Execution(runner="inline")) as ld:
            for _ in range(K):
                ld.next_rows()
            state = json.loads(json.dumps(ld.state_dict()))
        held = sum(len(o) for snap in state["lanes"].values() for o in snap["pending"].values())
        held += sum(len(a["buffer"]) for snap in state["lanes"].values()
                    for a in snap["accumulators"].values())
        new = change_lanes(state, text_demo(num_lanes=16))
        rls = [snap["source"]["relaned"] for snap in new["lanes"].values()]
        carried = sum(len(r["carry"]) for r in rls)
        holes = sum(len(e) for r in rls for e in r["explicit"])
        assert carried <= held
        sizes[K] = (carried, holes, len(json.dumps(new)))
        with Loader(text_demo(num_lanes=16), 0, 2, Execution(runner="inline")) as ld:
            ld.load_state_dict(new)
            assert ld.next_rows() is not None
    assert sizes[40][1] < 4 * max(sizes[4][1], 64), sizes
    assert sizes[40][2] < 3 * sizes[4][2], sizes


def test_merge_keeps_the_lane_changes():
    spec = spec_for(ONE, 4)
    state = save(spec, 1, 2, KNOBS[0])
    _, later = resumed(spec_for(ONE, 2), 2, state, steps=2, save_after=1)
    assert later["lane_changes"] == [[2, 4, 2]]
    with World(spec_for(ONE, 2), 2) as w:
        for loader in w.loaders:
            loader.load_state_dict(later)
        local = [ld.local_state_dict() for ld in w.loaders]
    assert merge_states(local)["lane_changes"] == [[2, 4, 2]]
