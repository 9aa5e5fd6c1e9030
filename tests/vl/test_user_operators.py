"""Users' own operators in a VLM recipe (docs/operators.md): a random resized crop gives
the same batches at D = 1, 2, 4, inline and in worker processes, and across a resume on
another D; a minimum-side filter's drops are in the ledger with its reason, the same at
D = 1 and 2; the documented examples run as the docs write them."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers.vl import LEAN, make_recipe
from zephon_core import (
    CheckpointError,
    ConfigError,
    Dropped,
    Execution,
    Loader,
    UserOp,
    batch_digest,
    load_recipe,
    run_digests,
)
from zephon_vl import build_demo_dataset
from zephon_vl.demo.operators import clean_caption, min_side, random_resized_crop

STEPS = 2
DOCS = Path(__file__).resolve().parents[2] / "docs" / "operators.md"
CROP = UserOp("zephon_vl.demo.operators:random_resized_crop", after="pixels",
              args={"scale": [0.25, 1.0]})
MIN_SIDE = UserOp(min_side, after="pixels", kind="filter", args={"min_side": 320},
                  reason="too_small")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    ds = build_demo_dataset(out_dir=tmp_path_factory.mktemp("user-ops-vl"), num_samples=40,
                            seed=0, videos=0, samples_per_shard=10)
    return [str(s) for s in ds.shards]


def _digests(shards: list[str], D: int, ex: Execution = LEAN, operators=(CROP,)) -> list[str]:
    return [r.sha256 for r in run_digests(
        lambda: make_recipe(shards, operators=list(operators)), D, STEPS, ex)]


def test_random_crop_same_batches_at_D_1_2_4(shards) -> None:
    ref = _digests(shards, 1)
    assert ref != _digests(shards, 1, operators=())  # the crop changed the pixels
    assert _digests(shards, 2) == ref
    assert _digests(shards, 4) == ref


@pytest.mark.slow
def test_random_crop_same_batches_in_worker_processes(shards) -> None:
    ex = Execution(runner="auto", runners={"read": "threads"}, default_workers=2,
                   group_size=2, prefetch=2, prefetch_steps=0)
    recipe = make_recipe(shards, operators=[CROP])
    with Loader(recipe, 0, 1, ex) as loader:
        kinds = {s.name: s.runner_kind for s in loader.plan.stages if s.kind == "transform"}
        assert kinds["decode+tokenize"] == "processes", kinds
        got = [batch_digest(next(loader)) for _ in range(STEPS)]
    assert got == _digests(shards, 1)


def test_random_crop_resumes_on_another_D(shards) -> None:
    recs = list(run_digests(lambda: make_recipe(shards, operators=[CROP]), 2, 3, LEAN,
                            save_at=1, resume_dp=[4]))
    run = [r.sha256 for r in recs if r.phase == "run"]
    assert run[:STEPS] == _digests(shards, 1)
    assert [r.sha256 for r in recs if r.phase == "resumed@1"] == run[1:]


def _drops(path: Path) -> list[dict]:
    return [{k: d[k] for k in ("lane", "dataset", "shard", "index", "epoch", "reason")}
            for line in path.read_text().splitlines()
            for d in json.loads(line).get("drops", ())]


def _shortest_side(sample: dict) -> int:
    sides = [min(Image.open(io.BytesIO(v)).size) for k, v in sample.items()
             if isinstance(k, str) and k.rsplit(".", 1)[-1] in ("jpg", "png", "webp")]
    return min(sides)


def test_min_side_drops_are_in_the_ledger_the_same_at_D_1_and_2(shards, tmp_path) -> None:
    found = {}
    for D in (1, 2):
        path = tmp_path / f"ledger-{D}.jsonl"
        list(run_digests(lambda: make_recipe(shards, operators=[MIN_SIDE]), D, STEPS, LEAN,
                         ledger=path))
        found[D] = _drops(path)
    assert found[1] == found[2]
    mine = [d for d in found[1] if d["reason"] == "too_small"]
    assert mine, found[1]
    recipe = make_recipe(shards)
    for d in mine:  # each one is an image shorter than 320 pixels on a side
        sample = recipe.datasets[d["dataset"]].reader.read(d["shard"], d["index"])
        assert _shortest_side(sample) < 320, d


def test_a_changed_pixels_operator_refuses_the_old_checkpoint(shards) -> None:
    states: list[str] = []
    list(run_digests(lambda: make_recipe(shards, operators=[CROP]), 1, 2, LEAN, save_at=1,
                     resume_dp=[], on_state=states.append))
    bumped = UserOp(CROP.fn, after="pixels", args={"scale": [0.25, 1.0]}, version="2")
    with Loader(make_recipe(shards, operators=[bumped]), 0, 1, LEAN) as loader, \
            pytest.raises(CheckpointError, match=r"operators\[2\]\.pixel_ops\[0\]\.version "
                          r"\(decode / random_resized_crop\)"):
        loader.load_state_dict(json.loads(states[0]))


def test_a_pixels_map_must_return_an_image(shards) -> None:
    bad = UserOp("tests.helpers.user_ops:flat_pixels", after="pixels")
    with Loader(make_recipe(shards, operators=[bad]), 0, 1, LEAN) as loader, \
            pytest.raises(ConfigError, match=r"pixels operator 'flat_pixels' returned a uint8 "
                          r"array of shape \(\d+, \d+\)"):
        next(loader)


def test_the_documented_examples() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (300, 200, 3), dtype=np.uint8)
    assert min_side(image, min_side=200) and not min_side(image, min_side=201)
    doc = {"kind": "caption", "text": " A <b>cat</b>\n on  https://x.org/a.jpg a mat ",
           "vision": []}
    assert clean_caption(doc)["text"] == "A cat on a mat"
    assert clean_caption({**doc, "text": "<p> http://x.org </p>"}) == \
        Dropped("empty_caption", "nothing left after removing markup and URLs")
    chat = {"kind": "conversation", "turns": [], "vision": []}
    assert clean_caption(chat) is chat
    crops = [random_resized_crop(image, rng=np.random.default_rng(s)) for s in range(20)]
    assert all(c.shape[2] == 3 and 1 <= c.shape[0] <= 300 and 1 <= c.shape[1] <= 200
               for c in crops)
    assert len({c.shape for c in crops}) > 5  # random areas and ratios
    again = random_resized_crop(image, rng=np.random.default_rng(3))
    assert np.array_equal(again, crops[3])
    # no crop fits (a thin strip, a ratio range it cannot meet): the centre crop
    strip = image[:4]
    assert random_resized_crop(strip, rng=np.random.default_rng(0), ratio=(1.0, 1.0)).shape \
        == (4, 4, 3)


def _toml_block(text: str) -> str:
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    return next(b for b in blocks if "[[operators]]" in b and "[[datasets]]" not in b)


def test_the_documented_recipe_file_runs(shards, tmp_path) -> None:
    """The docs' ``[[operators]]`` tables, as written there, in a recipe file over the demo
    shards: the same batches at D = 1 and 2, and the minimum-side drops in the ledger."""
    ops = _toml_block(DOCS.read_text())
    path = tmp_path / "recipe.toml"
    path.write_text(f"""kind = "vlm"
seq_len = 1024
global_batch_size = 8
num_lanes = 8
max_images = 5
[image]
max_pixels = 100352
[[datasets]]
name = "demo"
files = {json.dumps(shards)}
{ops}""")
    recipe = load_recipe(path)
    names = [o.name for o in recipe.ops]
    assert names == ["shuffle", "read", "decode", "clean_caption", "tokenize", "pack"], names
    assert [p.name for p in recipe.ops[2].pixel_ops] == ["min_side", "random_resized_crop"]
    found = {}
    for D in (1, 2):
        ledger = tmp_path / f"ledger-{D}.jsonl"
        digests = [r.sha256 for r in run_digests(lambda: load_recipe(path), D, STEPS, LEAN,
                                                 ledger=ledger)]
        found[D] = (digests, _drops(ledger))
    assert found[1] == found[2]
    assert any(d["reason"] == "too_small" for d in found[1][1]), found[1][1]
