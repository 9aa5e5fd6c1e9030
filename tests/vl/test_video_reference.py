"""Issue 25 item 2: samples that name their video (``{"video": "clips/a.mp4"}``) instead of
carrying it; the clip is read from `VideoSettings.video_folder` (a folder or a URL).

The batches are those of the same clips carried in the tar; a missing file stops the
run naming it (an I/O error is never a drop); a path that leaves the folder is a bad
sample; no folder configured is a configuration error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.vl import demo_samples_by_kind, make_recipe, run_epoch
from zephon_core import BadSampleError, ConfigError, Execution, Loader, batch_digest
from zephon_vl import (
    DecodeVision,
    VideoSettings,
    process_video,
    read_video_reference,
    write_shards,
)
from zephon_vl.media.image import ImageSettings
from zephon_vl.media.planned import ClipReference, PlannedItem
from zephon_vl.media.video import video_location


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """The demo's video samples twice: carried in a tar, and by reference to a folder."""
    by_kind = demo_samples_by_kind(tmp_path_factory)
    samples = [{"__key__": f"vid{i}", **s} for i, s in enumerate(by_kind["video"])]
    folder = tmp_path_factory.mktemp("video_folder")
    (folder / "clips").mkdir()
    refs = []
    for s in samples:
        (folder / "clips" / f"{s['__key__']}.mp4").write_bytes(s["mp4"])
        refs.append({"__key__": s["__key__"], "txt": s["txt"],
                     "json": json.dumps({"video": f"clips/{s['__key__']}.mp4"}).encode()})
    carried = write_shards(samples, tmp_path_factory.mktemp("carried"), samples_per_shard=10)
    named = write_shards(refs, tmp_path_factory.mktemp("named"), samples_per_shard=10)
    return [str(p) for p in carried], [str(p) for p in named], folder, samples


def digests(shards: list[str], video: VideoSettings, ex: Execution | None = None,
            **kw) -> list[str]:
    recipe = make_recipe(shards, num_lanes=1, global_batch_size=1, epochs=1,
                         shuffle_buffer=0, video=video, **kw)
    ep = run_epoch(Loader(recipe, 0, 1, ex or Execution(runner="inline")))
    assert not ep.drops(), ep.drops()
    rows = [row for step in ep.step_rows for row in step] + ep.left_rows
    return [batch_digest(recipe.collate([r])) for r in rows]


def test_referenced_videos_give_the_batches_of_carried_ones(videos):
    carried, named, folder, _ = videos
    want = digests(carried, VideoSettings())
    assert want
    assert digests(named, VideoSettings(video_folder=str(folder))) == want
    procs = Execution(runner="processes", default_workers=2, group_size=1)
    assert digests(named, VideoSettings(video_folder=str(folder)), procs) == want


def test_planned_referenced_clips_decode_after_the_packer_to_the_same_batches(videos, tmp_path):
    """A named clip is planned from its index read by range: an open bin holds its name,
    not its pixels; the row decode opens it again and makes the same batches."""
    carried, named, folder, _ = videos
    want = digests(carried, VideoSettings())
    after = {"decode_after_pack": True}
    vs = VideoSettings(video_folder=str(folder))
    assert digests(named, vs, pack=after) == want
    procs = Execution(runner="processes", default_workers=2, group_size=1)
    assert digests(named, vs, procs, pack=after) == want
    moved = tmp_path / "moved"  # gone between the plan and the row decode: an I/O error
    recipe = make_recipe(named, num_lanes=1, global_batch_size=1, epochs=1, shuffle_buffer=0,
                         video=VideoSettings(video_folder=str(moved)), pack=after)
    (moved / "clips").mkdir(parents=True)
    for clip in (folder / "clips").iterdir():
        (moved / "clips" / clip.name).write_bytes(clip.read_bytes())
    loader = Loader(recipe, 0, 1, Execution(runner="inline"))
    tokenize = next(op for op in recipe.ops if op.name.startswith("tokenize"))
    real = tokenize.process_many

    def plan_then_remove(elements):  # the clips leave once their samples are planned
        out = real(elements)
        for clip in (moved / "clips").iterdir():
            clip.unlink()
        return out

    tokenize.process_many = plan_then_remove
    with pytest.raises(RuntimeError) as info:
        next(iter(loader))
    loader.close()
    assert isinstance(info.value.__cause__, FileNotFoundError), repr(info.value.__cause__)
    assert "clips/vid" in str(info.value)


def test_a_planned_clip_reference_is_a_name_with_the_decoded_grid(videos):
    _, _, folder, samples = videos
    vs = VideoSettings(video_folder=str(folder), max_frames=4)
    sample = {"__key__": "k", "__shard__": "s.tar", "txt": b"a clip",
              "json": json.dumps({"video": "clips/vid0.mp4"}).encode()}
    planned = DecodeVision(video=vs, plan=True).decode(sample)["vision"][0]
    assert isinstance(planned, PlannedItem) and isinstance(planned.data, ClipReference)
    want = process_video(samples[0]["mp4"], ImageSettings(), vs)
    assert planned.geometry.grid_thw == tuple(int(x) for x in want.grid_thw)
    assert (planned.decode().pixel_values == want.pixel_values).all()
    assert planned.with_bytes() is planned  # it travels as its name
    assert "clips/vid0.mp4" in repr(planned) and len(repr(planned)) < 300


