"""The design's guarantees on the VLM pipeline: digests independent of D, runners and resume.

Reference: one rank, inline runner (`_vl_helpers.reference`). Every other run,
with another D, runner, worker counts, group size or prefetch, or resumed from a
JSON checkpoint taken on another D, must give the same global batches, hence
the same per-step SHA-256.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from tests.helpers.vl import (
    GLOBAL_BATCH,
    LEAN,
    NUM_LANES,
    SCALAR_KEYS,
    STEPS,
    TENSOR_KEYS,
    RecipeFactory,
    demo_shards,
    make_recipe,
    reference,
)
from zephon_core import Execution, Loader, batch_digest, run_digests


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return demo_shards(tmp_path_factory)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference(tmp_path_factory)


def test_reference_is_a_real_vlm_batch(ref) -> None:
    """Guard against a vacuous comparison: the batches hold images, text and distinct digests."""
    assert len(ref.digests) == STEPS and len(set(ref.digests)) == STEPS
    for b in ref.batches:
        assert b["input"].shape == (GLOBAL_BATCH, 1024)
        assert b["pixel_values"].shape[0] > 0 and b["grid_thw"].shape[0] > 0
        assert b["pixel_values"].dtype == torch.float32 and b["grid_thw"].dtype == torch.int64


# D=1 is the reference itself (and the threads run below); each D gets other knobs too.
KNOBS = {2: Execution(runner="inline", group_size=3, prefetch=1, prefetch_steps=0),
         4: Execution(runner="inline", group_size=1, prefetch=1, prefetch_steps=0),
         8: Execution(runner="inline", group_size=4, prefetch=1, prefetch_steps=1)}


@pytest.mark.parametrize("D", [2, 4, 8])
def test_local_batches_concatenate_to_the_global_batch(shards, ref, D: int) -> None:
    """Rank d's local batch is its lanes' rows; ranks 0..D-1 concatenated = the global batch."""
    recipe = make_recipe(shards)
    ex = KNOBS[D]
    # D=4 also runs the optional background driver thread (collates ahead of the consumer).
    loaders = [Loader(recipe, d, D, ex, background=D == 4) for d in range(D)]
    try:
        for d, loader in enumerate(loaders):
            per = NUM_LANES // D
            assert loader.lanes == list(range(d * per, (d + 1) * per))
        for t in range(STEPS):
            local = [next(loader) for loader in loaders]
            for d, (batch, loader) in enumerate(zip(local, loaders, strict=True)):
                assert batch["input"].shape[0] == GLOBAL_BATCH // D, (t, d)
                assert loader.last_meta.lanes == loader.lanes
                assert loader.last_meta.step == t
            glob = ref.batches[t]
            assert set(local[0]) == set(glob)
            for key in TENSOR_KEYS:
                cat = torch.cat([b[key] for b in local], dim=0)
                assert cat.dtype == glob[key].dtype, (t, key)
                assert torch.equal(cat, glob[key]), f"step {t}: {key} differs at D={D}"
            for key in SCALAR_KEYS:
                assert all(torch.equal(b[key], glob[key]) for b in local), (t, key)
            merged = {**{k: torch.cat([b[k] for b in local]) for k in TENSOR_KEYS},
                      **{k: local[0][k] for k in SCALAR_KEYS}}
            assert batch_digest(merged) == ref.digests[t], f"step {t} digest differs at D={D}"
    finally:
        for loader in loaders:
            loader.close()


def test_digests_across_runner_types_threads(shards, ref) -> None:
    """D=1 through `run_digests`, threads with their own worker counts per operator."""
    ex = Execution(runner="threads", workers={"read": 2, "decode": 2, "tokenize": 1},
                   group_size=2, prefetch=3, prefetch_steps=0)
    recs = list(run_digests(RecipeFactory(shards), 1, STEPS, ex))
    assert [r.step for r in recs] == list(range(STEPS))
    assert [r.sha256 for r in recs] == ref.digests


@pytest.mark.slow
def test_digests_across_runner_types_processes(shards, ref) -> None:
    """Decode and tokenize in process pools with different worker counts: same digests.

    Reads are sent to threads here, decode and tokenize to processes (with ``auto``, the
    decode after the packer plans them in a thread), and decode has 2 workers and
    tokenize 1, so no stage fuses.
    """
    ex = Execution(runner="auto", runners={"read": "threads", "decode": "processes",
                                           "tokenize": "processes"},
                   workers={"read": 2, "decode": 2, "tokenize": 1}, group_size=4,
                   prefetch=2, prefetch_steps=0)
    recipe = make_recipe(shards)
    with Loader(recipe, 0, 1, ex) as loader:
        plan = loader.explain()
        kinds = {s.name: (s.runner_kind, s.workers) for s in loader.plan.stages
                 if s.kind == "transform"}
        assert kinds == {"read": ("threads", 2), "decode": ("processes", 2),
                         "tokenize": ("processes", 1)}, kinds
        assert "decode [stateless, processes, 2 processes" in plan, plan
        assert "tokenize [stateless, processes, 1 process" in plan, plan
        digests = [batch_digest(next(loader)) for _ in range(STEPS)]
    assert digests == ref.digests


def test_save_on_2_resume_on_4_and_8(shards, ref) -> None:
    """A checkpoint after step k on D=2, as JSON, resumes on D=4 and D=8 with the same batches."""
    k = 1
    states: list[str] = []
    recs = list(run_digests(RecipeFactory(shards), 2, STEPS, LEAN, save_at=k,
                            resume_dp=[4, 8], on_state=states.append))
    run = [r for r in recs if r.phase == "run"]
    resumed = [r for r in recs if r.phase == f"resumed@{k}"]
    assert len(run) + len(resumed) == len(recs)
    assert [(r.step, r.dp) for r in run] == [(t, 2) for t in range(STEPS)]
    assert [(r.step, r.dp) for r in resumed] == (
        [(t, 4) for t in range(k, STEPS)] + [(t, 8) for t in range(k, STEPS)])
    assert [r.sha256 for r in run] == ref.digests
    assert [r.sha256 for r in resumed] == ref.digests[k:] * 2
    # The checkpoint is data: plain JSON holding every lane, with the recipe fingerprint.
    assert len(states) == 1
    state = json.loads(states[0])
    assert state["format"] == "zephon-checkpoint" and state["step"] == k
    assert sorted(state["lanes"], key=int) == [str(i) for i in range(NUM_LANES)]
    assert state["fingerprint"]["recipe"] == "vlm"
    assert json.loads(json.dumps(state)) == state


def test_background_loaders_save_what_the_consumer_received(shards, ref) -> None:
    """With the background driver thread running ahead, state_dict() is still the state
    after the last batch the consumer took: restored on D=4, the next batches follow it."""
    from zephon_core import merge_states

    k = 1
    ex = Execution(runner="inline", group_size=2, prefetch=2, prefetch_steps=2)
    src = [Loader(make_recipe(shards), d, 2, ex, background=True) for d in range(2)]
    try:
        for _ in range(k):
            for loader in src:
                next(loader)
        # Let the driver threads run ahead of the consumer (`_produced`: steps made so far).
        deadline = time.monotonic() + 60
        while any(ld._produced <= k for ld in src) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(ld._produced > k for ld in src), "the driver threads did not run ahead"
        blob = json.dumps(merge_states([ld.state_dict() for ld in src]))
    finally:
        for loader in src:
            loader.close()
    assert json.loads(blob)["step"] == k
    dst = [Loader(make_recipe(shards), d, 4, LEAN) for d in range(4)]
    try:
        for loader in dst:
            loader.load_state_dict(json.loads(blob))
        for t in range(k, STEPS):
            local = [next(loader) for loader in dst]
            for key in TENSOR_KEYS:
                assert torch.equal(torch.cat([b[key] for b in local]), ref.batches[t][key]), \
                    (t, key)
    finally:
        for loader in dst:
            loader.close()


@pytest.mark.slow
def test_every_rank_ends_at_the_same_step(tmp_path) -> None:
    """At the end of a finite run, every rank of a torch.distributed job yields as many
    local batches as the global run has steps.

    Three documents over L=2 lanes: lane 0 gets two, lane 1 one, and each fills
    more than half a row, so lane 0 packs two rows and lane 1 one. Global step 1
    does not exist (lane 1 has no row for it), so no rank may deliver a local
    batch for it: a rank that does runs a training step its peers never reach,
    and hangs at that step's first collective.
    """
    import multiprocessing as mp

    from tests.helpers.vl import count_batches_job, run_epoch, uneven_lanes_recipe

    one = run_epoch(Loader(uneven_lanes_recipe(), 0, 1, Execution(runner="inline")))
    assert len(one.step_rows) == 1
    assert one.end_of_data == [(0, 1), (1, 0)], "setup: lane 0 must hold one more row"

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=count_batches_job,
                         args=(r, 2, str(tmp_path / "init"), str(tmp_path)))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    counts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert counts == [1, 1], f"ranks yield {counts} batches; the global run has 1 step"
