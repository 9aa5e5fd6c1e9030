"""The layout of VLM training tensors, walked row by row against the raw samples.

For every row of the reference batches: each ``<|vision_start|> N x pad
<|vision_end|>`` span has N = t*h*w / merge^2 of the next ``grid_thw`` entry,
spans never cross rows, ``pixel_values`` hold exactly the patch rows of those
images in the same order (decoded again here, independently of the pipeline),
labels are -100 on vision tokens, padding and user turns and the next token
elsewhere, positions restart at each document, and rows respect ``max_images``.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.vl import (
    IGNORE,
    MAX_IMAGES,
    MERGE,
    SEQ_LEN,
    Epoch,
    demo_samples_by_kind,
    expected_vision,
    make_recipe,
    reference,
    run_epoch,
    sample_kind,
    special,
    text_ids,
)
from zephon_core import Execution, Loader
from zephon_vl import write_shards


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference(tmp_path_factory)


@pytest.fixture(scope="module")
def walked(ref):
    """Per step: the batch as numpy, and per row its segments with their raw samples."""
    reader = ref.recipe.datasets[0].reader
    steps = []
    for batch, meta in zip(ref.batches, ref.metas, strict=True):
        rows = []
        for segs in meta.rows:
            rows.append([(o, start, end, reader.read(o.shard, o.index)) for o, start, end in segs])
        steps.append(({k: v.numpy() for k, v in batch.items()}, rows))
    return steps


def vision_spans(row: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) index pairs of vision_start/vision_end; asserts they pair up within the row."""
    sp = special()
    marks = [(int(i), "s") for i in np.flatnonzero(row == sp.vision_start)]
    marks += [(int(i), "e") for i in np.flatnonzero(row == sp.vision_end)]
    marks.sort()
    kinds = "".join(k for _, k in marks)
    assert kinds == "se" * (len(marks) // 2), f"unpaired vision markers in a row: {kinds}"
    return [(marks[i][0], marks[i + 1][0]) for i in range(0, len(marks), 2)]


def vision_items(row: np.ndarray) -> int:
    """Images and videos in `row`: the frame spans of one video follow each other directly."""
    sp = special()
    n, prev_end, prev_video = 0, -2, False
    for s, e in vision_spans(row):
        video = e > s + 1 and row[s + 1] == sp.video_pad
        n += not (video and prev_video and s == prev_end + 1)
        prev_end, prev_video = e, video
    return n


def test_vision_token_counts_match_grid_thw(walked) -> None:
    sp = special()
    images = videos = 0
    for t, (b, _) in enumerate(walked):
        grid = b["grid_thw"]
        k = 0
        for r in range(b["input"].shape[0]):
            row = b["input"][r]
            spans = iter(vision_spans(row))
            inside = 0
            for s, e in spans:
                assert k < len(grid), f"step {t} row {r}: more vision spans than grid_thw rows"
                gt, gh, gw = (int(x) for x in grid[k])
                body = row[s + 1:e]
                pads = set(body.tolist())
                assert pads in ({sp.image_pad}, {sp.video_pad}), (t, r, k, pads)
                if pads == {sp.video_pad}:
                    # a video: one span per temporal patch (Qwen3.5's frames)
                    videos += 1
                    assert gt > 1, f"a video with a single temporal patch: {grid[k]}"
                    frames = [body] + [row[fs + 1:fe] for fs, fe in
                                       (next(spans) for _ in range(gt - 1))]
                    assert all(set(f.tolist()) == {sp.video_pad} for f in frames)
                    assert [len(f) for f in frames] == [gh * gw // MERGE ** 2] * gt
                    inside += sum(len(f) for f in frames)
                else:
                    images += 1
                    assert gt == 1, f"an image with {gt} temporal patches"
                    assert len(body) == gh * gw // MERGE ** 2, (t, r, k, len(body), grid[k])
                    inside += len(body)
                k += 1
            n_pads = int(np.isin(row, [sp.image_pad, sp.video_pad]).sum())
            assert n_pads == inside, f"step {t} row {r}: pad tokens outside vision spans"
        assert k == len(grid), f"step {t}: {len(grid)} grid_thw rows for {k} vision spans"
        assert b["pixel_values"].shape == (int(np.prod(grid, axis=1).sum()), 3 * 2 * 14 * 14)
    assert images > 0 and videos > 0, (images, videos)


def test_pixel_values_follow_row_order(walked) -> None:
    """Decode every segment's sample again: pixel rows and grids, concatenated in row order."""
    checked = 0
    for t, (b, rows) in enumerate(walked):
        want = [v for segs in rows for (_, _, _, sample) in segs for v in expected_vision(sample)]
        assert len(want) == len(b["grid_thw"]), t
        for k, (_, grid, _) in enumerate(want):
            assert np.array_equal(b["grid_thw"][k], grid), (t, k)
        pv = np.concatenate([pix for pix, _, _ in want])
        assert pv.dtype == b["pixel_values"].dtype == np.float32
        assert np.array_equal(pv, b["pixel_values"]), f"step {t}: pixel_values differ"
        checked += len(want)
    assert checked > 0


def test_every_segment_holds_its_samples_images(walked) -> None:
    for b, rows in walked:
        for r, segs in enumerate(rows):
            at = 0
            for _, start, end, sample in segs:
                assert start == 0, "a document was split (overlong must drop, not split)"
                toks = b["input"][r, at:at + end - start]
                assert vision_items(toks) == len(expected_vision(sample))
                at += end - start


def test_positions_padding_and_row_limits(walked) -> None:
    sp = special()
    full_rows = 0
    for t, (b, rows) in enumerate(walked):
        for r, segs in enumerate(rows):
            inp, lab, pos = b["input"][r], b["labels"][r], b["positions"][r]
            at = 0
            for _, start, end, _ in segs:
                n = end - start
                assert np.array_equal(pos[at:at + n], np.arange(n)), f"step {t} row {r}"
                assert lab[at + n - 1] == IGNORE, "a document predicts across its end"
                at += n
            assert 0 < at <= SEQ_LEN
            assert (inp[at:] == sp.pad).all() and (lab[at:] == IGNORE).all()
            assert (pos[at:] == 0).all()
            n_images = vision_items(inp)
            assert n_images <= MAX_IMAGES, f"step {t} row {r}: {n_images} images"
            full_rows += n_images == MAX_IMAGES
    assert full_rows > 0, "max_images never binds: the limit check would be vacuous"


def expected_targets(toks: np.ndarray, kind: str) -> np.ndarray:
    """Which tokens of one document are prediction targets, from the format's rules."""
    sp = special()
    vision = np.isin(toks, [sp.vision_start, sp.image_pad, sp.video_pad, sp.vision_end])
    if kind != "conversation":
        return ~vision  # captions, interleaved text, video captions, EOS
    mask = np.zeros(len(toks), dtype=bool)
    roles = {"user": text_ids("user\n"), "assistant": text_ids("assistant\n")}
    newline = text_ids("\n")
    turns = 0
    for p in np.flatnonzero(toks == sp.im_start):
        q = p + 1 + int(np.argmax(toks[p + 1:] == sp.im_end))
        assert toks[q] == sp.im_end and q > p
        role = next(name for name, ids in roles.items()
                    if toks[p + 1:p + 1 + len(ids)].tolist() == ids)
        assert toks[q + 1:q + 1 + len(newline)].tolist() == newline
        if role == "assistant":
            mask[p + 1 + len(roles[role]):q + 1 + len(newline)] = True
        turns += 1
    assert turns >= 2
    assert toks[-1] == sp.eos
    mask[-1] = True
    return mask


def test_labels_by_format(walked) -> None:
    """Labels are the next token where it is a target, else -100 (vision, user turns, pad)."""
    sp = special()
    kinds: dict[str, int] = {}
    user_tokens = 0
    for t, (b, rows) in enumerate(walked):
        lab_all = b["labels"]
        assert not np.isin(lab_all, [sp.vision_start, sp.vision_end, sp.image_pad,
                                     sp.video_pad, sp.im_start]).any()
        for r, segs in enumerate(rows):
            inp, lab = b["input"][r], b["labels"][r]
            at = 0
            for _, start, end, sample in segs:
                n = end - start
                toks = inp[at:at + n]
                kind = sample_kind(sample)
                kinds[kind] = kinds.get(kind, 0) + 1
                mask = expected_targets(toks, kind)
                want = np.where(mask[1:], toks[1:], IGNORE)
                got = lab[at:at + n - 1]
                bad = np.flatnonzero(got != want)
                assert bad.size == 0, (f"step {t} row {r}: {kind} labels differ at "
                                       f"{bad[:5].tolist()}: {got[bad[:5]]} vs {want[bad[:5]]}")
                if kind == "conversation":
                    user_tokens += int((~mask).sum())
                at += n
    assert kinds.get("caption", 0) > 0 and kinds.get("conversation", 0) > 0, kinds
    assert kinds.get("interleaved", 0) > 0, kinds
    assert user_tokens > 0


def test_max_images_drops_documents_over_the_limit(tmp_path, tmp_path_factory) -> None:
    """With max_images=2: a 3-image document is dropped and recorded, rows hold <= 2 images."""
    by_kind = demo_samples_by_kind(tmp_path_factory)
    three = next(s for s in by_kind["interleaved"] if sum(k.endswith(".jpg") for k in s) == 3)
    samples = [{"__key__": "big", **three}] + [
        {"__key__": f"cap{i}", **s} for i, s in enumerate(by_kind["caption"][:5])]
    shards = [str(p) for p in write_shards(samples, tmp_path, samples_per_shard=100)]
    recipe = make_recipe(shards, num_lanes=1, global_batch_size=1, pack={"max_images": 2}, epochs=1,
                         shuffle_buffer=0)
    reader = recipe.datasets[0].reader
    ep: Epoch = run_epoch(Loader(recipe, 0, 1, Execution(runner="inline")))
    drops = [(reader.key(o.shard, o.index), reason) for o, reason in ep.drops()]
    assert drops == [("big", "over_limit:images")]
    keys = sorted(reader.key(o.shard, o.index) for o in ep.origins())
    assert keys == sorted(f"cap{i}" for i in range(5))
    sp = special()
    assert ep.step_rows
    for rows in ep.step_rows:
        batch = recipe.collate(rows)
        assert int((batch["input"] == sp.vision_start).sum(dim=1).max()) <= 2


@pytest.mark.parametrize("overlong", ["drop", "truncate"])
def test_overlong_documents_never_cut_an_image(tmp_path, tmp_path_factory, overlong) -> None:
    """A 3-image document longer than S: dropped as over_length, or cut between pieces."""
    seq_len = 256
    by_kind = demo_samples_by_kind(tmp_path_factory)
    vision_tokens = {}
    for i, s in enumerate(by_kind["interleaved"]):
        vision_tokens[i] = [int(np.prod(g)) // MERGE ** 2 + 2 for _, g, _ in expected_vision(s)]
    # a document whose images alone need more than S tokens, but whose first image fits
    i = next(i for i, v in vision_tokens.items() if sum(v) > seq_len and len(v) == 3)
    samples = [{"__key__": "long", **by_kind["interleaved"][i]}] + [
        {"__key__": f"cap{j}", **s} for j, s in enumerate(by_kind["caption"][:3])]
    shards = [str(p) for p in write_shards(samples, tmp_path, samples_per_shard=100)]
    recipe = make_recipe(shards, num_lanes=1, global_batch_size=1, seq_len=seq_len,
                         pack={"overlong": overlong}, epochs=1, shuffle_buffer=0)
    reader = recipe.datasets[0].reader
    ep = run_epoch(Loader(recipe, 0, 1, Execution(runner="inline")))
    drops = [(reader.key(o.shard, o.index), reason) for o, reason in ep.drops()]
    keys = sorted(reader.key(o.shard, o.index) for o in ep.origins())
    if overlong == "drop":
        assert drops == [("long", "over_length")]
        assert keys == ["cap0", "cap1", "cap2"]
        return
    assert drops == [] and keys == ["cap0", "cap1", "cap2", "long"]
    sp = special()
    rows = [row for step in ep.step_rows for row in step] + ep.left_rows
    (row,) = [r for r in rows if any(reader.key(s.origin.shard, s.origin.index) == "long"
                                     for s in r.segments)]
    batch = {k: v.numpy() for k, v in recipe.collate([row]).items()}
    spans = vision_spans(batch["input"][0])
    assert len(spans) == len(batch["grid_thw"])
    for (s, e), g in zip(spans, batch["grid_thw"], strict=True):
        assert e - s - 1 == int(np.prod(g)) // MERGE ** 2
    seg = next(s for s in row.segments if reader.key(s.origin.shard, s.origin.index) == "long")
    toks = np.asarray(seg.payload["tokens"])
    assert len(toks) <= seq_len
    kept = int((toks == sp.vision_start).sum())
    assert kept == int((toks == sp.vision_end).sum()) and 0 < kept < 3
    assert seg.payload["costs"]["images"] == kept == len(seg.payload["grid_thw"])
    want = expected_vision(by_kind["interleaved"][i])[:kept]
    for (_, g, _), got in zip(want, seg.payload["grid_thw"], strict=True):
        assert np.array_equal(g, got)
