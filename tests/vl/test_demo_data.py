"""The demo dataset is real, varied and byte-for-byte reproducible."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from zephon_vl import WebDatasetReader, build_demo_dataset, default_demo_dir
from zephon_vl.demo.data import DEMO_VERSION

SMALL = {"num_samples": 40, "videos": 2, "samples_per_shard": 16}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):
    return build_demo_dataset(tmp_path_factory.mktemp("demo"), seed=3, **SMALL)


def samples(ds) -> list[dict]:
    r = WebDatasetReader(ds.shards)
    return [r.read(s, i) for s in range(r.num_shards) for i in range(r.shard_len(s))]


def kind(sample: dict) -> str:
    if "mp4" in sample:
        return "video"
    if "0.jpg" in sample:
        return "interleaved"
    return "conversation" if "json" in sample else "caption"


def test_deterministic(demo, tmp_path: Path) -> None:
    again = build_demo_dataset(tmp_path / "again", seed=3, **SMALL)
    assert again.built and [p.name for p in again.shards] == [p.name for p in demo.shards]
    assert [p.read_bytes() for p in again.shards] == [p.read_bytes() for p in demo.shards]
    other = build_demo_dataset(tmp_path / "other", seed=4, **SMALL)
    assert other.sha256 != demo.sha256


def test_reuses_a_complete_build(demo) -> None:
    man = json.loads((demo.root / "manifest.json").read_text())
    assert man["version"] == DEMO_VERSION and man["num_samples"] == 42
    reused = build_demo_dataset(demo.root, seed=3, **SMALL)
    assert not reused.built and reused.shards == demo.shards and reused.sha256 == demo.sha256


def test_incomplete_or_different_build_is_redone(demo, tmp_path: Path) -> None:
    ds = build_demo_dataset(tmp_path / "d", num_samples=12, videos=0, samples_per_shard=5)
    ds.shards[-1].write_bytes(ds.shards[-1].read_bytes()[:1000])  # damaged
    again = build_demo_dataset(tmp_path / "d", num_samples=12, videos=0, samples_per_shard=5)
    assert again.built and again.sha256 == ds.sha256
    bigger = build_demo_dataset(tmp_path / "d", num_samples=12, videos=0, samples_per_shard=12)
    assert bigger.built and sorted(p.name for p in (tmp_path / "d").glob("*.tar")) == [
        "demo-000000.tar"
    ]


def test_sample_kinds(demo) -> None:
    from PIL import Image

    got = samples(demo)
    assert len(got) == demo.num_samples == 42
    counts = {k: sum(kind(s) == k for s in got) for k in demo.counts}
    assert counts == demo.counts == {"caption": 28, "conversation": 8, "interleaved": 4, "video": 2}
    assert [s["__key__"] for s in got] == [f"{i:06d}" for i in range(42)]
    n_images = 0
    for s in got:
        for name in [k for k in s if k.endswith("jpg")]:
            img = Image.open(io.BytesIO(s[name]))
            assert img.format == "JPEG" and all(256 <= side <= 1024 for side in img.size)
            n_images += 1
        k = kind(s)
        if k == "caption":
            assert 20 <= len(s["txt"].decode().split()) <= 80
        elif k == "conversation":
            conv = json.loads(s["json"])["conversations"]
            assert [t["role"] for t in conv][:2] == ["user", "assistant"]
            assert conv[0]["content"].startswith("<image>\n")
            assert sum("<image>" in t["content"] for t in conv) == 1
        elif k == "interleaved":
            text = json.loads(s["json"])["text"]
            images = sorted(n for n in s if n.endswith(".jpg"))
            assert 2 <= len(images) <= 3 and images == [f"{i}.jpg" for i in range(len(images))]
            assert text.count(None) == len(images)
            assert all(isinstance(t, str) and t for t in text if t is not None)
    assert n_images == demo.num_images


def test_videos_decode(demo) -> None:
    import av

    videos = [s for s in samples(demo) if "mp4" in s]
    assert len(videos) == 2
    for s in videos:
        with av.open(io.BytesIO(s["mp4"])) as c:
            frames = list(c.decode(video=0))
            fps = c.streams.video[0].average_rate
        assert 8 <= fps <= 12 and 2 <= len(frames) / fps <= 3
        assert (frames[0].width, frames[0].height) == (320, 240)
        assert "frames per second" in s["txt"].decode()


def test_default_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ZEPHON_CACHE", str(tmp_path))
    assert default_demo_dir() == tmp_path / f"demo-vlm-{DEMO_VERSION}"
    monkeypatch.delenv("ZEPHON_CACHE")
    assert default_demo_dir().parent == Path.home() / ".cache" / "zephon-vl"


@pytest.mark.slow
def test_worker_processes_give_the_same_bytes(tmp_path: Path) -> None:
    kw = {"num_samples": 200, "videos": 1, "samples_per_shard": 100}
    one = build_demo_dataset(tmp_path / "one", workers=1, **kw)
    two = build_demo_dataset(tmp_path / "two", workers=2, **kw)
    assert one.sha256 == two.sha256


def test_a_smaller_demo_in_the_default_cache_leaves_other_builds_alone(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two jobs on one machine asking for different demo sizes without a folder: each gets
    its own, and neither deletes or rewrites the other's shards (a run reading one must
    never see them change underneath it)."""
    monkeypatch.setenv("ZEPHON_CACHE", str(tmp_path))
    small = build_demo_dataset(num_samples=6, videos=0, samples_per_shard=3)
    other = build_demo_dataset(num_samples=9, videos=0, samples_per_shard=3)
    assert small.root != other.root and tmp_path in small.root.parents
    assert default_demo_dir() not in (small.root, other.root)
    again = build_demo_dataset(num_samples=6, videos=0, samples_per_shard=3)
    assert not again.built and again.sha256 == small.sha256
    assert all(p.exists() for p in small.shards + other.shards)
