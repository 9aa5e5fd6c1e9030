"""`zephon-vl inspect-data`: what gets in, what is dropped and why, before training."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from zephon_core import load_recipe, qwen_tokenizer_dir
from zephon_vl import write_shards
from zephon_vl.cli.inspect_data import inspect_data
from zephon_vl.cli.main import main


def jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(out, "JPEG")
    return out.getvalue()


def chat(roles: tuple[str, str], i: int) -> bytes:
    return json.dumps({"conversations": [
        {"role": roles[0], "content": "<image>\nWhat is shown?"},
        {"role": roles[1], "content": f"A picture, number {i}."}]}).encode()


def recipe_file(tmp_path: Path, roles: tuple[str, str]) -> Path:
    samples = [{"__key__": f"s{i:03d}", "jpg": jpeg(i), "json": chat(roles, i)}
               for i in range(10)]
    samples[3]["jpg"] = b"not a jpeg"
    shards = write_shards(samples, tmp_path / f"shards-{roles[0]}", samples_per_shard=5)
    path = tmp_path / f"{roles[0]}.toml"
    path.write_text('kind = "vlm"\nseq_len = 512\nglobal_batch_size = 2\nnum_lanes = 2\n'
                    f'tokenizer = "{qwen_tokenizer_dir()}"\nimage_every_row = false\n'
                    '[image]\nmax_pixels = 50176\n[[datasets]]\nname = "chats"\nfiles = ['
                    + ", ".join(f'"{s}"' for s in shards) + "]\n")
    return path


def test_reports_kept_dropped_tokens_and_images(tmp_path: Path) -> None:
    (rep,) = inspect_data(load_recipe(str(recipe_file(tmp_path, ("user", "assistant")))), 10)
    assert (rep.read, rep.kept, rep.dropped) == (10, 9, {"corrupt_image": 1})
    assert rep.examples["corrupt_image"][0].startswith("s003")
    assert rep.images == [1] * 9 and all(v > 0 for v in rep.vision_tokens)
    # the assistant turn and its end are trained; the image and the question are not
    assert all(1 < t < n for t, n in zip(rep.trained, rep.tokens, strict=True))
    assert not rep.warnings


def test_unknown_roles_are_dropped_naming_the_role(tmp_path: Path) -> None:
    (rep,) = inspect_data(load_recipe(str(recipe_file(tmp_path, ("narrator", "bot")))), 10)
    assert (rep.kept, rep.dropped) == (0, {"bad_role": 9, "corrupt_image": 1})
    assert "'narrator'" in rep.examples["bad_role"][0]


def test_chats_without_a_trained_role_warn_that_nothing_trains(tmp_path: Path, capsys) -> None:
    path = recipe_file(tmp_path, ("system", "user"))
    out = tmp_path / "report.json"
    assert main(["inspect-data", "--recipe", str(path), "--samples", "10", "--json", str(out),
                 "--png", str(tmp_path / "png")]) == 0
    captured = capsys.readouterr()
    assert "9 kept, 1 dropped" in captured.out and "dropped corrupt_image: 1" in captured.out
    assert "trains at most one token (the end of text) per sample" in captured.err
    assert json.loads(out.read_text())[0]["kept"] == 9
    assert (tmp_path / "png" / "dataset-0-chats.png").stat().st_size > 1000


def test_reports_the_format_each_dataset_is_read_as(tmp_path: Path, capsys) -> None:
    """The report names the format (``llava``, ``webdataset``), not a reader class."""
    from tests.helpers.formats import recipe_toml, write_llava

    llava, images, _ = write_llava(tmp_path / "llava", records=10)
    recipe_file(tmp_path, ("user", "assistant"))  # writes the shards under shards-user/
    tars = [str(s) for s in sorted((tmp_path / "shards-user").glob("*.tar"))]
    path = recipe_toml(tmp_path / "two.toml", [
        {"name": "llava", "format": "llava", "files": [str(llava)], "image_folder": str(images)},
        {"name": "wds", "files": tars},
    ], num_lanes=2, global_batch_size=2)
    reports = inspect_data(load_recipe(str(path)), 4)
    assert [r.format for r in reports] == ["llava", "webdataset"]
    assert main(["inspect-data", "--recipe", str(path), "--samples", "4"]) == 0
    assert "(format llava, 1 shard(s))" in capsys.readouterr().out
