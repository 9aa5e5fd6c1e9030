"""Issue 34: a record's media reference stays where the recipe put it, its read is bounded,
and a bad path is a drop naming ``file:key``, never a crash, a read outside the dataset's
folders or a leak of a file's bytes into a message.

Every record format (llava, parquet, messages, obelics) gets the same hostile references;
the drops are read from the ledger of ``zephon-vl digest`` at D = 1 and D = 2 (equal).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.formats import photos, recipe_toml
from tests.helpers.vl import run_epoch
from zephon_core import (
    BadSampleError,
    ConfigError,
    Execution,
    Loader,
    load_recipe,
    qwen_tokenizer_dir,
)
from zephon_core.data.formats import DatasetSpec, dataset_reader
from zephon_vl.cli.main import main
from zephon_vl.testing.storage_servers import http_server

FORMATS = ("llava", "parquet", "messages", "obelics")
#: what a file outside the folder, or a text file inside it, holds: never in any output
SECRET = "root:x:0:0:zephon-secret-4711:/root:/bin/bash\n"
SECRET_MARKS = ("zephon-secret", SECRET.encode()[:8].hex(), "root:x:0")
#: a file above the default image bound (256 MiB), made sparse: stat'ed, never read
HUGE = (256 << 20) + 1


def write_images(folder: Path, count: int, seed: int = 0) -> None:
    """`count` real photos as ``good-0.jpg``, ``good-1.jpg``... under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for k, (_, data, _) in enumerate(photos(count, seed)):
        (folder / f"good-{k}.jpg").write_bytes(data)


def _tree(root: Path) -> dict[str, Path]:
    """The folder a dataset names, with good photos and hostile entries, and the places
    outside it that records try to reach."""
    images = root / "data" / "images"
    write_images(images, 3)
    outside = root / "outside"
    write_images(outside, 1, seed=7)
    (outside / "good-0.jpg").rename(outside / "photo.jpg")
    (outside / "passwd").write_text(SECRET * 100)
    (outside / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 100)
    (images / "link-out.jpg").symlink_to(outside / "photo.jpg")
    (images / "text.jpg").write_text(SECRET * 100)
    (images / "sub").mkdir()
    with open(images / "huge.jpg", "wb") as f:
        f.truncate(HUGE)
    return {"images": images, "outside": outside, "good": images / "good-0.jpg"}


def _cases(paths: dict[str, Path], foreign: str) -> dict[str, tuple[str, str | None]]:
    """key -> (the image reference a record holds, the drop reason; None: kept)."""
    images, outside = paths["images"], paths["outside"]
    return {
        "good": ("good-1.jpg", None),
        "file-url-inside": (f"file://{images}/good-2.jpg", None),
        "dotdot": ("../../outside/photo.jpg", "reference_outside_folder"),
        "absolute": (str(outside / "photo.jpg"), "reference_outside_folder"),
        "file-url": (f"file://{outside}/photo.jpg", "reference_outside_folder"),
        "symlink": ("link-out.jpg", "reference_outside_folder"),
        "passwd": (str(outside / "passwd"), "reference_outside_folder"),
        "etc-passwd": ("/etc/passwd", "reference_outside_folder"),
        "foreign-url": (f"{foreign}/photo.jpg", "reference_outside_folder"),
        "text": ("text.jpg", "corrupt_image"),
        "folder": ("sub", "not_a_regular_file"),
        "huge": ("huge.jpg", "media_too_large"),
        "long-name": ("a" * 300 + ".jpg", "bad_media_path"),
        "through-file": ("good-0.jpg/y.jpg", "bad_media_path"),
        "nul": ("good-0.jpg\x00.png", "bad_media_path"),
        "data-url": ("data:text/html;base64," + "PHA+emVwaG9uLXNlY3JldDwvcD4=" * 40,
                     "unsupported_data_url"),
        "bad-data-url": ("data:image/jpeg;base64," + "/9j/4AAQSkZJRgABAQ" * 40 + "*",
                         "bad_data_url"),
    }


