"""Decoding after the packer (`DecodePlanned`, a row transform): a planned sample whose
pixels fail to decode once its row was made keeps its place with a black image of the
planned size, no labels, and a recorded drop; the same at every D, runner and resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.vl import demo_samples_by_kind, make_recipe, run_epoch
from zephon_core import Execution, Loader, RunnerKind, run_digests
from zephon_core.internals import sample_digest
from zephon_vl import write_shards
from zephon_vl.media.image import ImageSettings
from zephon_vl.media.planned import PlannedItem, plan_image
from zephon_vl.ops.decode_rows import DECODE_FAILED, DecodePlanned

BROKEN = ("s03", "s09")
INLINE = Execution(runner="inline", group_size=2, prefetch=2, prefetch_steps=0)


def _cut_body(jpeg: bytes, share: float) -> bytes:
    """A JPEG whose header (SOF, SOS) is intact and whose scan data is cut: it plans from
    its header and fails to decode."""
    sos = jpeg.index(b"\xff\xda")
    return jpeg[:sos + int((len(jpeg) - sos) * share)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[str]:
    caps = demo_samples_by_kind(tmp_path_factory)["caption"][:16]
    samples = []
    for i, s in enumerate(caps):
        sample = {"__key__": f"s{i:02d}", **s}
        if sample["__key__"] in BROKEN:
            sample["jpg"] = _cut_body(s["jpg"], 0.3 if i == 3 else 0.6)
        samples.append(sample)
    out = tmp_path_factory.mktemp("decode_after_plan")
    return [str(p) for p in write_shards(samples, out, samples_per_shard=8)]


class Factory:
    def __init__(self, shards: list[str], epochs: int | None = None) -> None:
        self.shards, self.epochs = shards, epochs

    def __call__(self):
        return make_recipe(self.shards, num_lanes=4, global_batch_size=4, epochs=self.epochs,
                           shuffle_buffer=4, pack={"decode_after_pack": True})


def test_by_default_the_decode_follows_the_packer_and_planning_runs_in_a_thread(shards):
    """Since 0.4 the decode follows the packer by default, and the planning operators
    (read, headers, tokens) run in one thread of the loader's process: the first batch and
    the memory no longer grow with the open bins (docs/design.md)."""
    recipe = make_recipe(shards, num_lanes=4, global_batch_size=4, shuffle_buffer=4)
    assert [type(o) for o in recipe.row_ops] == [DecodePlanned]
    planning = [o for o in recipe.ops if o.name in ("read", "decode", "tokenize")]
    assert [o.default_runner for o in planning] == ["threads"] * 3
    ex = Execution()
    assert {ex.runner_for(o) for o in planning} == {(RunnerKind.THREADS, 1)}
    assert ex.runner_for(recipe.row_ops[0])[0] is RunnerKind.PROCESSES


def test_decode_before_the_packer_when_asked(shards):
    """``decode_after_pack = false``: the tokenizer decodes what fits, in the process pool,
    as before 0.4."""
    recipe = make_recipe(shards, num_lanes=4, global_batch_size=4, shuffle_buffer=4,
                         pack={"decode_after_pack": False})
    assert recipe.row_ops == []
    tokenize = next(o for o in recipe.ops if o.name == "tokenize")
    assert tokenize.decode_planned
    assert tokenize.default_runner == "processes"


def test_the_recipe_decodes_after_the_packer(shards):
    recipe = Factory(shards)()
    assert [type(o) for o in recipe.row_ops] == [DecodePlanned]
    tokenize = next(o for o in recipe.ops if o.name == "tokenize")
    assert not tokenize.decode_planned


def test_a_planned_sample_that_fails_to_decode_keeps_its_place_without_labels(shards):
    recipe = Factory(shards, epochs=1)()
    reader = recipe.datasets[0].reader
    epoch = run_epoch(Loader(recipe, 0, 1, INLINE))
    rows = [r for step in epoch.step_rows for r in step] + epoch.left_rows
    found = {}
    for row in rows:
        for seg in row.segments:
            key = reader.key(seg.origin.shard, seg.origin.index)
            found[key] = (row, seg)
    assert set(BROKEN) <= set(found), "a sample that fails after its row was made stays"
    for key, (row, seg) in found.items():
        pixels = seg.payload["pixel_values"]
        assert all(isinstance(p, np.ndarray) for p in pixels)
        if key not in BROKEN:
            assert np.asarray(seg.payload["targets"]).any()
            continue
        assert not np.asarray(seg.payload["targets"]).any()  # no labels from it
        assert all(not p.any() for p in pixels)  # black: 0 before normalization
        grid = [tuple(int(x) for x in g) for g in seg.payload["grid_thw"]]
        assert [p.shape[0] for p in pixels] == [g[1] * g[2] for g in grid]
        labels = recipe.collate([row])["labels"][0]
        at = sum(s.length for s in row.segments[:row.segments.index(seg)])
        assert (labels[at:at + seg.length] == -100).all()
        drops = dict(zip(row.drops, row.drop_details, strict=True))
        detail = drops[(seg.origin, DECODE_FAILED)]
        assert detail.startswith("corrupt_image at ") and key in detail
    reasons = {reader.key(o.shard, o.index): r for o, r in epoch.drops()}
    assert {k: reasons.get(k) for k in BROKEN} == dict.fromkeys(BROKEN, DECODE_FAILED)


def _run(shards, dp: int, ex: Execution, states: list[str]) -> list[tuple]:
    records = run_digests(Factory(shards), dp, 6, ex, save_at=3, resume_dp=[2, 1],
                          on_state=states.append)
    return [(r.step, r.phase, r.sha256, r.drops) for r in records]


@pytest.mark.slow
def test_the_same_outcome_at_every_d_runner_and_resume(shards):
    """D=1 inline and D=2 in process pools give the same batches and drops, resumed at
    step 3 on D=2 and D=1 too, and checkpoints that count the same late drops."""
    one, two = [], []
    inline = _run(shards, 1, INLINE, one)
    procs = _run(shards, 2, Execution(runner="processes", workers={"read": 1, "decode": 1,
                                                                   "tokenize": 1,
                                                                   "decode_rows": 1}), two)
    assert [r[2:] for r in inline] == [r[2:] for r in procs]
    run = {r[0]: r[2:] for r in inline if r[1] == "run"}
    for step, phase, sha, drops in inline:
        if phase != "run":
            assert (sha, drops) == run[step]
    assert sum(r[3] for r in inline if r[1] == "run") >= len(BROKEN)
    # how far a lane drew ahead differs (the snapshot is a cut of its queues), the drops the
    # row stage recorded for the rows up to the step do not
    one_counts, two_counts = ({n: lane["dropped"].get(DECODE_FAILED, 0)
                               for n, lane in json.loads(s[0])["lanes"].items()}
                              for s in (one, two))
    assert one_counts == two_counts and sum(one_counts.values()) >= 1


def test_a_ledger_digest_changes_with_an_image_bytes(shards, tmp_path_factory):
    """The sample digest of an undecoded item hashes its encoded bytes: two images of the
    same size, place and grid whose scan data differ in one byte digest differently."""
    jpeg = demo_samples_by_kind(tmp_path_factory)["caption"][0]["jpg"]
    sos = jpeg.index(b"\xff\xda")
    at = sos + (len(jpeg) - sos) // 2
    other = jpeg[:at] + bytes([jpeg[at] ^ 0x01]) + jpeg[at + 1:]
    image = ImageSettings(max_pixels=128 * 28 * 28)
    a, b = plan_image(jpeg, image, "x.jpg"), plan_image(other, image, "x.jpg")
    assert isinstance(a, PlannedItem) and isinstance(b, PlannedItem)
    assert a.geometry == b.geometry and a.data.nbytes == b.data.nbytes
    assert sample_digest({"pixel_values": [a]}) != sample_digest({"pixel_values": [b]})
    assert sample_digest({"pixel_values": [a]}) == sample_digest(
        {"pixel_values": [plan_image(jpeg, image, "x.jpg")]})


def test_a_blank_has_the_planned_layout(shards, tmp_path_factory):
    """`PlannedItem.blank` lays out like the decode: same shape and dtype, all zero."""
    jpeg = demo_samples_by_kind(tmp_path_factory)["caption"][1]["jpg"]
    for image in (ImageSettings(max_pixels=128 * 28 * 28),
                  ImageSettings(max_pixels=128 * 28 * 28, normalize="device")):
        item = plan_image(jpeg, image, "y.jpg")
        decoded, blank = item.decode(), item.blank()
        assert blank.pixel_values.shape == decoded.pixel_values.shape
        assert blank.pixel_values.dtype == decoded.pixel_values.dtype
        assert (blank.grid_thw == decoded.grid_thw).all()
        if blank.pixel_values.dtype == np.uint8:
            assert not blank.pixel_values.any()


def test_each_item_waits_in_its_smaller_form(tmp_path_factory):
    """With the decode after the packer an image whose encoded bytes outweigh its resized
    pixels (a noisy PNG brought down to the budget) is decoded before the packer: held
    planned it would cost an open bin more, not less. A small JPEG stays planned."""
    import io

    from PIL import Image

    from zephon_vl.media.planned import items_for_the_packer

    image = ImageSettings(max_pixels=64 * 28 * 28)
    noise = np.random.default_rng(0).integers(0, 256, (900, 900, 3), dtype=np.uint8)
    png = io.BytesIO()
    Image.fromarray(noise).save(png, format="PNG")
    jpeg = demo_samples_by_kind(tmp_path_factory)["caption"][1]["jpg"]
    big, small = plan_image(png.getvalue(), image, "n.png"), plan_image(jpeg, image, "j.jpg")
    assert isinstance(big, PlannedItem) and isinstance(small, PlannedItem)
    assert big.smaller_decoded() and not small.smaller_decoded()
    held = items_for_the_packer([big, small])
    assert isinstance(held[0], np.ndarray) and (held[0] == big.decode().pixel_values).all()
    assert held[1] is small
