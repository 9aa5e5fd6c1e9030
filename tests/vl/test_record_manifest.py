"""Record manifests (issue 21 item 3): ``zephon-vl index FILE... --format NAME --out M``
for Parquet, LLaVA JSON, messages and OBELICS files, as for tar shards.

A dataset that names the manifest builds from it alone (no data file is stat'ed
or opened: counted on an HTTP server), gives the digests of its file list, and
refuses a file whose size or identity changed, naming it and the field, when
the file is first opened.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers.formats import format_datasets, recipe_toml
from zephon_core import ConfigError, ZephonError
from zephon_core.data.formats import DatasetSpec, dataset_reader
from zephon_vl.cli.main import main


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    made = format_datasets(tmp_path_factory.mktemp("record-manifests"))
    return {name: table for name, (table, _) in made.items()}


def index(files: list[str], fmt: str, out: Path, capsys) -> str:
    capsys.readouterr()
    assert main(["index", *files, "--format", fmt, "--out", str(out)]) == 0
    return capsys.readouterr().out


def digests(capsys, toml: Path, *args: str) -> list[str]:
    capsys.readouterr()
    assert main(["digest", "--runner", "inline", "--recipe", str(toml), "--steps", "3",
                 *args]) == 0
    return [json.loads(line)["sha256"] for line in capsys.readouterr().out.splitlines()
            if line]


def as_manifest(table: dict, manifest: Path) -> dict:
    return {**{k: v for k, v in table.items() if k != "files"}, "manifest": str(manifest)}


@pytest.mark.parametrize("name", ["parquet", "llava", "obelics", "messages"])
def test_a_manifest_gives_the_digests_of_its_file_list(name, data, tmp_path, capsys) -> None:
    table = data[name]
    out = tmp_path / "m.json"
    said = index(table["files"], name, out, capsys)
    assert f"1 {name} files" in said
    doc = json.loads(out.read_text())
    assert doc["format"] == "zephon-records-manifest" and doc["records_format"] == name
    (entry,) = doc["files"]
    assert entry["url"] == str(Path(table["files"][0]).resolve())
    assert entry["size"] == os.path.getsize(table["files"][0]) and entry["num_records"] > 0
    if name == "parquet":
        assert sum(entry["row_groups"]) == entry["num_records"] and "texts" in entry["keys"]
    else:  # the offsets sidecar lies beside the manifest, as the tar sidecars do
        assert (tmp_path / entry["offsets"]).is_file()
        assert entry["offsets"].startswith("m.indexes/")
    want = digests(capsys, recipe_toml(tmp_path / "files.toml", [table]), "--dp", "2")
    toml = recipe_toml(tmp_path / "manifest.toml", [as_manifest(table, out)])
    assert digests(capsys, toml, "--dp", "2") == want and len(want) == 3
    if name in ("parquet", "llava"):  # the readers travel pickled to worker processes
        assert digests(capsys, toml, "--dp", "2", "--runner", "auto",
                       "--default-workers", "2") == want


def test_building_from_a_manifest_requests_no_data_file(data, tmp_path, capsys) -> None:
    """Over HTTP (Range and ETag, requests counted): indexing reads the files; building a
    reader from the manifest sends no request; the first read of a file checks it once."""
    pytest.importorskip("aiohttp")
    from zephon_vl.testing.storage_servers import http_server

    root = tmp_path / "served"
    root.mkdir()
    for name in ("parquet", "llava"):
        shutil.copy(data[name]["files"][0], root / Path(data[name]["files"][0]).name)
    with http_server(root) as server:
        for name, fmt in (("parquet", "parquet"), ("llava", "llava")):
            url = f"{server.url}/{Path(data[name]['files'][0]).name}"
            out = tmp_path / f"{name}.json"
            index([url], fmt, out, capsys)
            options = {k: v for k, v in data[name].items() if k.endswith("_folder")}
            with server.lock:
                server.requests.clear()
            reader = dataset_reader(DatasetSpec(str(out), fmt, {}, options))
            assert reader.shard_len(0) > 0
            assert server.requests == [], name
            listed = dataset_reader(DatasetSpec([url], fmt, {}, options))
            assert server.requests, "a file list stats and reads every file at build"
            with server.lock:
                server.requests.clear()
            first = reader.read(0, 0)
            assert first["__key__"] == listed.read(0, 0)["__key__"]
            assert server.requests


@pytest.mark.parametrize("name", ["parquet", "llava"])
def test_a_changed_file_is_refused_naming_it_and_the_field(name, data, tmp_path,
                                                           capsys) -> None:
    path = tmp_path / Path(data[name]["files"][0]).name
    shutil.copy(data[name]["files"][0], path)
    out = tmp_path / "m.json"
    index([str(path)], name, out, capsys)
    options = {k: v for k, v in data[name].items() if k.endswith("_folder")}
    spec = DatasetSpec(str(out), name, {}, options)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, new mtime
    reader = dataset_reader(spec)  # built from the manifest alone: nothing checked yet
    with pytest.raises(ZephonError, match=rf"{path.name} changed since it was indexed.*"
                                          r"identity was mtime_ns:"):
        reader.read(0, 0)
    path.write_bytes(path.read_bytes() + b"\n")
    with pytest.raises(ZephonError, match=rf"{path.name} changed.*size was {st.st_size}, "
                                          rf"is now {st.st_size + 1}"):
        dataset_reader(spec).read(0, 1)


def test_a_record_manifest_names_its_format_when_used_as_another(data, tmp_path,
                                                                 capsys) -> None:
    out = tmp_path / "m.json"
    index(data["parquet"]["files"], "parquet", out, capsys)
    with pytest.raises(ConfigError, match=r'record files, not of tar shards; set the '
                                          r'dataset\'s format = "parquet"'):
        dataset_reader(str(out))
    with pytest.raises(ConfigError, match=r"indexes parquet files, not llava"):
        dataset_reader(DatasetSpec(str(out), "llava"))
    capsys.readouterr()
    assert main(["index", *data["parquet"]["files"], "--format", "text", "--out",
                 str(tmp_path / "t.json")]) != 0
    assert "record manifests index llava, messages" in capsys.readouterr().err


def test_a_single_llava_json_is_still_read_as_data(data) -> None:
    """A dataset given as one ``.json`` that is no manifest is the records themselves."""
    table = data["llava"]
    spec = DatasetSpec(table["files"][0], "llava", {}, {"image_folder": table["image_folder"]})
    listed = DatasetSpec(table["files"], "llava", {}, {"image_folder": table["image_folder"]})
    assert dataset_reader(spec).shard_len(0) == dataset_reader(listed).shard_len(0) > 0


def test_record_fields_are_checked_against_the_manifest_keys(data, tmp_path, capsys) -> None:
    out = tmp_path / "m.json"
    index(data["llava"]["files"], "llava", out, capsys)
    with pytest.raises(ConfigError, match=r"do not fit format 'llava'.*needs 'dialog'"):
        dataset_reader(DatasetSpec(str(out), "llava", {"conversations": "dialog"}))


def test_refresh_reindexes_only_the_changed_record_files(data, tmp_path, capsys) -> None:
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for p in paths:
        shutil.copy(data["llava"]["files"][0], p)
    out = tmp_path / "m.json"
    index([str(p) for p in paths], "llava", out, capsys)
    records = json.loads(paths[0].read_text())
    paths[0].write_text(json.dumps(records[:7]))
    before = json.loads(out.read_text())["files"][1]
    capsys.readouterr()
    assert main(["index", "--refresh", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"re-indexed {paths[0].name}: size" in said
    assert f"num_records {len(records)} -> 7" in said
    assert "1 changed file(s) re-indexed" in said
    assert json.loads(out.read_text())["files"][1] == before
    spec = DatasetSpec(str(out), "llava", {}, {"image_folder": data["llava"]["image_folder"]})
    reader = dataset_reader(spec)
    assert reader.shard_len(0) == 7
    assert reader.read(0, 6)["__key__"] == str(records[6]["id"])
    capsys.readouterr()
    assert main(["index", "--refresh", str(out)]) == 0
    assert "0 changed file(s) re-indexed, nothing rewritten" in capsys.readouterr().out


def test_a_manifest_of_s3_files_gives_the_local_digests(data, tmp_path, capsys) -> None:
    """Parquet and a LLaVA JSON on S3 (moto on 127.0.0.1), indexed by URL: the manifest
    (its offsets sidecar local beside it) gives the digests of the local files."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from zephon_vl.testing.storage_servers import s3_server

    tables = [data["parquet"], data["llava"]]
    want = digests(capsys, recipe_toml(tmp_path / "local.toml", tables), "--dp", "2")
    with s3_server() as server:
        moved = []
        for k, table in enumerate(tables):
            urls = server.upload(f"zephon-records-{k}", table["files"])
            out = tmp_path / f"m{k}.json"
            index(urls, table["format"], out, capsys)
            assert json.loads(out.read_text())["files"][0]["identity"].startswith("etag:")
            moved.append(as_manifest(table, out))
        got = digests(capsys, recipe_toml(tmp_path / "remote.toml", moved), "--dp", "2")
    assert got == want and len(want) == 3
