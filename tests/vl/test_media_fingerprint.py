"""A checkpoint's fingerprint covers the media a record dataset names (issue 34, item 3).

Before, `image_folder` and the images the records name were not in the
fingerprint: a resume after an image changed (same name, other pixels and
size) was accepted, then crashed while the restore recomputed the held rows,
or went on with other batches. Now each record file's identity carries the
folders and the names, sizes and modification times of the files its records
name, and a resume against other media is refused naming the dataset, the
record file and the image.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import warnings
from pathlib import Path

import pytest

from tests.helpers.formats import photos, recipe_toml, write_llava, write_obelics
from zephon_core import CheckpointError, Execution, Loader, batch_digest, load_recipe
from zephon_core.engine.checkpoint import fingerprint_digest
from zephon_core.engine.state_check import CHECKSUM_KEY, state_checksum

INLINE = Execution(runner="inline", prefetch_steps=0)


def llava_table(root: Path) -> dict:
    files, images, _ = write_llava(root)
    return {"name": "captions", "format": "llava", "files": [str(files)],
            "image_folder": str(images)}


def loader_of(toml: Path) -> Loader:
    return Loader(load_recipe(str(toml)), 0, 1, INLINE)


def run(toml: Path, steps: int, state: dict | None = None) -> tuple[list[str], dict]:
    with loader_of(toml) as loader:
        if state is not None:
            loader.load_state_dict(state)
        got = [batch_digest(loader.recipe.collate(loader.next_rows())) for _ in range(steps)]
        return got, loader.state_dict()


def replace_image(path: Path) -> tuple[int, int]:
    """Another photo under the same name (other pixels, other size); returns the sizes."""
    before = path.stat().st_size
    other = next(data for _, data, _ in photos(8, seed=7) if len(data) != before)
    path.write_bytes(other)
    st = path.stat()  # a clock that did not move must not hide the edit
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    return before, path.stat().st_size


def test_a_resume_after_an_image_changed_is_refused_naming_it(tmp_path) -> None:
    table = llava_table(tmp_path / "data")
    toml = recipe_toml(tmp_path / "r.toml", [table])
    _, state = run(toml, 2)
    victim = sorted(Path(table["image_folder"]).iterdir())[0]
    was, now = replace_image(victim)
    with loader_of(toml) as loader:
        with pytest.raises(CheckpointError) as info:
            loader.load_state_dict(state)
    msg = str(info.value)
    assert "captions" in msg and "llava.json" in msg, msg  # the dataset and record file
    assert victim.name in msg and f"{was} bytes" in msg and f"{now} bytes" in msg, msg
    assert "\n" not in msg.strip()


def test_a_resume_with_another_image_folder_is_refused_naming_it(tmp_path) -> None:
    table = llava_table(tmp_path / "data")
    toml = recipe_toml(tmp_path / "r.toml", [table])
    _, state = run(toml, 1)
    moved = tmp_path / "elsewhere"
    shutil.copytree(table["image_folder"], moved)
    toml = recipe_toml(tmp_path / "r2.toml", [{**table, "image_folder": str(moved)}])
    with loader_of(toml) as loader:
        with pytest.raises(CheckpointError, match=r"media\.image_folder \(captions / "):
            loader.load_state_dict(state)


def test_unchanged_media_resume_with_the_batches_of_the_uninterrupted_run(tmp_path) -> None:
    """The identity is computed at each build from the files as they are: an untouched
    folder resumes (also after the names cache beside the record file was removed)."""
    table = llava_table(tmp_path / "data")
    toml = recipe_toml(tmp_path / "r.toml", [table])
    want, _ = run(toml, 4)
    _, state = run(toml, 2)
    for cached in Path(table["files"][0]).parent.glob("*.zmedia.json"):
        cached.unlink()
    got, _ = run(toml, 2, state)
    assert got == want[2:]


def test_every_record_file_names_its_media(tmp_path) -> None:
    """What the identity holds: the folders, the count of local files named and a digest of
    their names, sizes and mtimes; a missing file counts as a file that is not there."""
    files, web, _ = write_obelics(tmp_path / "o")
    toml = recipe_toml(tmp_path / "r.toml", [{"name": "web", "format": "obelics",
                                              "files": [str(files)],
                                              "image_folder": str(web)}])
    (shard,) = load_recipe(str(toml)).fingerprint()["datasets"][0]["shards"]
    media = shard["media"]
    assert media["image_folder"] == str(web) and media["video_folder"] is None
    assert media["files"] == len(list(web.iterdir()))
    next(web.iterdir()).unlink()
    (again,) = load_recipe(str(toml)).fingerprint()["datasets"][0]["shards"]
    assert again["media"]["files"] == media["files"]
    assert again["media"]["sha256"] != media["sha256"]


def without_media(state: dict) -> dict:
    """`state` as a release before media identities wrote it: its shards lack ``media``."""
    old = copy.deepcopy(state)
    for d in old["fingerprint"]["datasets"]:
        for s in d["shards"]:
            s.pop("media", None)
    old["fingerprint_sha256"] = fingerprint_digest(old["fingerprint"])
    old[CHECKSUM_KEY] = state_checksum(old)
    return old


def test_a_checkpoint_written_before_media_identities_restores_with_a_warning(tmp_path) -> None:
    table = llava_table(tmp_path / "data")
    toml = recipe_toml(tmp_path / "r.toml", [table])
    want, _ = run(toml, 4)
    _, state = run(toml, 2)
    old = without_media(state)
    with pytest.warns(UserWarning, match=r"fingerprint\.datasets\[0\]\.shards\[0\]\.media"):
        got, resumed = run(toml, 2, old)
    assert got == want[2:]
    assert "media" in resumed["fingerprint"]["datasets"][0]["shards"][0]  # written again


def test_text_and_webdataset_fingerprints_have_no_media(tmp_path_factory) -> None:
    """Only record formats gain the field: text and WebDataset checkpoints keep theirs."""
    from tests.helpers.vl import demo_shards, make_recipe

    for recipe in (load_recipe("text-demo"), make_recipe(demo_shards(tmp_path_factory))):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            text = json.dumps(recipe.fingerprint())
        assert '"media"' not in text


def test_a_record_manifest_holds_the_media_identity_and_refresh_names_changes(
        tmp_path, capsys) -> None:
    """``zephon-vl index --image-folder`` lists the media once; a build from the manifest
    takes the identity from it (no stat: a change after indexing is not seen), and
    ``--refresh`` lists them again, naming the file that changed."""
    from zephon_vl.cli.main import main

    table = llava_table(tmp_path / "data")
    manifest = tmp_path / "m.json"
    assert main(["index", *table["files"], "--format", "llava", "--out", str(manifest),
                 "--image-folder", table["image_folder"]]) == 0
    assert "13 media files listed" in capsys.readouterr().out
    direct = recipe_toml(tmp_path / "direct.toml", [table])
    indexed = recipe_toml(tmp_path / "indexed.toml", [
        {**{k: v for k, v in table.items() if k != "files"}, "manifest": str(manifest)}])

    def media(toml: Path) -> dict:
        return load_recipe(str(toml)).fingerprint()["datasets"][0]["shards"][0]["media"]

    assert media(indexed) == media(direct)
    _, state = run(indexed, 1)
    victim = sorted(Path(table["image_folder"]).iterdir())[1]
    replace_image(victim)
    assert media(indexed) != media(direct)  # the manifest's identity, not the files'
    assert main(["index", "--refresh", str(manifest)]) == 0
    said = capsys.readouterr().out
    assert "llava.json: media 13 files" in said and victim.name in said, said
    assert media(indexed) == media(direct)
    with loader_of(indexed) as loader:
        with pytest.raises(CheckpointError, match=victim.name):
            loader.load_state_dict(state)


def test_a_parquet_file_is_scanned_without_its_embedded_bytes(tmp_path, monkeypatch) -> None:
    """Parquet ``Image`` entries: the scan reads every column but the ``bytes`` of the
    ``{bytes, path}`` structs (no pixels); a path-only entry names a file of the folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon_core.data.formats import DatasetSpec, dataset_reader

    (tmp_path / "img").mkdir()
    (_, jpeg, _), (_, other, _) = photos(2)
    (tmp_path / "img" / "a.jpg").write_bytes(jpeg)
    texts = [[{"user": "What is it?", "assistant": "A photo."}]] * 3
    images = [[{"bytes": jpeg, "path": "embedded.jpg"}], [{"bytes": None, "path": "a.jpg"}],
              [{"bytes": other, "path": None}]]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"images": images, "texts": texts}), path)
    spec = DatasetSpec([str(path)], "parquet", options={"image_folder": str(tmp_path / "img")})
    asked: list[str] = []
    read = pq.ParquetFile.read_row_group

    def spy(self, i, columns=None, **kw):
        asked.extend(columns or ["<all>"])
        return read(self, i, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    media = dataset_reader(spec).shard_identity(0)["media"]
    assert asked and not [c for c in asked if c.endswith(".bytes") or c == "<all>"], asked
    assert media["files"] == 2  # a.jpg, and embedded.jpg's path (absent: it is embedded)
    replace_image(tmp_path / "img" / "a.jpg")
    assert dataset_reader(spec).shard_identity(0)["media"]["sha256"] != media["sha256"]


@pytest.mark.parametrize("changed", [{"max_image_bytes": 1 << 20},
                                     {"allow_references": ["/mnt/elsewhere"]}])
def test_a_resume_under_another_reference_policy_is_refused(tmp_path, changed) -> None:
    """The options that decide which references are read decide which records drop: a
    resume under another policy would deal other samples, so it is refused naming it."""
    table = llava_table(tmp_path / "data")
    _, state = run(recipe_toml(tmp_path / "r.toml", [table]), 1)
    other = recipe_toml(tmp_path / "r2.toml", [{**table, **changed}])
    with loader_of(other) as loader:
        with pytest.raises(CheckpointError, match="media_policy"):
            loader.load_state_dict(state)
