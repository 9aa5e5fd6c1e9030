"""The benchmark's workloads: their data (deterministic, cached, sizes and lengths as
specified), the busy neighbour, and how their results are summarized (no timed run)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("psutil")

from zephon_bench import measure, media_data, report
from zephon_bench.neighbour import Neighbour
from zephon_bench.vlm_bench import METRICS, check_tallies, summarize
from zephon_bench.workloads import parse_workloads


def test_fullsize_photos_are_1_to_12_megapixels_at_common_aspects() -> None:
    dims = [media_data.fullsize_dims(0, i) for i in range(3000)]
    mp = np.array([w * h / 1e6 for _, w, h, _ in dims])
    assert mp.min() >= 0.99 and mp.max() <= 12.01
    assert mp.min() < 1.2 and mp.max() > 10.5  # the whole range is drawn
    assert abs(np.median(np.log(mp)) - np.log(np.sqrt(12))) < 0.1  # log-uniform
    ratios = {round(a / b, 3) for a, b in media_data.ASPECTS}
    assert {round(w / h, 2) for _, w, h, _ in dims} <= {round(r, 2) for r in ratios}
    assert {name for name, *_ in dims} == set(media_data.PHOTOS)
    assert media_data.fullsize_dims(0, 7) == media_data.fullsize_dims(0, 7)
    assert media_data.fullsize_dims(0, 7) != media_data.fullsize_dims(1, 7)


def _quantization_q90() -> dict:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buf, "JPEG", quality=90)
    return Image.open(io.BytesIO(buf.getvalue())).quantization


def test_fullsize_build_is_deterministic_cached_and_jpeg_q90(tmp_path: Path) -> None:
    from PIL import Image

    from zephon_vl import WebDatasetReader

    a = media_data.build_fullsize_photos(tmp_path / "a", num_samples=3, samples_per_shard=2)
    b = media_data.build_fullsize_photos(tmp_path / "b", num_samples=3, samples_per_shard=2)
    assert a.built and b.built and a.sha256 == b.sha256 and len(a.shards) == 2
    mtimes = {p: p.stat().st_mtime_ns for p in a.shards}
    again = media_data.build_fullsize_photos(tmp_path / "a", num_samples=3,
                                             samples_per_shard=2)
    assert not again.built and again.shards == a.shards and again.sha256 == a.sha256
    assert {p: p.stat().st_mtime_ns for p in a.shards} == mtimes  # reused, not rewritten
    reader = WebDatasetReader([str(p) for p in a.shards])
    q90 = _quantization_q90()
    for i in range(3):
        sample = reader.read(i // 2, i % 2)
        img = Image.open(io.BytesIO(sample["jpg"]))
        _, w, h, _ = media_data.fullsize_dims(0, i)
        assert img.format == "JPEG" and img.size == (w, h) and img.mode == "RGB"
        assert img.quantization == q90
        assert f"{w} by {h} pixels" in sample["txt"].decode()
    # a changed parameter is another build, in another folder of the cache
    assert media_data._folder({"kind": "fullsize", "num_samples": 3}) != \
        media_data._folder({"kind": "fullsize", "num_samples": 4})


def test_clip_lengths_span_10_seconds_to_5_minutes() -> None:
    assert min(media_data.CLIP_SECONDS) == 10 and max(media_data.CLIP_SECONDS) == 300
    picks = {media_data.clip_of(0, i, media_data.CLIP_SECONDS) for i in range(500)}
    assert picks == set(media_data.CLIP_SECONDS)


def test_video_build_is_deterministic_cached_and_of_the_given_lengths(tmp_path: Path) -> None:
    import av

    from zephon_vl import WebDatasetReader

    def build(name: str) -> media_data.MediaData:
        return media_data.build_video_clips(tmp_path / name, num_samples=5, lengths=(1, 2),
                                            samples_per_shard=3, clips_dir=tmp_path / f"c{name}")

    a, b = build("a"), build("b")
    assert a.built and a.sha256 == b.sha256 and a.video_folder == tmp_path / "ca"
    for s in (1, 2):
        assert (tmp_path / "ca" / media_data.clip_name(s)).read_bytes() == \
            (tmp_path / "cb" / media_data.clip_name(s)).read_bytes()
    clip = tmp_path / "ca" / media_data.clip_name(2)
    mtime = clip.stat().st_mtime_ns
    again = build("a")
    assert not again.built and clip.stat().st_mtime_ns == mtime  # samples and clips reused
    for s in (1, 2):
        path = a.video_folder / media_data.clip_name(s)
        head = path.read_bytes()[:4096]
        assert head.find(b"moov") != -1  # the index at the front: read by range
        with av.open(str(path)) as c:
            st = c.streams.video[0]
            keys = [p.is_keyframe for p in c.demux(st) if p.size]
            assert (st.width, st.height) == (media_data.CLIP_W, media_data.CLIP_H)
        assert len(keys) == s * media_data.CLIP_FPS
        assert [i for i, k in enumerate(keys) if k] == \
            list(range(0, len(keys), media_data.CLIP_GOP))
    reader = WebDatasetReader([str(p) for p in a.shards])
    refs = [json.loads(reader.read(i // 3, i % 3)["json"])["video"] for i in range(5)]
    assert refs == [media_data.clip_name(int(s)) for s in a.sizes]
    assert all((a.video_folder / r).is_file() for r in refs)


def test_video_workload_keeps_16_frames_of_a_referenced_clip(tmp_path: Path) -> None:
    """The workload's settings go through the recipe every loader runs: a referenced
    clip is read and its frames kept."""
    from zephon_bench.workload import Work, WorkSpec

    from zephon_core import qwen_tokenizer_dir

    d = media_data.build_video_clips(tmp_path / "s", num_samples=2, lengths=(10,),
                                     samples_per_shard=2, clips_dir=tmp_path / "c")
    spec = WorkSpec(tuple(str(p) for p in d.shards), str(qwen_tokenizer_dir()),
                    seq_len=4096, batch_rows=2, num_lanes=1, shuffle_buffer=1,
                    video_max_pixels=128 * 28 * 28, video_folder=str(d.video_folder))
    work = Work.build(spec)
    work.fn.setup()
    _, doc = work.process(0, work.pointers[0])
    grid = np.asarray(doc["grid_thw"]) if "grid_thw" in doc else None
    assert grid is not None and int(grid[0][0]) == 8  # 16 frames, 2 per temporal patch
    assert int(grid[0][1]) * int(grid[0][2]) * 14 * 14 <= 4 * 128 * 28 * 28


def test_parse_workloads() -> None:
    names = [w.name for w in parse_workloads("all")]
    assert names == ["photos", "fullsize", "video", "photos+busy", "fullsize+busy",
                     "video+busy"]
    ws = parse_workloads("video+busy,video,video")
    assert [(w.name, w.base, w.busy) for w in ws] == [("video+busy", "video", True),
                                                      ("video", "video", False)]
    with pytest.raises(SystemExit, match="unknown workload 'movies'"):
        parse_workloads("movies")


def test_neighbour_keeps_a_core_busy_and_stops() -> None:
    import psutil

    with Neighbour() as n:
        proc = psutil.Process(n.pid)
        c0, v0 = sum(proc.cpu_times()[:2]), proc.num_ctx_switches().voluntary
        time.sleep(1.5)
        used = sum(proc.cpu_times()[:2]) - c0
        waits = proc.num_ctx_switches().voluntary - v0
    # it never waits for anything (a whole core when the machine is idle; whatever the
    # scheduler gives it on a busy one)
    assert used > 0.05 and waits <= 2
    assert not n.process.is_alive()


def test_neighbour_cpu_is_not_outside_load() -> None:
    produced = [[10.0 + i, 10, 1000, 12] for i in range(11)]
    result = {"t_start": 8.0, "t_first": 11.5, "t_end": 21.0, "produced": produced,
              "events": [], "tally": {"samples": 110}, "extra": {}}

    def series(neighbour: bool) -> measure.Series:
        s = measure.Series()
        for t in (7.0, 15.0, 25.0):  # the tree 1 core, the neighbour 1 more
            s.t.append(t)
            s.tree_cpu.append(t)
            s.root_cpu.append(0.0)
            s.tree_rss.append(1e9)
            s.tree_pss.append(5e8)
            s.shm.append(0.0)
            s.machine_busy.append(2 * t)
            s.self_cpu.append(0.0)
            if neighbour:
                s.neighbour_cpu.append(t)
        return s

    assert measure.metrics(result, series(False))["outside_load"] == \
        pytest.approx(1 / measure.NCPU)
    m = measure.metrics(result, series(True))
    assert m["outside_load"] == 0.0 and m["outside_load_steady"] == 0.0
    assert m["neighbour_cores"] == pytest.approx(1.0)


def test_busy_workloads_report_each_loaders_share_of_its_quiet_rate(tmp_path: Path) -> None:
    def cfg(name: str, family: str, rate: float, workload: str, cpu: float = 1.0) -> dict:
        rs = [{"disturbed": False, **{k: 1.0 for k in METRICS}, "samples_per_s": rate,
               "cpu_s_per_sample": cpu}] * 3
        return {"name": name, "family": family, "scaling": None, "mode": "e2e",
                "workload": workload, "runs": rs}

    quiet = [cfg("zephon default", "zephon", 400, "video"), cfg("grain a", "grain", 300, "video"),
             cfg("grain b", "grain", 200, "video"), cfg("raw", "limit", 500, "video", cpu=0.004)]
    busy = [cfg("zephon default", "zephon", 200, "video+busy"),
            cfg("grain a", "grain", 210, "video+busy"),
            cfg("grain b", "grain", 190, "video+busy"),
            cfg("raw", "limit", 250, "video+busy", cpu=0.0039)]
    rep = {"settings": {"workload": "video"}, "scaling": {}, "configs": [],
           "e2e_configs": quiet, "workloads": {
               "video": {"busy_neighbour": False, "settings": {"samples": 9},
                         "e2e_configs": quiet},
               "video+busy": {"busy_neighbour": True, "settings": {"samples": 9},
                              "e2e_configs": busy}}}
    out = summarize(rep)
    e = out["workloads"]["video+busy"]["e2e"]
    # Grain's share is that of its quiet best (grain a), not of its best under load
    assert e["share_of_quiet"] == {"zephon": pytest.approx(0.5), "grain": pytest.approx(0.7),
                                   "limit": pytest.approx(0.5)}
    assert e["zephon_share_over_grain_share"] == pytest.approx(0.5 / 0.7)
    # keeping Grain's share (0.7 of 400) on the one core zephon got: 1 / 280 s a sample,
    # against the raw limit's 3.9 ms under the same load
    assert e["cpu_per_sample_for_grain_share"] == pytest.approx(1 / 280)
    assert e["limit_cpu_per_sample"] == pytest.approx(0.0039)
    # quiet: zephon on its one core at the raw limit's 4 ms a sample, 250/s, over Grain's 300
    assert out["workloads"]["video"]["e2e"]["ceiling_vs_grain"] == pytest.approx(250 / 300)
    assert out["workloads"]["video"]["e2e"]["ratio_vs_grain"] == pytest.approx(400 / 300)
    rows = report.workload_table(out)
    assert len(rows) == 4 and rows[3].startswith("| video+busy | 9 | 200.0 (0.50) |")
    assert "| 210.0 (0.70) |" in rows[3]
    out.update(date="2025-01-01T00:00:00+00:00", machine={"nproc": 2})
    report.workloads_chart(out, tmp_path / "w.png")
    assert (tmp_path / "w.png").read_bytes()[:4] == b"\x89PNG"


def test_tallies_are_compared_within_a_workload_busy_or_not() -> None:
    def run(samples: int) -> dict:
        return {"rep": 0, "tally": {"samples": samples, "tokens": 1, "images": 1, "dropped": 0,
                                    "checksum": "x", "patches": 1, "pixel_sum": 1}}

    ok = {"e2e: a": [run(5)], "e2e: b": [run(5)], "video e2e: a": [run(7)],
          "video+busy e2e: a": [run(7)]}
    assert check_tallies(ok) == []
    bad = {**ok, "video+busy e2e: b": [run(8)]}
    assert len(check_tallies(bad)) == 1 and "video+busy e2e: b" in check_tallies(bad)[0]
