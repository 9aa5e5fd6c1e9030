"""Text+image mixtures in one VLM recipe, and the row filler (guarantee 10).

A text dataset's records become documents without vision items; with the
filler on (the qwen3_5 default), every row carries an image, so every rank
and every micro-batch runs the vision encoder, at any D, across resumes.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.vl import demo_shards, special, text_ids
from zephon_core.engine.execution import Execution
from zephon_core.engine.plan import Plan
from zephon_core.engine.simulate import SimulatedRanks, run_digests
from zephon_core.errors import BadSampleError
from zephon_core.ops.pack import FILLER_ORIGIN, Pack, RowFiller
from zephon_core.recipes.assets import qwen_tokenizer_dir, text_corpus
from zephon_core.recipes.registry import load_recipe
from zephon_core.records import Origin
from zephon_vl.cli.main import main
from zephon_vl.families.qwen import QwenVL
from zephon_vl.media.image import ImageSettings
from zephon_vl.ops.filler import image_filler
from zephon_vl.ops.multimodal import TokenizeMultimodal, text_document
from zephon_vl.recipes import vlm_recipe

INLINE = Execution(runner="inline", prefetch_steps=0)
STEPS = 4


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return demo_shards(tmp_path_factory)


def mix_recipe(shards: list[str], **over):
    over.setdefault("weights", {"photos": 1.0, "text": 8.0})
    pack = {"max_images": 8, **over.pop("pack", {})}
    return vlm_recipe({"photos": shards, "text": [str(p) for p in text_corpus()]},
                      qwen_tokenizer_dir(), seq_len=1024, global_batch_size=8, num_lanes=4,
                      image=ImageSettings(max_pixels=128 * 28 * 28), pack=pack,
                      shuffle_buffer=16, **over)


def rows_of(recipe, dp: int, steps: int) -> list:
    """Every row of `steps` global batches on `dp` simulated ranks, in global order."""
    runners = Plan(recipe.ops, INLINE).make_runners()
    sim = SimulatedRanks(recipe, dp, INLINE, runners)
    return [r for _ in range(steps) for ld in sim.loaders for r in ld.next_rows()]


def own_images(row) -> int:
    return sum(len(s.payload["grid_thw"]) for s in row.segments if s.origin != FILLER_ORIGIN)


def test_text_records_become_documents_without_vision() -> None:
    assert text_document({"text": "hello"}) == {"kind": "text", "text": "hello",
                                                "vision": [], "video": []}
    chat = text_document({"messages": [{"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": "yo"}]})
    assert chat["kind"] == "conversation" and chat["vision"] == []
    with pytest.raises(BadSampleError, match="missing_text|non-empty 'text'"):
        text_document({"title": "no text"})
    tok = TokenizeMultimodal(qwen_tokenizer_dir(), 2, 1024)
    tok.setup()
    doc = tok.tokenize(text_document({"text": "hello world"}))
    assert doc["tokens"].tolist() == text_ids("hello world") + [special().eos]
    assert doc["costs"] == {"vision_tokens": 0, "images": 0} and doc["grid_thw"] == []
    with pytest.raises(BadSampleError, match="placeholders for 0 images"):
        tok.tokenize(text_document({"conversations": [{"role": "user",
                                                        "content": "see <image>"}]}))


def test_the_filler_is_one_grey_image_at_the_minimum_grid() -> None:
    image = ImageSettings()
    f = image_filler(image, QwenVL(), special())
    grid = f.payload["grid_thw"][0]
    assert grid.tolist() == [1, 4, 4]  # 56x56 = min_pixels at patch 14
    assert f.payload["costs"] == {"vision_tokens": 4, "images": 1}
    assert f.payload["tokens"].tolist() == ([special().vision_start] + [special().image_pad] * 4
                                            + [special().vision_end])
    assert not f.payload["targets"].any()
    assert (f.payload["pixel_values"][0] == 128).all()
    assert image_filler(image, QwenVL(), special()).fingerprint == f.fingerprint


def _doc(n: int, images: int) -> dict:
    return {"tokens": np.arange(n, dtype=np.int32),
            "costs": {"vision_tokens": 4 * images, "images": images}}


def test_packer_appends_the_filler_to_rows_without_an_image_and_keeps_room_for_it() -> None:
    filler = RowFiller("images", _doc(6, 1), "x")
    packer = Pack(32, {"max_open_bins": 1, "overlong": "drop"}, filler=filler).make(0, 0)
    origins = [Origin(i, 0, 0, i, 0) for i in range(5)]
    assert packer.push(origins[0], _doc(20, 0)) is None
    assert packer.push(origins[1], _doc(7, 0)) is None   # 27 + 6 > 32: a new row
    row = packer.pop_row()
    assert [s.origin for s in row.segments] == [origins[0], FILLER_ORIGIN]
    assert row.num_tokens == 26
    drop = packer.push(origins[2], _doc(27, 0))
    assert drop is not None and drop.reason == "over_length" and "row filler" in drop.detail
    assert packer.push(origins[3], _doc(25, 1)) is None  # 7 + 25 = 32 with an image: fits
    row = packer.pop_row()
    assert [s.origin for s in row.segments] == [origins[1], origins[3]]
    # The filler is not state: it is added when a row is popped.
    assert "filler" not in json.dumps(packer.state())


def test_mixture_rows_all_carry_an_image_and_half_have_none_of_their_own(shards) -> None:
    rows = rows_of(mix_recipe(shards), 2, STEPS)
    assert all(any(s.payload["grid_thw"] for s in r.segments) for r in rows)
    bare = sum(own_images(r) == 0 for r in rows)
    assert 0 < bare < len(rows), bare
    kinds = {s.origin.dataset for r in rows for s in r.segments}
    assert {0, 1} <= kinds  # photos and text in the same rows stream
    rows = rows_of(mix_recipe(shards, pack={"image_every_row": False}), 2, STEPS)
    assert any(not any(s.payload["grid_thw"] for s in r.segments) for r in rows)


def test_mixture_is_elastic_and_resumes_on_other_d(shards) -> None:
    def make():
        return mix_recipe(shards)

    ref = [r.sha256 for r in run_digests(make, 1, STEPS, INLINE)]
    recs = list(run_digests(make, 2, STEPS, INLINE, save_at=2, resume_dp=[1, 4]))
    assert [r.sha256 for r in recs if r.phase == "run"] == ref
    assert [r.sha256 for r in recs if r.phase == "resumed@2"] == ref[2:] * 2


def test_toml_recipe_mixes_text_and_webdataset(shards, tmp_path) -> None:
    text = tmp_path / "chat.jsonl"
    text.write_text("\n".join(json.dumps({"messages": [
        {"role": "user", "content": f"question {i}"},
        {"role": "assistant", "content": f"answer {i}"}]}) for i in range(40)) + "\n")
    path = tmp_path / "mix.toml"
    path.write_text(f'''kind = "vlm"
seq_len = 512
global_batch_size = 4
num_lanes = 2
max_images = 4
[image]
max_pixels = 50176
[[datasets]]
name = "photos"
files = {json.dumps(shards)}
weight = 1.0
[[datasets]]
name = "chat"
files = ["chat.jsonl"]
weight = 1.0
''')
    recipe = load_recipe(path)
    assert [d.name for d in recipe.datasets] == ["photos", "chat"]
    rows = rows_of(recipe, 1, 2)
    assert any(s.origin.dataset == 1 for r in rows for s in r.segments)
    assert all(any(s.payload["grid_thw"] for s in r.segments) for r in rows)


def test_a_dataset_mixing_tar_and_jsonl_is_refused(shards) -> None:
    from zephon_core.errors import ConfigError

    with pytest.raises(ConfigError, match="give the text files a dataset of their own"):
        vlm_recipe([*shards, str(text_corpus()[0])], qwen_tokenizer_dir())


def test_balance_command_reports_micro_batches_without_an_image(tmp_path, capsys) -> None:
    out = tmp_path / "b.json"
    assert main(["balance", "--recipe", "vlm-mix-demo", "--lanes", "4", "--dp", "4",
                 "--steps", "3", "--microbatches", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["zero_image_microbatches"] == 0
    assert report["steps"] == 3 and len(report["per_step"]) == 3
    for key in ("zero_image_microbatches_unguarded", "max_over_mean_vision_patches",
                "max_over_mean_cost", "fill", "rows_without_own_image",
                "median_max_over_mean_vision_patches", "mean_vision_tokens_per_row"):
        assert key in report
    assert report["per_step"][0]["max_over_mean_vision_patches"] >= 1.0
    rank = report["per_step"][0]["ranks"][0]
    assert set(rank) >= {"rows", "images", "vision_patches", "text_tokens", "cost"}


def test_balanced_mixture_is_elastic_resumes_on_other_d_and_keeps_the_filler(shards) -> None:
    def make():
        return mix_recipe(shards, pack={"pack_mode": "balanced"}, balance={"budget": 90.0})

    ref = [r.sha256 for r in run_digests(make, 1, STEPS, INLINE)]
    recs = list(run_digests(make, 2, STEPS, INLINE, save_at=2, resume_dp=[4]))
    assert [r.sha256 for r in recs if r.phase == "run"] == ref
    assert [r.sha256 for r in recs if r.phase == "resumed@2"] == ref[2:]
    rows = rows_of(make(), 4, STEPS)
    assert all(any(s.payload["grid_thw"] for s in r.segments) for r in rows)
    assert all(r.num_tokens <= 1024 for r in rows)


def test_balanced_mode_needs_a_budget_and_reads_a_balance_table(shards, tmp_path) -> None:
    from zephon_core import BalancedPack
    from zephon_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"\[balance\] budget"):
        mix_recipe(shards, pack={"pack_mode": "balanced"})
    with pytest.raises(ConfigError, match="unknown key 'budgett'"):
        mix_recipe(shards, pack={"pack_mode": "balanced"}, balance={"budgett": 1})
    with pytest.raises(ConfigError, match="apply to pack_mode='balanced'"):
        mix_recipe(shards, balance={"budget": 90.0})
    path = tmp_path / "bal.toml"
    path.write_text(f'''kind = "vlm"
seq_len = 512
global_batch_size = 4
num_lanes = 2
pack_mode = "balanced"
[balance]
budget = 80.0
heavy_every = 4
heavy_budget = 400.0
[[datasets]]
name = "photos"
files = {json.dumps(shards)}
''')
    packer = load_recipe(path).ops[-1]
    assert isinstance(packer, BalancedPack)
    assert (packer.budget, packer.rows_per_group, packer.heavy_every) == (80.0, 2, 4)