def _record(fmt: str, key: str, ref: str | None, video: bool = False) -> dict[str, Any]:
    """A record of `fmt` naming `ref` as its one image (or video; None: text only)."""
    if fmt == "llava":
        mark = "<video>" if video else "<image>"
        rec: dict[str, Any] = {"id": key, "conversations": [
            {"from": "human", "value": f"{mark}\nWhat is it?" if ref else "What is it?"},
            {"from": "gpt", "value": "A thing."}]}
        if ref is not None:
            rec["video" if video else "image"] = ref
        return rec
    if fmt == "messages":
        part = {"type": "video", "video": ref} if video else {"type": "image", "image": ref}
        content = ([part] if ref is not None else []) + [{"type": "text", "text": "What?"}]
        return {"id": key, "messages": [
            {"role": "user", "content": content},
            {"role": "assistant", "content": [{"type": "text", "text": "A thing."}]}]}
    if fmt == "obelics":
        return {"id": key, "texts": ["Some text.", None] if ref else ["Some text."],
                "images": [None, ref] if ref else [None]}
    assert fmt == "parquet"
    return {"id": key, "images": [{"bytes": None, "path": ref}] if ref else [],
            "texts": [{"user": "What is it?", "assistant": "A thing.", "source": "t"}]}


def write_records(folder: Path, fmt: str, records: list[dict]) -> Path:
    """`records` in `fmt`'s file kind: a JSON list (llava), JSON Lines, or Parquet."""
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        text = pa.struct([("user", pa.string()), ("assistant", pa.string()),
                          ("source", pa.string())])
        schema = pa.schema([("id", pa.string()), ("images", pa.list_(image)),
                            ("texts", pa.list_(text))])
        path = folder / "records.parquet"
        pq.write_table(pa.Table.from_pylist(records, schema=schema), path, row_group_size=4)
        return path
    if fmt == "llava":
        path = folder / "records.json"
        path.write_text(json.dumps(records, indent=1))
        return path
    path = folder / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _table(fmt: str, files: Path, **options: Any) -> dict[str, Any]:
    return {"name": fmt, "format": fmt, "files": [str(files)], **options}


def _toml(path: Path, tables: list[dict], **keys: Any) -> Path:
    return recipe_toml(path, tables, **{"tokenizer": str(qwen_tokenizer_dir()),
                                        "num_lanes": 2, "global_batch_size": 2, **keys})


def ledger_drops(tmp_path: Path, toml: Path, dp: int, capsys) -> tuple[dict, str]:
    """``key -> (reason, detail)`` of every drop in the ledger of 12 steps at `dp` ranks (at
    least 12 records a lane: the whole first epoch), and the ledger's text."""
    path = tmp_path / f"ledger-d{dp}.jsonl"
    capsys.readouterr()
    assert main(["digest", "--recipe", str(toml), "--dp", str(dp), "--steps", "12",
                 "--runner", "inline", "--ledger", str(path)]) == 0
    text = path.read_text()
    steps = [json.loads(line) for line in text.splitlines()[1:]]
    drops = {d["key"].partition(":")[2]: (d["reason"], d.get("detail", ""))
             for s in steps for d in s.get("drops", [])}
    return drops, text + capsys.readouterr().out


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """An HTTP server no recipe names: a record's URL to it must never be requested."""
    root = tmp_path_factory.mktemp("foreign")
    write_images(root, 1)
    (root / "good-0.jpg").rename(root / "photo.jpg")
    with http_server(root) as server:
        yield server


@pytest.mark.parametrize("fmt", FORMATS)
def test_references_outside_the_folder_bad_paths_and_big_files_are_drops(
        fmt, tmp_path, capsys, foreign) -> None:
    paths = _tree(tmp_path)
    cases = _cases(paths, foreign.url)
    records = [_record(fmt, key, ref) for key, (ref, _) in cases.items()]
    if fmt in ("llava", "messages"):
        records.append(_record(fmt, "video-outside", "../../outside/clip.mp4", video=True))
    files = write_records(tmp_path / "records", fmt, records)
    toml = _toml(tmp_path / "r.toml", [_table(fmt, files, image_folder=str(paths["images"]))])
    before = len(foreign.requests)
    drops, text = ledger_drops(tmp_path, toml, 1, capsys)
    want = {k: reason for k, (_, reason) in cases.items() if reason}
    if fmt in ("llava", "messages"):
        want["video-outside"] = "reference_outside_folder"
    assert {k: r for k, (r, _) in drops.items()} == want
    assert len(foreign.requests) == before, foreign.requests[before:]
    for mark in SECRET_MARKS:
        assert mark not in text
    assert "4,600 bytes of text, not a supported image format" in drops["text"][1]
    assert "allow_references" in drops["absolute"][1]
    again, _ = ledger_drops(tmp_path, toml, 2, capsys)
    assert again == drops  # decisions of the lane: the same at every D


