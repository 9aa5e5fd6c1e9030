"""A video sample through the whole VLM pipeline: video_pad tokens per frame, temporal patches.

The demo videos are 320x240 clips of 2 to 3 seconds at 8-12 fps whose caption
states the duration; at the default 2 fps the clip gives ceil(2 * duration)
frames, padded to an even count, so ``t = ceil(ceil(2 * d) / 2)``. Frames of
320x240 resize to 308x252 (multiples of 28, area under max_pixels), a grid of
22 x 18 patches.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.vl import (
    IMAGE,
    MERGE,
    demo_samples_by_kind,
    expected_video_t,
    make_recipe,
    run_epoch,
    special,
    video_duration_from_caption,
)
from zephon_core import Execution, Loader, batch_digest
from zephon_vl import VideoSettings, normalize_patches, process_video, write_shards

GRID_HW = (18, 22)


@pytest.fixture(scope="module")
def video_shards(tmp_path_factory) -> tuple[list[str], dict[str, dict]]:
    by_kind = demo_samples_by_kind(tmp_path_factory)
    samples = {f"vid{i}": s for i, s in enumerate(by_kind["video"])}
    samples.update({f"cap{i}": s for i, s in enumerate(by_kind["caption"][:2])})
    assert len(samples) == 4
    out = tmp_path_factory.mktemp("videos")
    shards = write_shards([{"__key__": k, **s} for k, s in samples.items()], out,
                          samples_per_shard=10)
    return [str(p) for p in shards], samples


def run(shards: list[str], ex: Execution, video: VideoSettings | None = None):
    recipe = make_recipe(shards, num_lanes=1, global_batch_size=1, epochs=1, shuffle_buffer=0,
                         **({"video": video} if video else {}))
    ep = run_epoch(Loader(recipe, 0, 1, ex))
    assert not ep.drops(), ep.drops()
    rows = [row for step in ep.step_rows for row in step] + ep.left_rows
    return recipe, rows


@pytest.mark.parametrize("video", [None, VideoSettings(fps=2.0, max_frames=4)])
def test_video_goes_through_with_temporal_patches(video_shards, video) -> None:
    shards, samples = video_shards
    recipe, rows = run(shards, Execution(runner="inline"), video)
    reader = recipe.datasets[0].reader
    sp = special()
    settings = video or VideoSettings()
    found = 0
    for row in rows:
        batch = recipe.collate([row])
        inp = batch["input"][0].numpy()
        grid = batch["grid_thw"].numpy()
        pix = batch["pixel_values"].numpy()
        starts = np.flatnonzero(inp == sp.vision_start)
        ends = np.flatnonzero(inp == sp.vision_end)
        # an image is one run; a video one run per temporal patch (Qwen3.5's frames)
        assert len(starts) == len(ends) == int(sum(g[0] for g in grid))
        assert len(grid) == len(row.segments)
        runs = iter(zip(starts, ends, strict=True))
        offset = 0
        for seg, g in zip(row.segments, grid, strict=True):
            key = reader.key(seg.origin.shard, seg.origin.index)
            frames = [inp[s + 1:e] for s, e in (next(runs) for _ in range(int(g[0])))]
            body = np.concatenate(frames)
            n = int(np.prod(g))
            patches = pix[offset:offset + n].reshape(n, 3, IMAGE.temporal_patch_size, 14 * 14)
            offset += n
            if not key.startswith("vid"):
                assert (body == sp.image_pad).all() and g[0] == 1
                # an image is one frame repeated over the temporal patch
                assert np.array_equal(patches[:, :, 0], patches[:, :, 1])
                continue
            found += 1
            assert (body == sp.video_pad).all(), "a video must use <|video_pad|>"
            assert {len(f) for f in frames} == {n // int(g[0]) // MERGE ** 2}
            d = video_duration_from_caption(samples[key]["txt"].decode())
            t = min(expected_video_t(d), settings.max_frames // IMAGE.temporal_patch_size)
            assert tuple(int(x) for x in g) == (t, *GRID_HW), (key, g)
            assert t > 1
            # the two frames of a temporal patch are different moments of the clip
            assert not np.array_equal(patches[:, :, 0], patches[:, :, 1])
            want = process_video(samples[key]["mp4"], IMAGE, settings, key)
            assert np.array_equal(normalize_patches(want.pixel_values, IMAGE).reshape(
                n, 3, IMAGE.temporal_patch_size, 14 * 14), patches)
        assert offset == len(pix)
    assert found == 2


def test_video_rows_are_deterministic_across_runners(video_shards) -> None:
    shards, _ = video_shards
    recipe, rows = run(shards, Execution(runner="inline"))
    _, rows_t = run(shards, Execution(runner="threads", workers={"decode": 2}, group_size=1))
    assert [batch_digest(recipe.collate([r])) for r in rows] == \
        [batch_digest(recipe.collate([r])) for r in rows_t]


def test_worker_and_collate_normalization_agree(video_shards) -> None:
    """normalize="worker" (float32 from the worker) gives the tensors of normalize="collate"."""
    from dataclasses import replace

    shards, _ = video_shards
    recipe, rows = run(shards, Execution(runner="inline"))
    batch = recipe.collate(rows)
    recipe_w = make_recipe(shards, num_lanes=1, global_batch_size=1, epochs=1,
                           shuffle_buffer=0, image=replace(IMAGE, normalize="worker"))
    ep = run_epoch(Loader(recipe_w, 0, 1, Execution(runner="inline")))
    rows_w = [row for step in ep.step_rows for row in step] + ep.left_rows
    assert rows_w[0].segments[0].payload["pixel_values"][0].dtype == np.float32
    assert rows[0].segments[0].payload["pixel_values"][0].dtype == np.uint8
    batch_w = recipe_w.collate(rows_w)
    assert batch_digest(batch_w) == batch_digest(batch)
