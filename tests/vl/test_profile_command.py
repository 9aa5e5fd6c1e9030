"""`zephon-vl profile`: the busiest stage named, the cores split by the work each stage did."""

from __future__ import annotations

import json

from zephon_core.engine.metrics import StageMetrics
from zephon_vl.cli.main import main
from zephon_vl.cli.profile import recommend_split, workers_flags


def stage(name: str, runner: str, busy: float, workers: int = 1) -> StageMetrics:
    return StageMetrics(name, runner, workers, 1, 1, busy, min(1.0, busy))


def test_split_follows_the_work_and_keeps_one_worker_each():
    stages = [stage("shuffle", "driver", 5.0), stage("read+decode", "processes", 3.0),
              stage("tokenize", "processes", 1.0)]
    split = recommend_split(stages, 8)
    assert split == {"read+decode": 6, "tokenize": 2}  # driver stages take no workers
    assert recommend_split(stages, 1) == {"read+decode": 1, "tokenize": 1}
    assert recommend_split([stage("a", "processes", 10.0), stage("b", "threads", 0.0)], 4) \
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
