"""The shard-opening seam (`zephon_core.data.storage`) and lazy shard lengths."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.vl.test_wds_index import make_samples
from zephon_core.data.readers import shard_lengths
from zephon_core.data.storage import (
    LocalFile,
    base_name,
    is_remote,
    local_path,
    open_shard,
    scheme_of,
    stat_shard,
)
from zephon_core.errors import BadSampleError
from zephon_vl.wds.index import INDEX_SUFFIX, WebDatasetReader
from zephon_vl.wds.writer import write_shards


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    return write_shards(make_samples(30), tmp_path / "s", samples_per_shard=10)


def test_locations_are_classified_without_touching_the_filesystem() -> None:
    assert scheme_of("s3://bucket/a.tar") == "s3" and is_remote("s3://bucket/a.tar")
    assert is_remote("https://host/x/a.tar") and is_remote("gs://b/a.tar")
    assert not is_remote("/data/a.tar") and not is_remote("file:///data/a.tar")
    assert scheme_of("C://data/a.tar") == ""  # a Windows drive, not a URL scheme
    assert local_path("file:///data/a.tar") == Path("/data/a.tar")
    assert base_name("s3://bucket/dir/a.tar") == "a.tar"


def test_local_file_reads_at_offsets(shards: list[Path]) -> None:
    data = shards[0].read_bytes()
    f = open_shard(shards[0])
    assert isinstance(f, LocalFile)
    try:
        assert f.size == len(data) and f.read_at(700, 300) == data[700:1000]
        assert f.read_at(len(data) - 5, 100) == data[-5:]
        st = stat_shard(shards[0])
        assert (st.size, st.identity) == (f.size, f.identity)
        assert f.identity == f"mtime_ns:{shards[0].stat().st_mtime_ns}"
    finally:
        f.close()
    with pytest.raises(BadSampleError) as e:
        open_shard(shards[0].with_name("gone.tar"))
    assert e.value.reason == "missing_shard" and e.value.where == "gone.tar"


def test_file_urls_read_like_paths(shards: list[Path]) -> None:
    plain = WebDatasetReader(shards)
    urls = WebDatasetReader([f"file://{p}" for p in shards])
    assert urls.shard_lengths() == plain.shard_lengths() == [10, 10, 10]
    for s in range(3):
        for i in range(10):
            assert urls.read(s, i) == plain.read(s, i)
    assert urls.shard_identity(1) == plain.shard_identity(1)


def test_lengths_are_lazy_and_come_from_sidecars(shards: list[Path]) -> None:
    r = WebDatasetReader(shards)
    sidecars = [p.with_name(p.name + INDEX_SUFFIX) for p in shards]
    assert not any(s.exists() for s in sidecars)  # constructing indexes nothing
    assert r.shard_len(1) == 10
    assert [s.exists() for s in sidecars] == [False, True, False]
    assert shard_lengths(r) == [10, 10, 10] and all(s.exists() for s in sidecars)
    stamps = [s.stat().st_mtime_ns for s in sidecars]
    again = WebDatasetReader(shards)
    assert shard_lengths(again) == [10, 10, 10]
    assert [s.stat().st_mtime_ns for s in sidecars] == stamps  # read, not rebuilt
    assert again.open_shards() == 0  # no shard opened for reading


def test_index_command_writes_a_manifest_the_reader_uses(shards: list[Path], tmp_path: Path,
                                                         capsys) -> None:
    from zephon_vl.cli.main import main
    from zephon_vl.wds.manifest import load_manifest, reader_from_manifest

    out = tmp_path / "m" / "train.json"
    assert main(["index", *map(str, shards), "--out", str(out)]) == 0
    assert "3 shards, 30 samples" in capsys.readouterr().out
    entries = load_manifest(out)
    assert [Path(e.index).parent.name for e in entries] == ["train.indexes"] * 3
    plain = WebDatasetReader(shards)
    r = reader_from_manifest(out)
    assert r.shard_lengths() == [10, 10, 10] and r.open_shards() == 0
    assert [r.shard_identity(s) for s in range(3)] == [plain.shard_identity(s) for s in range(3)]
    assert r.read(2, 4) == plain.read(2, 4)
