"""`zephon-vl profile`: the busiest stage named, the cores split by the work each stage did."""

from __future__ import annotations

import json

from zephon_core.engine.metrics import StageMetrics
from zephon_vl.cli.main import main
from zephon_vl.cli.profile import profile_figure, recommend_split, workers_flags


def stage(name: str, runner: str, busy: float, workers: int = 1) -> StageMetrics:
    return StageMetrics(name, runner, workers, 1, 1, busy, min(1.0, busy))


def test_split_follows_the_work_and_keeps_one_worker_each():
    stages = [stage("shuffle", "driver", 5.0), stage("read+decode", "processes", 3.0),
              stage("tokenize", "processes", 1.0)]
    split = recommend_split(stages, 8)
    assert split == {"read+decode": 6, "tokenize": 2}  # driver stages take no workers
    assert recommend_split(stages, 1) == {"read+decode": 1, "tokenize": 1}
    # a thread stage beside process stages runs in the loader's process: it keeps its
    # threads, and the cores go to the pool
    assert recommend_split([stage("a", "processes", 10.0), stage("b", "threads", 0.0, 2)],
                           4) == {"a": 4, "b": 2}
    # thread stages alone share the cores
    assert recommend_split([stage("a", "threads", 3.0), stage("b", "threads", 1.0)], 4) \
        == {"a": 3, "b": 1}
    assert workers_flags({"read+decode": 6}) == "--workers read=6 --workers decode=6"


def test_profile_names_the_bottleneck_and_writes_json(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["profile", "--recipe", "text-demo", "--steps", "2", "--warmup", "1",
                 "--runner", "threads", "--default-workers", "2", "--cores", "4",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    got = json.loads(out.read_text())
    names = [s["name"] for s in got["metrics"]["stages"]]
    assert got["bottleneck"] in names
    busiest = max(got["metrics"]["stages"], key=lambda s: s["utilisation"])
    assert got["bottleneck"] == busiest["name"]
    assert f"bottleneck: {got['bottleneck']!r}" in printed
    assert sum(got["recommended_workers"].values()) == 4
    assert got["metrics"]["steps"] == 2


def test_profile_with_workers_auto_stays_within_the_budget(tmp_path):
    out = tmp_path / "p.json"
    assert main(["profile", "--recipe", "text-demo", "--steps", "2", "--warmup", "1",
                 "--workers", "auto", "--default-workers", "2", "--json", str(out)]) == 0
    stages = json.loads(out.read_text())["metrics"]["stages"]
    pooled = [s["workers"] for s in stages if s["runner"] == "processes"]
    assert pooled and sum(pooled) <= max(2, len(pooled)) and min(pooled) >= 1


def check_report(got: dict, printed: str, cores: int) -> None:
    """The bottleneck is a stage of the recipe, the split spends the core budget, every
    stage has CPU per sample (per operator too), the driver its share, the slowest step
    its groups."""
    names = [s["name"] for s in got["stages"]]
    assert got["bottleneck"] in names
    assert f"bottleneck: {got['bottleneck']!r}" in printed
    pooled = {s["name"] for s in got["stages"] if s["runner"] == "processes"}
    split = got["recommended_workers"]
    assert sum(n for name, n in split.items() if name in pooled or not pooled) == cores
    for s in got["stages"]:
        assert s["cpu_ms_per_sample"] >= 0 and s["cpu_clock"]
        assert abs(sum(s["operators"].values()) - s["cpu_ms_per_sample"]) < 1e-6
    work = [s for s in got["stages"] if s["runner"] in ("threads", "processes")]
    assert work and all(s["cpu_s"] > 0 for s in work)  # the workers measured themselves
    assert all(set(s["operators"]) == set(s["name"].split("+")) for s in work)
    d = got["driver"]
    assert d["samples"] == got["metrics"]["samples"] > 0
    assert d["cpu_s"] > 0 and 0 < d["share"] < 1
    assert d["cpu_ms_per_sample"] == 1000 * d["cpu_s"] / d["samples"]
    assert "driver: " in printed and "ms CPU per delivered sample" in printed
    step = got["slowest_step"]
    assert step["spans"] and step["seconds"] > 0
    assert all(0 <= sp["start"] <= sp["end"] <= step["seconds"] for sp in step["spans"])
    assert {sp["name"] for sp in step["spans"]} <= set(names)


def test_profile_vlm_demo_reports_cpu_per_sample_the_driver_and_the_slowest_step(
        tmp_path, capsys):
    out, png = tmp_path / "p.json", tmp_path / "p.png"
    assert main(["profile", "--recipe", "vlm-demo", "--steps", "2", "--warmup", "1",
                 "--default-workers", "2", "--cores", "3", "--json", str(out),
                 "--png", str(png)]) == 0
    got = json.loads(out.read_text())
    check_report(got, capsys.readouterr().out, 3)
    # the decode after the packer in the process pool; the planning in a driver thread
    decode = next(s for s in got["stages"] if "decode_rows" in s["operators"])
    assert decode["runner"] == "processes" and decode["cpu_clock"] == "process"
    planning = next(s for s in got["stages"] if "decode" in s["operators"])
    assert planning["runner"] == "threads" and planning["cpu_clock"] == "thread"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = profile_figure(got)
    assert len(fig.axes) == 2  # the stage bars and the slowest step's timeline
    bars, timeline = fig.axes
    assert len(bars.patches) == len(got["stages"])
    assert len(timeline.collections) == len(got["slowest_step"]["spans"])


def test_profile_text_demo_on_threads_measures_thread_cpu(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["profile", "--recipe", "text-demo", "--steps", "2", "--warmup", "1",
                 "--runner", "threads", "--default-workers", "2", "--cores", "5",
                 "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    check_report(got, capsys.readouterr().out, 5)
    assert {s["cpu_clock"] for s in got["stages"] if s["runner"] == "threads"} == {"thread"}
