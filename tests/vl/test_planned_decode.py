"""Planning before decoding: a sample the packer drops for its length is never decoded, and
planned batches equal the batches of the early decode."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.vl import demo_samples_by_kind, make_recipe, run_epoch
from zephon_core import Execution, Loader, run_digests
from zephon_vl import write_shards
from zephon_vl.media.planned import PlannedItem

LONG = "A caption far too long for any row of this recipe. " * 300


def _broken_body(jpeg: bytes) -> bytes:
    """A JPEG whose header is intact and whose entropy-coded data is cut: the header
    reads, the decode fails."""
    return jpeg[: len(jpeg) // 2]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[str]:
    """Captions, 30% of them too long; half of the long ones have a broken image body."""
    by_kind = demo_samples_by_kind(tmp_path_factory)
    caps = by_kind["caption"][:14]
    samples = []
    for i, s in enumerate(caps):
        sample = {"__key__": f"s{i:02d}", **s}
        if i % 10 in (2, 5, 8):  # 30% too long
            sample["txt"] = LONG
            if i % 2:
                sample["jpg"] = _broken_body(s["jpg"])
        samples.append(sample)
    samples.append({"__key__": "video", **by_kind["video"][0]})
    samples.append({"__key__": "long_video", **by_kind["video"][1], "txt": LONG})
    out = tmp_path_factory.mktemp("planned")
    return [str(p) for p in write_shards(samples, out, samples_per_shard=8)]


def _recipe(shards, plan: bool = True, epochs: int | None = 1):
    recipe = make_recipe(shards, num_lanes=2, global_batch_size=2, epochs=epochs,
                         shuffle_buffer=4)
    decode = next(o for o in recipe.ops if o.name == "decode")
    assert decode.plan  # the built-in recipe plans
    decode.plan = plan
    return recipe


def _drops(recipe, ex) -> dict[str, str]:
    with Loader(recipe, 0, 1, ex) as loader:
        epoch = run_epoch(loader)
    reader = recipe.datasets[0].reader
    return {reader.key(o.shard, o.index): reason for o, reason in epoch.drops()}


def test_a_long_sample_is_dropped_for_its_length_without_being_decoded(shards):
    """Its broken image body is never read: the drop says over_length. Decoded first
    (the old order), the same sample was dropped as corrupt_image."""
    drops = _drops(_recipe(shards), Execution(runner="inline"))
    assert drops == {"s02": "over_length", "s05": "over_length", "s08": "over_length",
                     "s12": "over_length", "long_video": "over_length"}
    early = _drops(_recipe(shards, plan=False), Execution(runner="inline"))
    assert early["s05"] == "corrupt_image"


@pytest.mark.parametrize("runner", ["inline", pytest.param("processes", marks=pytest.mark.slow)])
def test_planned_batches_equal_the_early_decode(shards, runner):
    ex = Execution(runner=runner, workers={"read": 1, "decode": 2, "tokenize": 2})
    planned = [r.sha256 for r in run_digests(lambda: _recipe(shards, epochs=None), 2, 6, ex)]
    early = [r.sha256 for r in run_digests(lambda: _recipe(shards, plan=False, epochs=None),
                                           2, 6, ex)]
    assert len(planned) == 6 and planned == early


def test_rows_hold_no_planned_item(shards):
    """Every item reaching a row is decoded (no `PlannedItem` past the tokenizer)."""
    with Loader(_recipe(shards), 0, 1, Execution(runner="inline")) as loader:
        rows = loader.next_rows()
    items = [p for r in rows for s in r.segments for p in s.payload["pixel_values"]]
    assert items and all(isinstance(p, np.ndarray) for p in items)
    assert not any(isinstance(p, PlannedItem) for p in items)


def test_planning_leaves_the_fingerprint_as_it_was(shards):
    """Checkpoints written before planning restore: `plan` is no setting (same pixels)."""
    assert _recipe(shards).fingerprint() == _recipe(shards, plan=False).fingerprint()
