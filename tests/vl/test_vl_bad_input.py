"""Bad input in WebDataset shards, under each policy: raise with shard and key, or drop and record.

Hand-made shards mix real demo samples (captions, a conversation, an
interleaved document, a video) with one sample of each bad case:

========================  ===========================================  ====================
case                      how it is made                               reason
========================  ===========================================  ====================
corrupt image             random bytes as ``.jpg``                     corrupt_image
truncated JPEG            the first half of a real JPEG                corrupt_image
unreadable video          random bytes as ``.mp4``                     corrupt_video
missing caption           a ``.jpg`` without ``.txt``/``.json``        missing_caption
decompression bomb        a PNG whose IHDR claims 100000 x 100000      decompression_bomb
truncated tar member      the shard file cut inside its last member    truncated_member
========================  ===========================================  ====================

These reasons are those of the decode before the packer (``decode_after_pack = false``),
which most tests here pin: there every bad sample is refused before a row is made. With
the default decode after the packer, a truncated JPEG's header is intact, so its sample is
planned into a row and then kept there as a black image without labels
(``decode_failed_after_plan``); the last test checks that order on the same data.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.vl import (
    Epoch,
    demo_samples_by_kind,
    make_recipe,
    png_header_only,
    run_epoch,
)
from zephon_core import BadSampleError, Execution, Loader, batch_digest, run_digests
from zephon_vl import write_shards

EXPECTED = {
    "b_corrupt": "corrupt_image",
    "b_truncjpg": "corrupt_image",
    "b_video": "corrupt_video",
    "b_nocap": "missing_caption",
    "b_bomb": "decompression_bomb",
    "b_cut": "truncated_member",
}
CAPTION = "A photo that should never reach a training row."


def bad_samples(good_jpeg: bytes) -> dict[str, dict]:
    """The bad cases except the truncated tar member (made by cutting a shard file)."""
    rng = np.random.default_rng(1234)
    return {
        "b_corrupt": {"jpg": rng.bytes(6000), "txt": CAPTION},
        "b_truncjpg": {"jpg": good_jpeg[: len(good_jpeg) // 2], "txt": CAPTION},
        "b_video": {"mp4": rng.bytes(9000), "txt": CAPTION},
        "b_nocap": {"jpg": good_jpeg},
        "b_bomb": {"png": png_header_only(100_000, 100_000), "txt": CAPTION},
    }


def cut_last_member(shard: Path) -> None:
    """Truncate the file in the middle of its last member's data (as an interrupted copy would)."""
    with tarfile.open(shard) as tf:
        last = tf.getmembers()[-1]
    assert last.size > 100, "the last member must be long enough to cut inside"
    with open(shard, "r+b") as f:
        f.truncate(last.offset_data + last.size // 2)


def write_dataset(out: Path, samples: list[dict], cut_last: bool, per_shard: int) -> list[str]:
    """`samples` in shards of `per_shard`; with `cut_last`, the last shard is cut short."""
    shards = write_shards(samples, out, samples_per_shard=per_shard)
    if cut_last:
        cut_last_member(shards[-1])
    return [str(s) for s in shards]


@pytest.fixture(scope="module")
def goods(tmp_path_factory) -> dict[str, dict]:
    by_kind = demo_samples_by_kind(tmp_path_factory)
    out = {f"g_cap{i:02d}": s for i, s in enumerate(by_kind["caption"][:16])}
    out["g_conv"] = by_kind["conversation"][0]
    out["g_inter"] = by_kind["interleaved"][0]
    out["g_vid"] = by_kind["video"][0]
    return out


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, goods) -> list[str]:
    """Two shards, every bad case among good samples; the second shard's last sample is cut."""
    bad = bad_samples(goods["g_cap00"]["jpg"])
    first = ["g_cap00", "b_corrupt", "g_conv", "b_truncjpg", "g_cap01", "b_video", "g_inter",
             "b_nocap", "g_cap02", "b_bomb", "g_cap03", "g_cap04", "g_cap05", "g_cap06"]
    second = ["g_vid", *(f"g_cap{i:02d}" for i in range(7, 16)), "b_cut"]
    assert sorted(first + second) == sorted([*goods, *bad, "b_cut"])
    pool = {**goods, **bad, "b_cut": {"jpg": goods["g_cap01"]["jpg"], "txt": CAPTION * 40}}
    samples = [{"__key__": k, **pool[k]} for k in first + second]
    shards = write_dataset(tmp_path_factory.mktemp("mixed"), samples, cut_last=True,
                           per_shard=len(first))
    assert len(shards) == 2
    return shards


