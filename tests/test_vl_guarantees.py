"""The design's guarantees on the VLM pipeline: digests independent of D, runners and resume.

Reference: one rank, inline runner (`_vl_helpers.reference`). Every other run,
with another D, runner, worker counts, group size or prefetch, or resumed from a
JSON checkpoint taken on another D, must give the same global batches, hence
the same per-step SHA-256.
"""

from __future__ import annotations

import json

import pytest
import torch
from _vl_helpers import (
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

from zephon_core.digest import batch_digest
from zephon_core.loader import Loader
from zephon_core.pipeline import Execution
from zephon_core.simulate import run_digests


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
KNOBS = {2: Execution(group_size=3, prefetch=1, prefetch_steps=0),
         4: Execution(group_size=1, prefetch=1, prefetch_steps=0),
         8: Execution(group_size=4, prefetch=1, prefetch_steps=1)}


@pytest.mark.parametrize("D", [2, 4, 8])
def test_local_batches_concatenate_to_the_global_batch(shards, ref, D: int) -> None:
    """Rank d's local batch is its lanes' rows; ranks 0..D-1 concatenated = the global batch."""
    recipe = make_recipe(shards)
    ex = KNOBS[D]
    loaders = [Loader(recipe, d, D, ex) for d in range(D)]
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

    ``auto`` puts reads on threads, decode and tokenize on processes; decode
    has 2 workers and tokenize 1, so the two stages are not fused.
    """
    ex = Execution(runner="auto", workers={"read": 2, "decode": 2, "tokenize": 1}, group_size=4,
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
    before = [r for r in recs if r.phase == "run"]
    after = [r for r in recs if r.phase == f"resumed@{k}"]
    assert [(r.step, r.dp) for r in before] == [(t, 2) for t in range(k)]
    assert [(r.step, r.dp) for r in after] == (
        [(t, 4) for t in range(k, STEPS)] + [(t, 8) for t in range(k, STEPS)])
    assert [r.sha256 for r in before] == ref.digests[:k]
    assert [r.sha256 for r in after] == ref.digests[k:] * 2
    # The checkpoint is data: plain JSON holding every lane, with the recipe fingerprint.
    assert len(states) == 1
    state = json.loads(states[0])
    assert state["format"] == "zephon-checkpoint" and state["step"] == k
    assert sorted(state["lanes"], key=int) == [str(i) for i in range(NUM_LANES)]
    assert state["fingerprint"]["recipe"] == "vlm"
    assert json.loads(json.dumps(state)) == state


def test_every_rank_ends_at_the_same_step(tmp_path, tmp_path_factory) -> None:
    """At the end of a finite run, every rank yields as many local batches as D=1 has steps.

    Three samples over L=2 lanes: lane 0 gets two, lane 1 one; each sample fills
    more than half a row, so lane 0 packs two rows and lane 1 one. The global
    batch of step 1 does not exist (lane 1 has no row for it), so no rank may
    deliver a local batch for it: a rank that does trains a step its peers
    never reach (a hang at the next collective in a real job).
    """
    from _vl_helpers import demo_samples_by_kind, run_epoch, text_ids

    from zephon_vl.shard_writer import write_shards

    caps = demo_samples_by_kind(tmp_path_factory)["caption"][:3]
    samples = []
    for i, s in enumerate(caps):
        text = s["txt"].decode()
        while len(text_ids(text)) < 600:
            text += " " + s["txt"].decode()
        samples.append({"__key__": f"long{i}", "jpg": s["jpg"], "txt": text})
    shards = [str(p) for p in write_shards(samples, tmp_path, samples_per_shard=10)]

    def epochs(D: int) -> list:
        recipe = make_recipe(shards, num_lanes=2, global_batch_size=2, epochs=1)
        return [run_epoch(Loader(recipe, d, D)) for d in range(D)]

    def steps(D: int) -> list[int]:
        return [len(e.step_rows) for e in epochs(D)]

    (one,) = epochs(1)
    assert len(one.step_rows) == 1
    assert one.end_of_data == [(0, 1), (1, 0)], "setup: lane 0 must hold one more row"
    assert steps(2) == [1, 1], "ranks disagree on the number of steps at the end of the data"
