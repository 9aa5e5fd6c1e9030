"""A `kind = "vlm"` recipe file: tables become settings, a bad key names the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.vl import demo_shards
from zephon_core import ConfigError, load_recipe


def write_vlm_recipe(folder: Path, shards: list[str], image: str) -> Path:
    path = folder / "captions.toml"
    files = ", ".join(f'"{s}"' for s in shards)
    path.write_text(f"""kind = "vlm"
seq_len = 512
global_batch_size = 4
num_lanes = 2
max_images = 2
[image]
{image}
[video]
max_frames = 4
[[datasets]]
name = "demo"
files = [{files}]
""")
    return path


def test_vlm_file_builds_settings_from_tables(tmp_path: Path,
                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    path = write_vlm_recipe(tmp_path, demo_shards(tmp_path_factory), "max_pixels = 50176")
    recipe = load_recipe(str(path))
    assert recipe.name == "captions" and recipe.seq_len == 512
    assert recipe.collate.image.max_pixels == 50176
    decode = next(o for o in recipe.fingerprint()["operators"] if o["name"] == "decode")
    assert decode["video"]["max_frames"] == 4 and decode["image"]["max_pixels"] == 50176


def test_vlm_file_names_an_unknown_image_key(tmp_path: Path,
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    path = write_vlm_recipe(tmp_path, demo_shards(tmp_path_factory), "max_pixel = 50176")
    with pytest.raises(ConfigError, match=r"captions\.toml: unknown key 'max_pixel' in \[image\]"):
        load_recipe(str(path))
