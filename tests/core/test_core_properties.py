"""Guarantees 1-3 as properties: per-step digests never depend on D or on execution.

For random recipes (lanes, mixtures, shuffles, filters, packing modes) and
random execution knobs (runner, workers per operator, group size, prefetch,
shared runners), every rank count D dividing L gives the per-step global
digests of the reference run (D=1, inline runner, default execution).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.core import (
    DataSpec,
    Spec,
    World,
    build_recipe,
    divisors,
    reference_digests,
    run_digests,
)
from zephon_core import Execution

STEPS = 5


@st.composite
def data_specs(draw: st.DrawFn) -> tuple[DataSpec, ...]:
    n = draw(st.integers(1, 2))
    out = []
    for _ in range(n):
        sizes = tuple(draw(st.lists(st.integers(1, 25), min_size=1, max_size=4)))
        out.append(DataSpec(
            shard_sizes=sizes,
            max_len=draw(st.sampled_from([12, 40, 90])),
            data_seed=draw(st.integers(0, 3)),
            weight=draw(st.sampled_from([0.5, 1.0, 3.0])),
        ))
    return tuple(out)


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    return Spec(
        datasets=draw(data_specs()),
        num_lanes=draw(st.sampled_from([1, 2, 4, 8, 16])),
        rows_per_lane=draw(st.integers(1, 2)),
        seed=draw(st.integers(0, 2**32 - 1)),
        shuffle_shards=draw(st.booleans()),
        shuffle_within=draw(st.booleans()),
        block_size=draw(st.sampled_from([0, 4, 16, 256])),
        shuffle_pos=draw(st.sampled_from([None, "pointers", "payloads"])),
        shuffle_buffer=draw(st.integers(1, 12)),
        use_filter=draw(st.booleans()),
        seq_len=draw(st.sampled_from([8, 24, 64])),
        mode=draw(st.sampled_from(["first_fit", "best_fit"])),
        max_open_bins=draw(st.integers(1, 5)),
        overlong=draw(st.sampled_from(["split", "truncate", "drop"])),
    )


@st.composite
def executions(draw: st.DrawFn) -> tuple[Execution, bool]:
    runner = draw(st.sampled_from(["inline", "threads", "auto"]))
    workers = {}
    for op in ("read", "tokens", "keep"):
        if draw(st.booleans()):
            workers[op] = draw(st.integers(1, 3))
    per_op_runner = {}
    if draw(st.booleans()):
        per_op_runner[draw(st.sampled_from(["read", "tokens", "keep"]))] = draw(
            st.sampled_from(["inline", "threads"]))
    ex = Execution(
        runner=runner,
        runners=per_op_runner,
        workers=workers,
        default_workers=draw(st.integers(1, 3)),
        group_size=draw(st.integers(1, 6)),
        prefetch=draw(st.none() | st.integers(1, 5)),
        prefetch_steps=draw(st.integers(0, 2)),
        fuse=draw(st.booleans()),
    )
    return ex, draw(st.booleans())


@settings(max_examples=18, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=specs(), ex_shared=executions(), data=st.data())
def test_digests_independent_of_ranks_and_execution(spec, ex_shared, data):
    """Guarantees 1-3: the digests of every step equal the reference run's."""
    ex, shared = ex_shared
    D = data.draw(st.sampled_from(divisors(spec.num_lanes)), label="D")
    ref = reference_digests(spec, STEPS)
    assert len(ref) == STEPS  # infinite data: the reference never stops
    got = run_digests(spec, D, ex, STEPS, shared_runners=shared)
    assert got == ref, f"D={D}, {ex}, shared runners={shared}"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(), data=st.data())
def test_local_batches_are_the_ranks_lane_slices(spec, data):
    """Guarantee 2: rank d's local batch is, in lane order, its lanes' rows of the global batch."""
    reference_digests(spec, 3)  # skips data whose every document is dropped (no batches)
    D = data.draw(st.sampled_from([d for d in divisors(spec.num_lanes) if d > 1] or [1]))
    per = spec.num_lanes // D
    many_ex = Execution(runner="inline", group_size=3, prefetch=2)
    with World(spec, 1) as one, World(spec, D, many_ex) as many:
        for _ in range(3):
            full = one.step()
            meta_full = one.loaders[0].last_meta
            parts = [loader.next_rows() for loader in many.loaders]
            for d, (loader, part) in enumerate(zip(many.loaders, parts, strict=True)):
                assert loader.last_meta.lanes == list(range(d * per, (d + 1) * per))
                lo = d * per * spec.rows_per_lane
                hi = lo + per * spec.rows_per_lane
                assert len(part) == hi - lo
                assert loader.last_meta.rows == meta_full.rows[lo:hi]
                assert one.digest(full[lo:hi]) == many.digest(part)


def test_digests_change_with_the_seed():
    """The digest is not blind: another seed (or another lane count) gives other batches."""
    spec = Spec()
    ref = reference_digests(spec, 4)
    assert len(set(ref)) == 4, "consecutive steps should differ"
    assert reference_digests(spec.but(seed=1), 4) != ref
    assert reference_digests(spec.but(num_lanes=8, rows_per_lane=1), 4) != ref


def test_iterating_with_microbatches_gives_the_same_batches():
    """`__next__` with microbatches=2: the microbatches of the ranks, concatenated in order,
    are the reference global batches; a split that cannot be even is refused."""
    import torch

    from zephon_core import ConfigError, Loader, batch_digest

    spec = Spec()
    ref = reference_digests(spec, 3)
    recipe = build_recipe(spec)
    loaders = [Loader(recipe, d, 2, Execution(runner="inline"), microbatches=2) for d in range(2)]
    try:
        for t in range(3):
            parts = [mb for loader in loaders for mb in next(loader)]
            assert len(parts) == 4 and all(p["input"].shape == (2, spec.seq_len) for p in parts)
            merged = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
            assert batch_digest(merged) == ref[t]
    finally:
        for loader in loaders:
            loader.close()
    with pytest.raises(ConfigError, match=r"8 rows .* 3 equal microbatches"):
        Loader(recipe, 0, 1, Execution(runner="inline"), microbatches=3)


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "D", "ex"), [
    pytest.param(Spec(num_lanes=4, shuffle_pos="payloads", overlong="truncate"), 2,
                 Execution(runner="processes", default_workers=2, group_size=3, prefetch=3),
                 id="L4-D2-procs2-fused"),
    pytest.param(Spec(datasets=(DataSpec((9, 14), max_len=60), DataSpec((5,), weight=0.5)),
                      num_lanes=8, rows_per_lane=1, mode="first_fit", seq_len=24), 4,
                 Execution(runner="processes", runners={"read": "threads"},
                           workers={"tokens": 2, "read": 2}, group_size=2, prefetch=4,
                           prefetch_steps=2),
                 id="L8-D4-mixture-threads-read-procs-map"),
])
def test_process_runner_digests_equal_reference(spec, D, ex):
    """Guarantee 1 with a process pool (shared by the D simulated ranks)."""
    ref = reference_digests(spec, STEPS)
    assert run_digests(spec, D, ex, STEPS, shared_runners=True) == ref
