"""`zephon-vl shards` on a user's folder: every skipped file named, GIF/TIFF/BMP read, no
empty shard set, paths a recipe file can use from anywhere."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from zephon_core import ConfigError
from zephon_vl import ImageSettings, WebDatasetReader, process_image, shards_from_folder
from zephon_vl.cli.main import main


def photo(fmt: str, size=(40, 30), frames: int = 1, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(len(fmt) + frames)
    imgs = [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
            .convert(mode) for _ in range(frames)]
    out = io.BytesIO()
    imgs[0].save(out, format=fmt, save_all=frames > 1, append_images=imgs[1:])
    return out.getvalue()


def test_every_skipped_file_is_named_with_its_reason(tmp_path: Path, capsys) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(photo("JPEG"))
    (src / "a.txt").write_text("an a")
    (src / "b.png").write_bytes(photo("PNG"))
    (src / "b.jpg").write_bytes(photo("JPEG"))  # two images named b
    (src / "orphan.txt").write_text("no image")
    (src / "notes.md").write_text("# not data")
    assert main(["shards", str(src), str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "notes.md: skipped: not an image" in captured.err
    assert "orphan.txt: skipped: a caption without an image of the same name" in captured.err
    assert "b.png: skipped: another image has the same name (b.jpg is used)" in captured.err
    printed = captured.out.split()
    assert printed and all(Path(p).is_absolute() and Path(p).is_file() for p in printed)


def test_an_empty_folder_is_refused(tmp_path: Path, capsys) -> None:
    src = tmp_path / "empty"
    src.mkdir()
    (src / "readme.md").write_text("nothing")
    with pytest.raises(ConfigError, match="no images.*1 file.*skipped"):
        shards_from_folder(src, tmp_path / "out")
    assert main(["shards", str(src), str(tmp_path / "out2")]) == 2
    assert "no images" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@pytest.mark.parametrize("fmt,suffix", [("GIF", "gif"), ("TIFF", "tif"), ("TIFF", "tiff"),
                                        ("BMP", "bmp")])
def test_gif_tiff_and_bmp_are_sharded_and_decoded(tmp_path: Path, fmt, suffix) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = photo(fmt, frames=3 if fmt == "GIF" else 1)
    (src / f"x.{suffix}").write_bytes(data)
    (src / "x.txt").write_text("a picture")
    (shard,) = shards_from_folder(src, tmp_path / "out")
    sample = WebDatasetReader([shard]).read(0, 0)
    assert sample[suffix] == data
    settings = ImageSettings(max_pixels=64 * 28 * 28)
    got = process_image(sample[suffix], settings)
    # the reference: PIL's first frame as RGB, saved losslessly and decoded the usual way
    first = io.BytesIO()
    Image.open(io.BytesIO(data)).convert("RGB").save(first, format="PNG")
    want = process_image(first.getvalue(), settings)
    assert np.array_equal(got.grid_thw, want.grid_thw)
    assert np.array_equal(got.pixel_values, want.pixel_values)