@pytest.mark.parametrize("fmt", FORMATS)
def test_devices_and_fifos_are_never_read(fmt, tmp_path) -> None:
    """``/dev/zero`` (outside, or inside an allowed folder), a FIFO in the folder: dropped
    without a read (the old code read ``/dev/zero`` until memory ran out and blocked on the
    FIFO for ever)."""
    images = tmp_path / "images"
    write_images(images, 1)
    os.mkfifo(images / "pipe.jpg")
    cases = {"dev-zero": ("/dev/zero", "reference_outside_folder"),
             "dev-urandom": ("/dev/urandom", "reference_outside_folder"),
             "fifo": ("pipe.jpg", "not_a_regular_file")}
    records = [_record(fmt, k, ref) for k, (ref, _) in cases.items()]
    records.append(_record(fmt, "allowed-dev-zero", "/dev/zero"))
    files = write_records(tmp_path / "records", fmt, records)
    reader = dataset_reader(DatasetSpec([str(files)], fmt, {}, {
        "image_folder": str(images)}))
    for i, (key, (_, reason)) in enumerate(cases.items()):
        with pytest.raises(BadSampleError) as info:
            reader.read(0, i)
        assert (info.value.reason, info.value.where) == (reason, f"{files.name}:{key}")
    allowing = dataset_reader(DatasetSpec([str(files)], fmt, {}, {
        "image_folder": str(images), "allow_references": ["/dev"]}))
    with pytest.raises(BadSampleError) as info:
        allowing.read(0, len(cases))
    assert info.value.reason == "not_a_regular_file"
    assert "character device" in info.value.detail


def test_allow_references_opens_named_folders_and_url_prefixes(tmp_path, capsys,
                                                               foreign) -> None:
    """The recipe's explicit opt-out: a folder outside ``image_folder`` and a URL prefix
    are read (the rest stays refused)."""
    paths = _tree(tmp_path)
    outside = paths["outside"]
    records = [_record("llava", "absolute", str(outside / "photo.jpg")),
               _record("llava", "dotdot", "../../outside/photo.jpg"),
               _record("llava", "symlink", "link-out.jpg"),
               _record("llava", "url", f"{foreign.url}/photo.jpg"),
               _record("llava", "etc-passwd", "/etc/passwd")]
    files = write_records(tmp_path / "records", "llava", records)
    table = _table("llava", files, image_folder=str(paths["images"]),
                   allow_references=[str(outside), foreign.url + "/"])
    toml = _toml(tmp_path / "r.toml", [table])
    before = len(foreign.requests)
    drops, _ = ledger_drops(tmp_path, toml, 1, capsys)
    assert {k: r for k, (r, _) in drops.items()} == {"etc-passwd": "reference_outside_folder"}
    assert any("/photo.jpg" in r for r in foreign.requests[before:])
    # a relative entry is relative to the recipe file, like image_folder
    rel = tmp_path / "rel.toml"
    rel.write_text(toml.read_text().replace(json.dumps(str(outside)), '"outside"'))
    assert '"outside"' in rel.read_text()
    again, _ = ledger_drops(tmp_path, rel, 1, capsys)
    assert again == drops