def test_a_missing_video_stops_the_run_naming_it_even_under_drop(videos, tmp_path):
    _, named, folder, _ = videos
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    with pytest.raises(RuntimeError) as info:  # the lane's wrapper around the cause
        digests(named, VideoSettings(video_folder=str(empty)), on_error="drop")
    assert isinstance(info.value.__cause__, FileNotFoundError), repr(info.value.__cause__)
    msg = str(info.value)
    assert "clips/vid" in msg and str(empty) in msg and "video_folder" in msg, msg


def test_decode_vision_reads_the_named_clip(videos):
    _, _, folder, samples = videos
    vs = VideoSettings(video_folder=str(folder), max_frames=4)
    op = DecodeVision(video=vs)
    sample = {"__key__": "k", "__shard__": "s.tar", "txt": b"a clip",
              "json": json.dumps({"video": "clips/vid0.mp4"}).encode()}
    doc = op.decode(sample)
    want = process_video(samples[0]["mp4"], ImageSettings(), vs)
    assert doc["kind"] == "caption" and doc["video"] == [True]
    assert (doc["vision"][0].pixel_values == want.pixel_values).all()
    conv = {"__key__": "k", "__shard__": "s.tar", "json": json.dumps({
        "video": "clips/vid0.mp4", "conversations": [
            {"role": "user", "content": "<image>\nWhat happens?"},
            {"role": "assistant", "content": "A square moves."}]}).encode()}
    doc = op.decode(conv)
    assert doc["kind"] == "conversation" and doc["video"] == [True]
    assert read_video_reference("clips/vid0.mp4", str(folder)) == samples[0]["mp4"]


@pytest.mark.parametrize("ref", ["../outside.mp4", "/etc/passwd", "s3://bucket/x.mp4",
                                 "clips/../../x.mp4", "", 3, None, "C:/x.mp4"])
def test_a_reference_that_leaves_the_folder_is_a_bad_sample(ref, tmp_path):
    with pytest.raises(BadSampleError) as info:
        video_location(ref, str(tmp_path), "s.tar:k")
    assert info.value.reason == "bad_video_ref"


def test_no_folder_is_a_configuration_error():
    with pytest.raises(ConfigError, match="video_folder"):
        video_location("clips/a.mp4", None, "s.tar:k")
    with pytest.raises(ConfigError, match="video_folder"):
        VideoSettings(video_folder="")


def test_the_folder_is_in_the_fingerprint_only_when_set():
    assert "video_folder" not in VideoSettings().settings()
    assert VideoSettings(video_folder="s3://b/v").settings()["video_folder"] == "s3://b/v"
    assert video_location("clips/a.mp4", "s3://b/videos/") == "s3://b/videos/clips/a.mp4"
    assert video_location("clips/a.mp4", "/data/v") == str(Path("/data/v") / "clips/a.mp4")


def test_a_video_folder_on_s3_gives_the_same_batches(videos, tmp_path):
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    from zephon_vl.testing.storage_servers import s3_server

    carried, _, folder, samples = videos
    want = digests(carried, VideoSettings())
    with s3_server() as s3:
        urls = s3.upload("videos", [str(folder / "clips" / f"{s['__key__']}.mp4")
                                    for s in samples])
        refs = [{"__key__": s["__key__"], "txt": s["txt"],
                 "json": json.dumps({"video": Path(u).name}).encode()}
                for s, u in zip(samples, urls, strict=True)]
        named = write_shards(refs, tmp_path / "named", samples_per_shard=10)
        got = digests([str(p) for p in named], VideoSettings(video_folder="s3://videos/data"))
        with pytest.raises(RuntimeError, match="s3://videos/nowhere/vid0.mp4"):
            digests([str(p) for p in named], VideoSettings(video_folder="s3://videos/nowhere"))
    assert got == want


def test_a_planned_clip_opens_its_container_once_to_plan_and_once_to_decode(videos,
                                                                             monkeypatch):
    """The plan reads the clip's index and frame size in one open, and the decode seeks with
    the index the plan read (each read cost ~2-7 ms of a ~100 ms decode, paid twice)."""
    import av

    _, _, folder, samples = videos
    vs = VideoSettings(video_folder=str(folder), max_frames=4)
    want = process_video(samples[0]["mp4"], ImageSettings(), vs)
    opened = []
    real_open = av.open
    monkeypatch.setattr(av, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    for data in ({"mp4": samples[0]["mp4"], "txt": b"a clip"},
                 {"txt": b"a clip", "json": json.dumps({"video": "clips/vid0.mp4"}).encode()}):
        opened.clear()
        planned = DecodeVision(video=vs, plan=True).decode(
            {"__key__": "k", "__shard__": "s.tar", **data})["vision"][0]
        assert isinstance(planned, PlannedItem)
        assert len(opened) == 1, "the plan opened the clip more than once"
        pixels = planned.decode().pixel_values
        assert len(opened) == 2, "the decode read the index again"
        assert (pixels == want.pixel_values).all()
