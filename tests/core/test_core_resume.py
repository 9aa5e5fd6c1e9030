"""Guarantees 4, 6 and 7: elastic resume from JSON checkpoints, bounded restore cost.

A checkpoint taken after step k on D ranks, JSON round-tripped, restored on
any D' dividing L, continues with the digests of the uninterrupted run.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import core as helpers
from tests.helpers.core import (
    DataSpec,
    Spec,
    World,
    divisors,
    reference_digests,
)
from zephon_core import Execution
from zephon_core.internals import combiner_state

# A lane pipeline with state everywhere: a pointer shuffle before Read, and a
# payload shuffle would be recomputed on restore; packer bins stay open.
SPEC = Spec(datasets=(DataSpec((30, 17, 25), max_len=50, data_seed=1),
                      DataSpec((11, 9), max_len=20, data_seed=2, weight=0.5)),
            num_lanes=4, rows_per_lane=2, shuffle_pos="payloads", shuffle_buffer=6,
            seq_len=32, max_open_bins=5)
FINITE = Spec(datasets=(DataSpec((60, 45, 80), max_len=40, data_seed=3),),
              num_lanes=4, rows_per_lane=2, epochs=1, shuffle_buffer=5, seq_len=32)


def resumed_digests(spec: Spec, D: int, D2: int, k: int, steps: int,
                    ex: Execution | None = None, ex2: Execution | None = None) -> list[str]:
    """Digests of steps [k, steps) after a checkpoint at k on D ranks, restored on D2."""
    with World(spec, D, ex) as w:
        head = w.digests(k)
        assert head == reference_digests(spec, steps)[:k]
        state = w.state()
    assert state["step"] == k
    with World(spec, D2, ex2, state=state) as w2:
        return w2.digests(steps - k)


@pytest.mark.parametrize("D", [1, 2, 4])
@pytest.mark.parametrize("D2", [1, 2, 4])
def test_resume_on_every_rank_count(D, D2):
    steps, k = 9, 4
    ref = reference_digests(SPEC, steps)
    assert resumed_digests(SPEC, D, D2, k, steps) == ref[k:]


@pytest.mark.parametrize(("ex", "ex2"), [
    # saved with every transform fused into one stage, resumed with each on its own
    (Execution(runner="inline"), Execution(runner="threads", runners={"tokens": "inline"})),
    (Execution(runner="threads", runners={"read": "inline"}), Execution(runner="inline")),
    (Execution(runner="inline"), Execution(runner="inline", fuse=False)),
], ids=["fused-to-split", "split-to-fused", "unfused"])
def test_resume_under_an_execution_that_fuses_stages_differently(ex, ex2):
    """Stage numbers are an execution detail: a checkpoint must not depend on them."""
    steps, k = 8, 3
    assert resumed_digests(SPEC, 2, 4, k, steps, ex, ex2) == reference_digests(SPEC, steps)[k:]


@pytest.mark.parametrize("k", [0, 1, 7])
def test_resume_at_first_and_later_steps(k):
    steps = 9
    ref = reference_digests(SPEC, steps)
    ex = Execution(runner="inline", group_size=2, prefetch=1)
    assert resumed_digests(SPEC, 2, 1, k, steps, ex) == ref[k:]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    L=st.sampled_from([1, 2, 4, 8, 16]),
    seed=st.integers(0, 2**31),
    shuffle_pos=st.sampled_from([None, "pointers", "payloads"]),
    overlong=st.sampled_from(["split", "truncate", "drop"]),
    mode=st.sampled_from(["first_fit", "best_fit"]),
    bins=st.integers(1, 6),
    k=st.integers(0, 5),
    runner=st.sampled_from(["inline", "threads"]),
    group=st.integers(1, 5),
    prefetch=st.integers(1, 6),
    data=st.data(),
)
def test_resume_property(L, seed, shuffle_pos, overlong, mode, bins, k, runner, group,
                         prefetch, data):
    spec = SPEC.but(num_lanes=L, rows_per_lane=1, seed=seed, shuffle_pos=shuffle_pos,
                    overlong=overlong, mode=mode, max_open_bins=bins, seq_len=24)
    D = data.draw(st.sampled_from(divisors(L)), label="D")
    D2 = data.draw(st.sampled_from(divisors(L)), label="D2")
    steps = k + 3
    ex = Execution(runner=runner, default_workers=2, group_size=group, prefetch=prefetch,
                   prefetch_steps=data.draw(st.integers(0, 2), label="prefetch_steps"))
    ex2 = Execution(runner="inline", group_size=data.draw(st.integers(1, 5), label="group2"))
    assert resumed_digests(spec, D, D2, k, steps, ex, ex2) == reference_digests(spec, steps)[k:]


def _state_holds_work(state: dict) -> dict[str, bool]:
    lanes = state["lanes"].values()
    return {
        "in flight or queued before pack": any(
            any(origins for origins in lane["pending"].values()) for lane in lanes),
        "shuffle buffer": any(
            acc["buffer"] for lane in lanes for acc in lane["accumulators"].values()),
        "open packer bins": any(combiner_state(lane)["bins"] for lane in lanes),
    }


@pytest.mark.slow
def test_resume_from_a_busy_process_pool():
    """Checkpoint while a process pool is busy (large prefetch), buffers and bins full.

    Restored on other rank counts and runners; then the busy loaders themselves
    are rewound to the checkpoint while their pool still has work in flight.
    """
    spec = SPEC.but(shuffle_pos="pointers", shuffle_buffer=12, max_open_bins=6)
    steps, k = 10, 4
    ref = reference_digests(spec, steps)
    busy = Execution(runner="processes", default_workers=2, group_size=4, prefetch=8,
                     prefetch_steps=2)
    with World(spec, 2, busy, shared_runners=True) as w:
        assert w.digests(k) == ref[:k]
        state = w.state()
        held = _state_holds_work(state)
        assert all(held.values()), held
        assert w.digests(2) == ref[k:k + 2]  # the pool keeps working after the checkpoint
        for D2, ex2 in [(4, Execution(runner="inline")),
                        (1, Execution(runner="threads", default_workers=3))]:
            with World(spec, D2, ex2, state=state) as w2:
                assert w2.digests(steps - k) == ref[k:], (D2, ex2)
        for loader in w.loaders:  # rewind, with work of the old lanes still in the pool
            loader.load_state_dict(state)
        assert w.digests(steps - k) == ref[k:]


def test_checkpoint_is_plain_json_and_saved_atomically(tmp_path):
    from zephon_core import load_state, save_state

    with World(SPEC, 2) as w:
        w.digests(3)
        state = w.state()
    path = tmp_path / "ckpt.json"
    save_state(state, path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.json"]
    loaded = load_state(path)
    assert loaded == state
    assert json.loads(path.read_text()) == state  # plain JSON, nothing else
    with World(SPEC, 4, state=loaded) as w2:
        assert w2.digests(3) == reference_digests(SPEC, 6)[3:]


def test_finite_data_runs_to_the_end_for_every_rank_count():
    """epochs=1: every D gives the same complete global steps, then the data ends."""
    ref = reference_digests(FINITE, 1000)
    assert 5 < len(ref) < 1000, "the finite run must end"
    for D in divisors(FINITE.num_lanes):
        with World(FINITE, D) as w:
            assert w.digests(1000) == ref, D
            assert w.step() is None  # and stays ended


@pytest.mark.slow
def test_finite_data_every_real_rank_stops_at_the_same_step(tmp_path):
    """The end of the data is a global decision: with torch.distributed (gloo, 2 spawned
    processes), every rank ends at the step where the D=1 run ends, after the local
    batches of the simulated D=2 run (a rank that yields one more local batch than its
    peers makes a distributed job hang in its next collective).

    Simulated ranks cannot talk to each other, so this needs real processes: with
    FINITE, rank 1's lanes could fill one more step than rank 0's.
    """
    import multiprocessing as mp

    n = len(reference_digests(FINITE, 1000))
    with World(FINITE, 2) as w:
        local = [[] for _ in w.loaders]
        for _ in range(n):
            for d, loader in enumerate(w.loaders):
                local[d].append(w.digest(loader.next_rows()))
        alone = [loader.next_rows() is None for loader in w.loaders]
    assert not all(alone), "FINITE no longer has ranks that could go on alone"
    ctx = mp.get_context("spawn")
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [ctx.Process(target=helpers.finite_rank_main,
                         args=(r, 2, str(tmp_path / "store"), FINITE, str(outs[r])))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0, 0], "a rank failed or hung"
    got = [json.loads(o.read_text())["digests"] for o in outs]
    assert [len(g) for g in got] == [n, n], f"ranks ended after {[len(g) for g in got]} steps"
    assert got == local


@pytest.mark.parametrize(("D", "D2"), [(1, 4), (4, 2), (2, 1)])
def test_resume_near_the_end_of_finite_data(D, D2):
    ref = reference_digests(FINITE, 1000)
    k = len(ref) - 2
    with World(FINITE, D) as w:
        assert w.digests(k) == ref[:k]
        state = w.state()
    with World(FINITE, D2, state=state) as w2:
        assert w2.digests(1000) == ref[k:]


def test_state_size_does_not_grow_with_steps():
    """Guarantee 7: the state after 200 steps is about the size of the state after 10.

    It holds in-flight origins only, so its size moves with what happens to be
    buffered (measured: 4.4 kB to 6 kB over steps 10..800), not with the step.
    """
    spec = SPEC.but(rows_per_lane=1)
    sizes = {}
    with World(spec, 1) as w:
        w.digests(10)
        sizes[10] = len(json.dumps(w.state()))
        w.digests(190)
        sizes[200] = len(json.dumps(w.state()))
    assert sizes[200] < 2 * sizes[10], sizes


def test_restore_recomputes_only_what_was_buffered():
    """Guarantee 7: restoring recomputes the payloads of held origins, not the history."""
    spec = SPEC.but(rows_per_lane=1, map_fn=helpers.counting_tokens)
    for steps in (10, 200):
        ref = reference_digests(spec, steps + 2)
        with World(spec, 1) as w:
            w.digests(steps)
            state = w.state()
        held = sum(
            len(origins) for lane in state["lanes"].values()
            for origins in [*lane["pending"].values(),
                            *(a["buffer"] for a in lane["accumulators"].values()),
                            *combiner_state(lane)["bins"], *combiner_state(lane)["ready"]])
        helpers.COUNTER["tokens"] = 0
        with World(spec, 2) as w2:
            for loader in w2.loaders:
                loader.load_state_dict(state)
            recomputed = helpers.COUNTER["tokens"]
            assert 0 < recomputed <= held, (steps, recomputed, held)
            assert w2.digests(2) == ref[-2:]


@pytest.mark.parametrize("collate_in", ["thread", "driver"])
@pytest.mark.parametrize("D", [1, 2])
def test_background_driver_matches_and_checkpoints_what_was_consumed(D, collate_in):
    """`background=True`: the driver thread runs ahead (collating in a thread of its own or
    in the driver), yet the digests are the reference and a checkpoint describes the last
    batch the consumer received."""
    import torch

    from zephon_core import Loader, batch_digest

    steps, k = 8, 3
    ref = reference_digests(SPEC, steps)
    recipe = helpers.build_recipe(SPEC)
    ex = Execution(runner="inline", prefetch_steps=3, collate_in=collate_in)
    loaders = [Loader(recipe, d, D, ex, background=True) for d in range(D)]
    try:
        iters = [iter(loader) for loader in loaders]

        def global_digest() -> str:
            parts = [next(it) for it in iters]
            return batch_digest({name: torch.cat([p[name] for p in parts])
                                 for name in parts[0]})

        assert [global_digest() for _ in range(k)] == ref[:k]
        assert all(loader.last_meta.collate_s > 0 for loader in loaders)
        state = json.loads(json.dumps(helpers.merge_states(
            [loader.local_state_dict() for loader in loaders])))
        assert state["step"] == k
        assert [global_digest() for _ in range(steps - k)] == ref[k:]
    finally:
        for loader in loaders:
            loader.close()
    with World(SPEC, 4, state=state) as w:
        assert w.digests(steps - k) == ref[k:]