def test_a_remote_folder_is_a_prefix_of_scheme_host_and_whole_path_segments(
        tmp_path, capsys, foreign) -> None:
    """A remote ``image_folder`` admits URLs under it only: not another host, not a sibling
    folder whose name starts the same, not ``..`` (plain or percent-encoded)."""
    paths = _tree(tmp_path)
    data = paths["images"].parent
    (data / "images-evil").mkdir()
    (data / "images-evil" / "x.jpg").write_bytes(paths["good"].read_bytes())
    with http_server(data) as home:
        folder = home.url + "/images"
        records = [_record("llava", "good", "good-1.jpg"),
                   _record("llava", "foreign", f"{foreign.url}/photo.jpg"),
                   _record("llava", "sibling", f"{home.url}/images-evil/x.jpg"),
                   _record("llava", "dotdot", "../images-evil/x.jpg"),
                   _record("llava", "encoded", "%2e%2e/images-evil/x.jpg"),
                   _record("llava", "local", str(paths["good"]))]
        files = write_records(tmp_path / "records", "llava", records)
        toml = _toml(tmp_path / "r.toml", [_table("llava", files, image_folder=folder)])
        before = len(foreign.requests)
        drops, _ = ledger_drops(tmp_path, toml, 1, capsys)
        assert {k: r for k, (r, _) in drops.items()} == dict.fromkeys(
            ["foreign", "sibling", "dotdot", "encoded", "local"], "reference_outside_folder")
        assert len(foreign.requests) == before
        assert home.requests and not any("evil" in r for r in home.requests)


def test_url_prefixes_compare_scheme_host_and_path_segments() -> None:
    from zephon_vl.formats.references import url_under

    assert url_under("https://a.org/x.jpg", "https://a.org/")
    assert url_under("HTTPS://A.org/img/x.jpg", "https://a.org/img")
    assert url_under("https://a.org/img/x.jpg?v=1", "https://a.org/img/")
    assert url_under("s3://bucket/img/x.jpg", "s3://bucket")
    for url in ("https://a.org.evil/x.jpg", "https://a.org@evil.org/img/x.jpg",
                "http://a.org/img/x.jpg", "https://a.org:8443/img/x.jpg",
                "https://a.org/img-evil/x.jpg", "https://a.org/img/../etc/x.jpg",
                "https://a.org/img/%2E%2E/etc/x.jpg", "https://a.org/img/a%2F..%2F../x.jpg",
                "s3://bucket-evil/img/x.jpg", "https://a.org"):
        assert not url_under(url, "https://a.org/img"), url


@pytest.mark.parametrize("fmt", ["llava", "messages", "obelics"])
def test_a_relative_reference_without_a_folder_is_refused_at_build(fmt, tmp_path) -> None:
    """The first record names a relative path and the dataset no folder: the recipe is
    refused naming the file and the option; later records doing so are drops."""
    records = [_record(fmt, "first", "photo.jpg"), _record(fmt, "second", None)]
    files = write_records(tmp_path / "records", fmt, records)
    with pytest.raises(ConfigError) as info:
        dataset_reader(DatasetSpec([str(files)], fmt))
    assert files.name in str(info.value) and "image_folder" in str(info.value)
    later = write_records(tmp_path / "later", fmt, records[::-1])
    reader = dataset_reader(DatasetSpec([str(later)], fmt))
    with pytest.raises(BadSampleError) as dropped:
        reader.read(0, 1)
    assert dropped.value.reason == "reference_without_folder"
    assert "image_folder" in dropped.value.detail


def test_a_parquet_path_without_a_folder_is_not_read_from_the_working_directory(
        tmp_path, monkeypatch) -> None:
    cwd = tmp_path / "cwd"
    write_images(cwd, 1)
    monkeypatch.chdir(cwd)
    files = write_records(tmp_path / "records", "parquet",
                          [_record("parquet", "first", "good-0.jpg")])
    reader = dataset_reader(DatasetSpec([str(files)], "parquet"))
    with pytest.raises(BadSampleError) as info:
        reader.read(0, 0)
    assert (info.value.reason, info.value.where) == ("reference_without_folder",
                                                     "records.parquet:first")