def recipe_for(shards: list[str], on_error: str, num_lanes: int = 2, after: bool = False,
               **kw):
    """The recipe under test; `after`: decode after the packer (the recipe's default)."""
    return make_recipe(shards, num_lanes=num_lanes, global_batch_size=num_lanes, epochs=1,
                       on_error=on_error, shuffle_buffer=4,
                       pack={"decode_after_pack": after}, **kw)


def keyed(recipe, origins) -> list[str]:
    reader = recipe.datasets[0].reader
    return [reader.key(o.shard, o.index) for o in origins]


# --- on_error="raise" ----------------------------------------------------------------------
@pytest.mark.parametrize("runner", ["inline", "threads"])
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_raise_names_shard_key_and_reason(tmp_path, goods, case: str, runner: str) -> None:
    pool = {**goods, **bad_samples(goods["g_cap00"]["jpg"]),
            "b_cut": {"jpg": goods["g_cap01"]["jpg"], "txt": CAPTION * 40}}
    keys = ["g_cap00", "g_cap01", case]  # the case last: the cut shard's last member is its own
    shards = write_dataset(tmp_path, [{"__key__": k, **pool[k]} for k in keys],
                           cut_last=case == "b_cut", per_shard=10)
    recipe = recipe_for(shards, "raise", num_lanes=1)
    ex = Execution(runner=runner, workers={"decode": 2}, group_size=1)
    with Loader(recipe, 0, 1, ex) as loader:
        with pytest.raises(BadSampleError) as info:
            for _ in range(10):
                next(loader)
    exc = info.value
    assert exc.reason == EXPECTED[case], str(exc)
    assert f"{Path(shards[0]).name}:{case}" in str(exc), str(exc)
    assert "on_error='drop'" in str(exc)


def test_raise_through_run_digests_on_two_ranks(mixed) -> None:
    """The first bad sample met stops the run; nothing is silently skipped."""
    with pytest.raises(BadSampleError) as info:
        list(run_digests(lambda: recipe_for(mixed, "raise"), 2, 20, Execution(runner="inline")))
    assert info.value.reason in set(EXPECTED.values())
    assert any(f"{Path(s).name}:b_" in str(info.value) for s in mixed), str(info.value)


# --- on_error="drop" -----------------------------------------------------------------------
def epoch_of(shards: list[str], D: int, ex: Execution) -> tuple[object, list[Epoch]]:
    recipe = recipe_for(shards, "drop")
    return recipe, [run_epoch(Loader(recipe, d, D, ex)) for d in range(D)]


def global_steps(recipe, epochs: list[Epoch]) -> list[tuple[str, list]]:
    """(digest, drops) of each global step that every rank delivered."""
    n = min(len(e.step_rows) for e in epochs)
    out = []
    for t in range(n):
        rows = [row for e in epochs for row in e.step_rows[t]]
        drops = [d for e in epochs for d in e.metas[t].drops]
        out.append((batch_digest(recipe.collate(rows)), drops))
    return out


@pytest.fixture(scope="module")
def dropped_d1(mixed):
    return epoch_of(mixed, 1, Execution(runner="inline"))


def test_drop_records_every_bad_sample_and_keeps_every_good_one(mixed, goods,
                                                                dropped_d1) -> None:
    recipe, (ep,) = dropped_d1
    drops = sorted((k, reason) for k, (_, reason) in
                   zip(keyed(recipe, [o for o, _ in ep.drops()]), ep.drops(), strict=True))
    assert drops == sorted(EXPECTED.items())
    seen = keyed(recipe, ep.origins())
    assert sorted(seen) == sorted(goods), "good samples lost or repeated"
    # Delivered batches are real VLM batches (the bad samples did not empty them).
    batches = [recipe.collate(rows) for rows in ep.step_rows]
    assert len(batches) >= 2 and all(int(b["grid_thw"].shape[0]) > 0 for b in batches)


