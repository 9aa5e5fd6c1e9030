"""Random access into WebDataset shards matches WebDataset's own reader and fails per sample."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import multiprocessing as mp
import os
import pickle
import tarfile
from pathlib import Path

import pytest
from webdataset.tariterators import group_by_keys, tar_file_iterator

from zephon_core import BadSampleError, ZephonError
from zephon_vl import WebDatasetReader, load_index, shards_from_folder, write_shards
from zephon_vl.wds import shard_index as wds_index


def wds_samples(path: Path) -> list[dict]:
    """What webdataset's sequential reader yields for one shard (raw bytes, no decoding)."""
    with open(path, "rb") as f:
        files = ({**d, "__url__": str(path)} for d in tar_file_iterator(f))
        return [{k: v for k, v in s.items() if k != "__url__"} for s in group_by_keys(files)]


def make_samples(n: int) -> list[dict]:
    out = []
    for i in range(n):
        s = {
            "__key__": f"{i:06d}",
            "txt": f"caption {i} " * (i % 7 + 1),
            "jpg": bytes([i % 251]) * (100 + 37 * i),
        }
        if i % 5 == 0:
            s["json"] = {"i": i}
        if i % 9 == 0:  # interleaved document members
            s["0.jpg"], s["1.jpg"] = b"a" * i, b"b" * (i + 600)
        out.append(s)
    return out


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    (p,) = write_shards(make_samples(40), tmp_path / "shards", samples_per_shard=40)
    return p


def all_read(r: WebDatasetReader, s: int = 0) -> list[dict]:
    return [r.read(s, i) for i in range(r.shard_len(s))]


def strip(sample: dict) -> dict:
    return {k: v for k, v in sample.items() if k != "__shard__"}


def test_round_trip_equals_webdataset(shard: Path) -> None:
    r = WebDatasetReader([shard])
    got = all_read(r)
    assert [strip(s) for s in got] == wds_samples(shard)
    assert r.shard_len(0) == 40 and got[9]["1.jpg"] == b"b" * 609
    assert {s["__shard__"] for s in got} == {shard.name}
    assert r.shard_identity(0) == {
        "name": shard.name,
        "size": shard.stat().st_size,
        "num_samples": 40,
        "sha256": hashlib.sha256(shard.read_bytes()).hexdigest(),
    }
    json.dumps(r.shard_identity(0))


def test_odd_members_follow_webdataset_rules(tmp_path: Path) -> None:
    """Directories, metadata, names without extension, upper-case extensions, keys with dirs."""
    p = tmp_path / "odd.tar"
    with tarfile.open(p, "w", format=tarfile.PAX_FORMAT) as tf:

        def add(name: str, data: bytes) -> None:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))

        d = tarfile.TarInfo("sub")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        add("__meta__", b"skip me")
        add("sub.v1/a.JPG", b"A")
        add("sub.v1/a.txt", b"caption a")
        add("README", b"no extension")
        add("b.seg.png", b"B")
        add("b.txt", b"caption b")
        add("x" * 150 + ".txt", b"long name")  # needs a pax/GNU long-name header
    r = WebDatasetReader([p])
    assert [strip(s) for s in all_read(r)] == wds_samples(p)
    assert r.key(0, 0) == "sub.v1/a" and r.read(0, 0)["jpg"] == b"A"


