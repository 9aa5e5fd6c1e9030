"""`zephon-vl verify`, `inspect` and `replay` on ledgers and states written by `digest`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zephon_core.engine.ledger import LedgerWriter, read_ledger
from zephon_vl.cli.main import main

BASE = ["--recipe", "text-demo", "--lanes", "4", "--runner", "inline"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """D=2 saved after step 2 and resumed at D=4; D=1 on threads; a run with another S."""
    d = tmp_path_factory.mktemp("ledgers")
    assert main(["digest", *BASE, "--dp", "2", "--steps", "5", "--save-at", "2", "--resume-dp",
                 "4", "--ledger", str(d / "d2.jsonl"), "--state-out", str(d / "s2.json")]) == 0
    assert main(["digest", *BASE[:-1], "threads", "--dp", "1", "--steps", "4", "--ledger",
                 str(d / "d1.jsonl")]) == 0
    return d


def test_verify_agrees_across_D_runners_and_resume(runs: Path, capsys) -> None:
    assert main(["verify", str(runs / "d2.jsonl"), str(runs / "d1.jsonl")]) == 0
    assert "verified 4 common steps (steps 0..3): identical" in capsys.readouterr().out
    assert main(["verify", str(runs / "d1.jsonl"), str(runs / "d2.resumed-d4.jsonl")]) == 0
    assert "verified 2 common steps (steps 2..3)" in capsys.readouterr().out


def test_verify_names_the_first_divergence(runs: Path, tmp_path: Path, capsys) -> None:
    ledger = read_ledger(runs / "d1.jsonl")
    writer = LedgerWriter(tmp_path / "bad.jsonl", ledger.fingerprint)
    for t in sorted(ledger.steps):
        entry = json.loads(json.dumps(ledger.steps[t]))
        if t == 3:
            entry["rows"][9]["samples"][0]["digest"]["tokens"] = "0" * 16
            entry["lanes"][str(entry["rows"][9]["lane"])] = "1" * 64
            entry["digest"] = "2" * 64
        writer.write(entry)
    writer.close()
    assert main(["verify", str(runs / "d2.jsonl"), str(tmp_path / "bad.jsonl")]) == 1
    out = capsys.readouterr().out
    assert "first divergence at step 3, lane 2, row 9, sample 0: same sample dataset" in out
    assert "field(s) tokens differ" in out


def test_verify_refuses_another_recipe_and_non_ledgers(runs: Path, tmp_path: Path,
                                                        capsys) -> None:
    assert main(["digest", *BASE, "--steps", "1", "--ledger", str(tmp_path / "s.jsonl")]) == 0
    capsys.readouterr()
    (tmp_path / "s.jsonl").write_text((tmp_path / "s.jsonl").read_text().replace(
        '"seed": 0', '"seed": 7', 1))
    assert main(["verify", str(runs / "d1.jsonl"), str(tmp_path / "s.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "different recipes" in err and "seed is 0" in err and "but 7" in err
    (tmp_path / "n.txt").write_text("hello\n")
    assert main(["verify", str(runs / "d1.jsonl"), str(tmp_path / "n.txt")]) == 2
    assert "not a ledger line" in capsys.readouterr().err


def test_inspect_readable_and_json(runs: Path, capsys) -> None:
    assert main(["inspect", str(runs / "s2.json")]) == 0
    out = capsys.readouterr().out
    assert "recipe text-demo" in out and "L=4 lanes" in out and "step 2" in out
    assert main(["inspect", str(runs / "s2.json"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step"] == 2 and sorted(summary["lanes"]) == ["0", "1", "2", "3"]
    lane = summary["lanes"]["0"]
    assert lane["draws"] == sum(lane["taken"]) and lane["epoch"] == [0, 0]
    assert lane["buffered"] > 0  # the shuffle buffer holds elements


@pytest.mark.parametrize("content", ['{"a": 1}', "not json at all", '{"format": "x"}', None])
def test_inspect_refuses_what_is_not_a_zephon_state(tmp_path: Path, content, capsys) -> None:
    path = tmp_path / "state.json"
    if content is not None:
        path.write_text(content)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert "zephon-vl inspect: error:" in err and "Traceback" not in err
    assert "not a zephon state" in err or "does not exist" in err


def test_replay_verifies_and_finds_a_divergence(runs: Path, tmp_path: Path, capsys) -> None:
    state = str(runs / "s2.json")
    assert main(["replay", state, "--steps", "2", "--dp", "4", "--runner", "inline",
                 "--against", str(runs / "d1.jsonl"), "--ledger", str(tmp_path / "r.jsonl")]) == 0
    assert "verified 2 steps against" in capsys.readouterr().out
    assert sorted(read_ledger(tmp_path / "r.jsonl").steps) == [2, 3]
    assert main(["verify", str(tmp_path / "r.jsonl"), str(runs / "d2.jsonl")]) == 0
    text = (runs / "d1.jsonl").read_text().splitlines()
    line = json.loads(text[3])
    line["drops"].append({"lane": 0, "seq": 1, "dataset": 0, "shard": 0, "index": 3,
                          "epoch": 0, "reason": "too_short"})
    line["lanes"]["0"], line["digest"] = "3" * 64, "4" * 64
    (tmp_path / "bad.jsonl").write_text("\n".join([*text[:3], json.dumps(line)]) + "\n")
    assert main(["replay", state, "--steps", "2", "--runner", "inline",
                 "--against", str(tmp_path / "bad.jsonl")]) == 1
    assert "step 2, lane 0: a drop on one side only: in B" in capsys.readouterr().out


def test_elastic_demo_writes_ledgers_that_verify(tmp_path: Path, capsys) -> None:
    ledger = tmp_path / "e.jsonl"
    assert main(["elastic-demo", "--lanes", "4", "--save-dp", "2", "--resume-dp", "1,4",
                 "--steps", "4", "--save-at", "2", "--ledger", str(ledger)]) == 0
    for d in (1, 4):
        assert main(["verify", str(ledger), str(tmp_path / f"e.resumed-d{d}.jsonl")]) == 0
    assert capsys.readouterr().out.count("verified 2 common steps (steps 2..3)") == 2