def test_drops_and_digests_same_for_d2_and_threads(mixed, dropped_d1) -> None:
    recipe, eps = dropped_d1
    want = global_steps(recipe, eps)
    assert len(want) >= 2 and sum(len(d) for _, d in want) > 0, "setup: steps with drops"
    for D, ex in [(2, Execution(runner="inline", group_size=3)),
                  (1, Execution(runner="threads", workers={"read": 2, "decode": 3}, group_size=2)),
                  (2, Execution(runner="threads", workers={"decode": 2}, group_size=1))]:
        recipe2, eps2 = epoch_of(mixed, D, ex)
        got = global_steps(recipe2, eps2)
        assert got == want, f"D={D} {ex.runner}: digests or drops differ"
        all_drops = sorted((o, r) for e in eps2 for o, r in e.drops())
        assert all_drops == sorted((o, r) for o, r in eps[0].drops())
        seen = sorted(o for e in eps2 for o in e.origins())
        assert seen == sorted(eps[0].origins())


def test_drop_policy_matches_a_clean_dataset(tmp_path, mixed, goods, dropped_d1) -> None:
    """Dropping bad samples never changes how the good ones are decoded and tokenized."""
    recipe, (ep,) = dropped_d1
    seen = {}
    for t, rows in enumerate(ep.step_rows):
        batch = recipe.collate(rows)
        for r, row in enumerate(rows):
            for s in row.segments:
                seen[keyed(recipe, [s.origin])[0]] = (t, r, s)
        assert torch.isfinite(batch["pixel_values"]).all()
    assert set(seen) <= set(goods)
    # A sample's tokens depend only on the sample: the same bytes in a clean shard agree.
    clean = write_dataset(tmp_path, [{"__key__": k, **goods[k]} for k in sorted(seen)],
                          cut_last=False, per_shard=100)
    recipe_c = recipe_for(clean, "raise", num_lanes=1)
    ep_c = run_epoch(Loader(recipe_c, 0, 1, Execution(runner="inline")))
    clean_tokens = {}
    for rows in ep_c.step_rows:
        for row in rows:
            for s in row.segments:
                clean_tokens[keyed(recipe_c, [s.origin])[0]] = s.payload["tokens"][s.start:s.end]
    for row in ep_c.left_rows:
        for s in row.segments:
            clean_tokens[keyed(recipe_c, [s.origin])[0]] = s.payload["tokens"][s.start:s.end]
    for k, (_, _, s) in seen.items():
        assert np.array_equal(s.payload["tokens"][s.start:s.end], clean_tokens[k]), k


@pytest.mark.slow
def test_process_pools_drop_and_raise_like_inline(mixed, dropped_d1) -> None:
    """Decode (2 processes) and tokenize (1 process) shared by two ranks: same drops, digests.

    Then the raise policy with decode in processes: the error crosses the process
    boundary and still names shard, key and reason.
    """
    from zephon_core.engine.plan import Plan

    recipe, eps = dropped_d1
    want = global_steps(recipe, eps)
    ex = Execution(runner="auto", runners={"read": "threads"},
                   workers={"read": 1, "decode": 2, "tokenize": 1}, group_size=3)
    recipe_p = recipe_for(mixed, "drop")
    runners = Plan(recipe_p.ops, ex).make_runners()
    try:
        assert sorted(r.kind for r in runners.values()) == ["processes", "processes", "threads"]
        eps_p = [run_epoch(Loader(recipe_p, d, 2, ex, runners=runners)) for d in range(2)]
    finally:
        for r in runners.values():
            r.close()
    assert global_steps(recipe_p, eps_p) == want
    assert sorted(d for e in eps_p for d in e.drops()) == sorted(eps[0].drops())

    ex_raise = Execution(runner="auto", runners={"read": "threads", "tokenize": "inline"},
                         workers={"decode": 2})
    with Loader(recipe_for(mixed, "raise"), 0, 1, ex_raise) as loader:
        kinds = {s.name: s.runner_kind for s in loader.plan.stages if s.kind == "transform"}
        assert kinds == {"read": "threads", "decode": "processes", "tokenize": "inline"}
        with pytest.raises(BadSampleError) as info:
            for _ in range(20):
                next(loader)
    exc = info.value
    key = next(k for k in EXPECTED if f":{k}" in str(exc))
    shard = Path(mixed[-1] if key == "b_cut" else mixed[0]).name
    assert exc.reason == EXPECTED[key], str(exc)
    assert f"{shard}:{key}" in str(exc), str(exc)