def test_index_is_cached_and_reused(shard: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    WebDatasetReader([shard]).shard_len(0)
    side = shard.with_name(shard.name + ".zidx.json")
    meta = json.loads(side.read_text())
    assert (meta["size"], meta["identity"]) == (
        shard.stat().st_size, f"mtime_ns:{shard.stat().st_mtime_ns}")
    assert meta["format"] == "zephon-wds-index" and len(meta["samples"]) == 40

    def no_scan(path: object) -> None:
        raise AssertionError("index should come from the cache")

    monkeypatch.setattr(wds_index, "scan_shard", no_scan)
    assert all_read(WebDatasetReader([shard]))[3]["txt"] == b"caption 3 " * 4


def test_index_rebuilt_after_shard_changes(shard: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    WebDatasetReader([shard]).shard_len(0)
    scans = []
    real = wds_index.scan_shard
    monkeypatch.setattr(wds_index, "scan_shard", lambda p: scans.append(p) or real(p))
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touch
    assert WebDatasetReader([shard]).shard_len(0) == 40 and len(scans) == 1
    # Rewritten with other content: the new samples are read, not the old offsets.
    write_shards(make_samples(25)[::-1], shard.parent, samples_per_shard=40)
    r = WebDatasetReader([shard])
    assert r.shard_len(0) == 25 and r.key(0, 0) == "000024" and len(scans) == 2
    assert [strip(s) for s in all_read(r)] == wds_samples(shard)


def test_corrupt_cache_is_rebuilt(shard: Path) -> None:
    side = shard.with_name(shard.name + ".zidx.json")
    side.write_text("{not json")
    assert WebDatasetReader([shard]).shard_len(0) == 40
    assert json.loads(side.read_text())["version"] == 2


def test_cache_dir_for_read_only_folders(shard: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    r = WebDatasetReader([shard], cache_dir=cache)
    assert r.shard_len(0) == 40
    assert not shard.with_name(shard.name + ".zidx.json").exists()
    (entry,) = cache.glob("*.zidx.json")
    assert entry.name.startswith(shard.name)


def test_truncated_shard_marks_only_the_cut_sample(shard: Path) -> None:
    idx = load_index(shard)
    ext, off, size = idx.members[-1][0]
    shard.write_bytes(shard.read_bytes()[: off + size // 2])  # cut inside the last sample
    r = WebDatasetReader([shard])
    assert r.shard_len(0) == 40
    with pytest.raises(BadSampleError) as e:
        r.read(0, 39)
    assert e.value.reason == "truncated_member" and e.value.where == f"{shard.name}:000039"
    expected = wds_samples_prefix(make_samples(39))
    assert [strip(r.read(0, i)) for i in range(39)] == expected


def wds_samples_prefix(samples: list[dict]) -> list[dict]:
    """The raw bytes write_shards stores for `samples` (str as UTF-8, dict as JSON)."""
    out = []
    for s in samples:
        d = {}
        for k, v in s.items():
            d[k] = (
                v
                if k == "__key__" or isinstance(v, bytes)
                else (v.encode() if isinstance(v, str) else json.dumps(v).encode())
            )
        out.append(d)
    return out


def test_tar_cut_inside_a_header(shard: Path) -> None:
    """A cut that loses whole members of the last sample still marks that sample."""
    idx = load_index(shard)
    _, off, _ = idx.members[-1][-1]
    shard.write_bytes(shard.read_bytes()[: off - 512 + 100])  # inside the last header
    r = WebDatasetReader([shard])
    n = r.shard_len(0)
    with pytest.raises(BadSampleError, match="truncated_member"):
        r.read(0, n - 1)
    assert r.read(0, n - 2)["__key__"] == f"{n - 2:06d}"


def test_truncated_after_indexing(shard: Path) -> None:
    r = WebDatasetReader([shard])
    r.read(0, 0)  # index loaded, file open
    _, off, _ = r.index(0).members[-1][0]
    os.truncate(shard, off + 3)
    with pytest.raises(BadSampleError) as e:
        r.read(0, 39)
    assert e.value.reason == "truncated_member"
    assert r.read(0, 38)["__key__"] == "000038"


def test_missing_and_unreadable_shards(tmp_path: Path, shard: Path) -> None:
    with pytest.raises(BadSampleError) as e:
        WebDatasetReader([tmp_path / "gone.tar"]).shard_len(0)
    assert e.value.reason == "missing_shard"

    r = WebDatasetReader([shard])
    r.shard_len(0)
    shard.unlink()
    with pytest.raises(BadSampleError) as e:
        r.read(0, 1)
    assert e.value.reason == "missing_shard" and e.value.where == f"{shard.name}:000001"

    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not a tar file" * 100)
    with pytest.raises(ZephonError, match="junk.tar"):
        WebDatasetReader([junk]).shard_len(0)
    gz = tmp_path / "z.tar.gz"
    gz.write_bytes(gzip.compress(b"\0" * 2048))
    with pytest.raises(ZephonError, match="gunzip"):
        WebDatasetReader([gz]).shard_len(0)


def _read_in_child(r: WebDatasetReader, q: mp.Queue | None = None) -> list[dict]:
    out = [r.read(0, i) for i in (0, 7, 39)]
    if q is not None:
        q.put(out)
    return out


def test_reader_is_picklable(shard: Path) -> None:
    r = WebDatasetReader([shard])
    expected = _read_in_child(r)  # file now open in this process
    r2 = pickle.loads(pickle.dumps(r))
    assert _read_in_child(r2) == expected
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:  # pickled to a worker
        assert pool.apply(_read_in_child, (r,)) == expected
    q = ctx.Queue()
    p = ctx.Process(target=_read_in_child, args=(r, q))  # inherited through fork
    p.start()
    assert q.get(timeout=30) == expected
    p.join()
    assert p.exitcode == 0


def test_many_shards_bounded_open_files(tmp_path: Path) -> None:
    shards = write_shards(make_samples(30), tmp_path, samples_per_shard=3)
    r = WebDatasetReader(shards, max_open_files=4)
    got = [r.read(s, i) for i in range(3) for s in range(r.num_shards)]
    assert r.open_shards() <= 4
    assert sorted(g["__key__"] for g in got) == [f"{i:06d}" for i in range(30)]
    with pytest.raises(IndexError):
        r.read(0, 3)


def test_write_shards_checks_and_splits(tmp_path: Path) -> None:
    assert write_shards([], tmp_path / "e") == []
    assert list((tmp_path / "e").iterdir()) == []
    with pytest.raises(ValueError, match="first dot"):
        write_shards([{"__key__": "a.b", "txt": "x"}], tmp_path / "k")
    a = write_shards(make_samples(10), tmp_path / "a", prefix="p", samples_per_shard=4)
    b = write_shards(make_samples(10), tmp_path / "b", prefix="p", samples_per_shard=4)
    assert [p.name for p in a] == ["p-000000.tar", "p-000001.tar", "p-000002.tar"]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]  # reproducible bytes


def test_shards_from_folder_pairs_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {
        "b.png": b"PNG-b",
        "b.json": b'{"caption": "bee"}',
        "a.jpg": b"JPG-a",
        "a.txt": b"an a",
        "c.webp": b"WEBP-c",  # no caption: kept image-only
        "d.txt": b"orphan caption",
        "e.v2.JPEG": b"JPG-e",
        "e.v2.txt": b"an e",
        "sub/f.jpg": b"JPG-f",
        "sub/f.txt": b"an f",
        "sub/f.json": b"{}",
    }
    for name, data in files.items():
        (src / name).write_bytes(data)
    with caplog.at_level("WARNING"):
        shards = shards_from_folder(src, tmp_path / "out", samples_per_shard=2)
    assert "1 image(s) have no" in caplog.text
    r = WebDatasetReader(shards)
    got = [strip(r.read(s, i)) for s in range(r.num_shards) for i in range(r.shard_len(s))]
    assert got == [
        {"__key__": "a", "jpg": b"JPG-a", "txt": b"an a"},
        {"__key__": "b", "png": b"PNG-b", "json": b'{"caption": "bee"}'},
        {"__key__": "c", "webp": b"WEBP-c"},
        {"__key__": "e_v2", "jpg": b"JPG-e", "txt": b"an e"},
        {"__key__": "sub/f", "jpg": b"JPG-f", "json": b"{}", "txt": b"an f"},
    ]


def test_a_zero_byte_tar_is_refused_naming_the_file(tmp_path: Path) -> None:
    """An interrupted copy used to be indexed as an empty shard without a word."""
    empty = tmp_path / "shard-000001.tar"
    empty.write_bytes(b"")
    with pytest.raises(ZephonError, match=r"shard-000001.tar: the file is empty \(0 bytes\)"):
        WebDatasetReader([empty]).shard_len(0)


def test_a_dataset_without_samples_names_its_files(tmp_path: Path) -> None:
    import tarfile

    from zephon_core import ConfigError, Execution, Loader, qwen_tokenizer_dir
    from zephon_vl import vlm_recipe

    shard = tmp_path / "nothing-000000.tar"
    with tarfile.open(shard, "w"):
        pass
    recipe = vlm_recipe({"photos": [str(shard)]}, qwen_tokenizer_dir(), num_lanes=1,
                        global_batch_size=1)
    with pytest.raises(ConfigError, match=r"dataset 0 \('photos'\) has no samples in its 1 "
                       r"shard\(s\): nothing-000000.tar"):
        Loader(recipe, 0, 1, Execution(runner="inline"))