def test_the_size_bound_is_a_dataset_option(tmp_path) -> None:
    images = tmp_path / "images"
    write_images(images, 1)
    size = (images / "good-0.jpg").stat().st_size
    files = write_records(tmp_path / "records", "llava", [_record("llava", "a", "good-0.jpg")])
    small = dataset_reader(DatasetSpec([str(files)], "llava", {}, {
        "image_folder": str(images), "max_image_bytes": size - 1}))
    with pytest.raises(BadSampleError) as info:
        small.read(0, 0)
    assert info.value.reason == "media_too_large"
    assert f"{size:,} bytes, over max_image_bytes {size - 1:,}" in info.value.detail
    fits = dataset_reader(DatasetSpec([str(files)], "llava", {}, {
        "image_folder": str(images), "max_image_bytes": size}))
    assert len(fits.read(0, 0)["media"][0]["data"]) == size
    for bad in (0, -1, "1GB", True):
        with pytest.raises(ConfigError, match="max_image_bytes"):
            dataset_reader(DatasetSpec([str(files)], "llava", {}, {
                "image_folder": str(images), "max_image_bytes": bad}))
    with pytest.raises(ConfigError, match="allow_references"):
        dataset_reader(DatasetSpec([str(files)], "llava", {}, {
            "image_folder": str(images), "allow_references": "/mnt"}))


@pytest.mark.parametrize("case", ["text", "long-name", "through-file", "data-url", "symlink"])
def test_raise_names_the_record_in_one_error_without_its_bytes(case, tmp_path,
                                                               foreign) -> None:
    paths = _tree(tmp_path)
    ref, reason = _cases(paths, foreign.url)[case]
    files = write_records(tmp_path / "records", "llava",
                          [_record("llava", "good", "good-1.jpg"), _record("llava", case, ref)])
    toml = _toml(tmp_path / "r.toml", [_table("llava", files, image_folder=str(paths["images"]))],
                 on_error="raise", num_lanes=1, global_batch_size=1, epochs=1)
    with pytest.raises(BadSampleError) as info:
        run_epoch(Loader(load_recipe(str(toml)), 0, 1, Execution(runner="inline")))
    message = str(info.value)
    assert info.value.reason == reason and f"records.json:{case}" in message, message
    for mark in SECRET_MARKS:
        assert mark not in message


def test_inspect_data_reports_bad_references_as_drops(tmp_path, capsys, foreign) -> None:
    paths = _tree(tmp_path)
    cases = _cases(paths, foreign.url)
    files = write_records(tmp_path / "records", "messages",
                          [_record("messages", k, ref) for k, (ref, _) in cases.items()])
    toml = _toml(tmp_path / "r.toml",
                 [_table("messages", files, image_folder=str(paths["images"]))])
    capsys.readouterr()
    assert main(["inspect-data", "--recipe", str(toml), "--samples", str(len(cases)),
                 "--json", str(tmp_path / "report.json")]) == 0
    out = capsys.readouterr()
    (report,) = json.loads((tmp_path / "report.json").read_text())
    want: dict[str, int] = {}
    for _, reason in cases.values():
        if reason:
            want[reason] = want.get(reason, 0) + 1
    assert report["dropped"] == want
    for mark in SECRET_MARKS:
        assert mark not in out.out + out.err


def test_webdataset_videos_by_reference_stay_in_their_folder(tmp_path) -> None:
    """The same rules for a WebDataset sample's ``{"video": path}`` (docs/video.md): a
    link out of ``video_folder`` is a ``bad_video_ref`` like ``..`` already was, a FIFO is
    never opened (the old code blocked on it), a path no file can have is a drop."""
    from zephon_vl import open_video_reference

    folder = tmp_path / "clips"
    folder.mkdir()
    (tmp_path / "outside.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64)
    (folder / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64)
    (folder / "link.mp4").symlink_to(tmp_path / "outside.mp4")
    os.mkfifo(folder / "pipe.mp4")
    cases = {"link.mp4": "bad_video_ref", "a" * 300 + ".mp4": "bad_video_ref",
             "clip.mp4/x.mp4": "bad_video_ref", "pipe.mp4": "not_a_regular_file"}
    for ref, reason in cases.items():
        with pytest.raises(BadSampleError) as info:
            open_video_reference(ref, str(folder), "shard-0.tar:k")
        assert (info.value.reason, info.value.where) == (reason, "shard-0.tar:k")
    with open_video_reference("clip.mp4", str(folder), "shard-0.tar:k") as f:
        assert f.read(4) == b"\x00\x00\x00\x18"