def test_resume_keeps_the_drop_record(mixed, dropped_d1) -> None:
    """Save after step 1 on D=1, restore from JSON on D=2: same batches and drops after it."""
    import json

    from zephon_core import merge_states

    recipe, eps = dropped_d1
    want = global_steps(recipe, eps)
    assert len(want) >= 2, "setup: the mixed data must give at least two global steps"
    with Loader(recipe_for(mixed, "drop"), 0, 1, Execution(runner="inline")) as first:
        first.next_rows()
        blob = json.dumps(merge_states([first.local_state_dict()]))
    recipe2 = recipe_for(mixed, "drop")
    loaders = [Loader(recipe2, d, 2, Execution(runner="inline")) for d in range(2)]
    for loader in loaders:
        loader.load_state_dict(json.loads(blob))
    eps2 = [run_epoch(loader) for loader in loaders]
    got = global_steps(recipe2, eps2)
    assert got == want[1:]
    # Drops decided before the save were delivered with step 0; the rest come after it.
    after = sorted(d for e in eps2 for d in e.drops())
    before = sorted(eps[0].metas[0].drops)
    assert sorted(before + after) == sorted(eps[0].drops())
    # ... and every sample not delivered before the save is in a row after it, once.
    delivered = [o for row in eps[0].metas[0].rows for o, _, _ in row]
    assert sorted(delivered + [o for e in eps2 for o in e.origins()]) == \
        sorted(eps[0].origins())


def test_seq_len_below_one_images_tokens_names_the_cause(tmp_path_factory) -> None:
    """Every document holds an image of more tokens than a row: the stop and the watchdog
    both say that seq_len is too small and what to change (not the generic stall words)."""
    from tests.helpers.vl import demo_shards, tokenizer_dir
    from zephon_core import NoRowsError
    from zephon_vl import ImageSettings, vlm_recipe

    recipe = vlm_recipe(demo_shards(tmp_path_factory), tokenizer_dir(), seq_len=64,
                        num_lanes=1, global_batch_size=1, pack={"image_every_row": False},
                        image=ImageSettings(max_pixels=256 * 28 * 28, min_pixels=128 * 28 * 28))
    loader = Loader(recipe, 0, 1, Execution(runner="inline", stall_drops=12))
    try:
        with pytest.raises(NoRowsError, match=r"12 over_length.*seq_len 64 is smaller than "
                           r"these samples.*make images smaller \(max_pixels"):
            next(iter(loader))
        report = loader.stall_report(61)
        assert "no new row for 61 s" in report and "seq_len 64 is smaller" in report
    finally:
        loader.close()


#: the reasons with the decode after the packer: the truncated JPEG is planned from its
#: intact header, so it fails in its row instead of before the packer
EXPECTED_AFTER = {**EXPECTED, "b_truncjpg": "decode_failed_after_plan"}


def test_decode_after_the_packer_keeps_a_failed_sample_in_its_row(mixed, goods) -> None:
    """The default order on the same bad data, inline and on two ranks with the decode in
    processes: every other bad sample is refused before the packer as before; the
    truncated JPEG keeps its place in its row with no label and is recorded once."""
    recipe = recipe_for(mixed, "drop", after=True)
    ep = run_epoch(Loader(recipe, 0, 1, Execution(runner="inline")))
    drops = sorted((k, reason) for k, (_, reason) in
                   zip(keyed(recipe, [o for o, _ in ep.drops()]), ep.drops(), strict=True))
    assert drops == sorted(EXPECTED_AFTER.items())
    assert sorted(keyed(recipe, ep.origins())) == sorted([*goods, "b_truncjpg"])
    for rows in ep.step_rows:
        for row in rows:
            for s in row.segments:
                if keyed(recipe, [s.origin]) == ["b_truncjpg"]:
                    assert not s.payload["targets"].any(), "a failed sample trains nothing"
    want = global_steps(recipe, [ep])
    ex = Execution(workers={"decode_rows": 2}, group_size=3)
    eps = [run_epoch(Loader(recipe_for(mixed, "drop", after=True), d, 2, ex))
           for d in range(2)]
    got = global_steps(recipe, eps)
    assert len(got) >= 2 and got == want[:len(got)]
    assert sorted(d for e in eps for d in e.drops()) == sorted(ep.drops())

