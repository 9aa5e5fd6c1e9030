"""A two-phase TOML recipe through `zephon-vl digest`, `verify --mixture` and `inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zephon_core.engine.ledger import read_ledger
from zephon_core.recipes.assets import text_corpus
from zephon_vl.cli.main import main

START = 3
RECIPE = """kind = "text"
seq_len = 256
global_batch_size = 8
num_lanes = 4
shuffle_buffer = 8
min_tokens = 8
phase_lag = 4
[[datasets]]
name = "a"
files = {a}
[[datasets]]
name = "b"
files = {b}
[[phases]]
start_step = 0
weights = {{ a = 1.0 }}
[[phases]]
start_step = {start}
weights = {{ b = 1.0 }}
"""


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    shards = [str(p) for p in text_corpus()]
    path = tmp_path_factory.mktemp("phases") / "two.toml"
    path.write_text(RECIPE.format(a=json.dumps(shards[:3]), b=json.dumps(shards[3:]),
                                  start=START))
    return path


def _digests(capsys, *args: str) -> list[tuple[str, str]]:
    assert main(["digest", *args]) == 0
    return [(r["phase"], r["sha256"]) for r in map(json.loads, capsys.readouterr().out.split("\n")
                                                  [:-1])]


@pytest.mark.heavy(reason="about 30 s on 2 quiet cores: 12 steps at D = 1, 2, 4 and a resume; "
                   "tests/core phase tests check the gate itself")
def test_two_phases_same_digests_at_every_D_and_across_a_resume(recipe: Path, tmp_path: Path,
                                                                 capsys) -> None:
    steps = 12
    runs = {D: _digests(capsys, "--recipe", str(recipe), "--dp", str(D), "--steps", str(steps))
            for D in (1, 2, 4)}
    assert runs[1] == runs[2] == runs[4]
    ledger, state = tmp_path / "l.jsonl", tmp_path / "s.json"
    out = _digests(capsys, "--recipe", str(recipe), "--dp", "2", "--steps", str(steps),
                   "--save-at", str(START - 1), "--resume-dp", "4", "--ledger", str(ledger),
                   "--state-out", str(state))
    assert out[:steps] == runs[1]
    assert [d for _, d in out[steps:]] == [d for _, d in runs[1][START - 1:]]

    # the ledger: before the boundary, only phase 0 draws of `a`; later only `b`
    steps_seen = read_ledger(ledger).steps
    mix = [steps_seen[t]["mixture"] for t in range(steps)]
    # every dataset of the recipe is listed, 0 for one the step holds none of
    assert all(m["phases"] == [0] and m["tokens"]["0"] > 0 == m["tokens"]["1"] == m["samples"]["1"]
               for m in mix[:START])
    assert mix[-1]["phases"] == [1] and mix[-1]["tokens"]["0"] == 0 < mix[-1]["tokens"]["1"]
    assert main(["verify", str(ledger), "--mixture"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("step  phase  drawn in  rows")
    assert table[1].split()[:4] == ["0", "0", "0", "8"] and table[1].split()[4] == "1.000/1.000"
    assert table[-1].split()[1:3] == ["1", "1"] and table[-1].split()[-1] == "1.000/1.000"

    assert main(["inspect", str(state)]) == 0
    text = capsys.readouterr().out
    assert "mixture schedule (phase_lag 4): from step 0: weights {'a': 1.0}; from step 3" in text
    assert "phase 0 (began at draws [])" in text


@pytest.mark.heavy  # 45 s on 2 cores; tests/core/test_batch_sizes.py's property test runs in CI
def test_a_resume_that_asks_for_another_global_batch_size(recipe: Path, tmp_path: Path,
                                                          capsys) -> None:
    """Same lane rows, other step boundaries: G=8 for steps 0..1, then 16 (two steps of
    the G=8 run per step); without the flag the resume keeps G."""
    steps = 6
    ledger = tmp_path / "g.jsonl"
    out = _digests(capsys, "--recipe", str(recipe), "--dp", "2", "--steps", str(steps),
                   "--save-at", "2", "--resume-dp", "4", "--resume-global-batch-size", "16",
                   "--ledger", str(ledger))
    assert main(["digest", "--recipe", str(recipe), "--dp", "2", "--steps", "4", "--save-at",
                 "2", "--resume-dp", "1", "--resume-global-batch-size", "16"]) == 0
    rows = [json.loads(line)["rows"] for line in capsys.readouterr().out.split("\n")[:-1]]
    assert rows == [8, 8, 8, 8, 16, 16]
    resumed = read_ledger(tmp_path / "g.resumed-d4.jsonl")
    run = read_ledger(ledger)
    assert [len(resumed.steps[t]["rows"]) for t in range(2, steps)] == [16] * 4
    # lane 0's rows of resumed step 2 are its rows of steps 2 and 3 at G=8
    lane0 = [r["samples"] for r in resumed.steps[2]["rows"] if r["lane"] == 0]
    assert lane0 == [r["samples"] for t in (2, 3) for r in run.steps[t]["rows"]
                     if r["lane"] == 0]
    assert len(out) == steps + steps - 2


@pytest.mark.parametrize("mix_by", ["samples", "tokens"])
def test_inspect_shows_the_realized_shares(mix_by: str, tmp_path: Path, capsys) -> None:
    """Per dataset, over all lanes: the samples drawn, those drawn in each lane's current
    phase and, with mix_by = "tokens", the settled tokens the deficit rule counts."""
    from tests.helpers.core import DataSpec, Spec, World
    from zephon_core import Phase, save_state

    spec = Spec(datasets=(DataSpec((30, 17, 25), max_len=30, data_seed=1),
                          DataSpec((11, 9, 14), max_len=20, data_seed=2, weight=0.5)),
                num_lanes=2, rows_per_lane=2, mix_by=mix_by, phase_lag=2,
                phases=(Phase(2, {"ds0": 1.0, "ds1": 1.0}),))
    with World(spec, 1) as w:
        for _ in range(6):
            w.step()
        state = w.state()
    save_state(state, tmp_path / "s.json")
    lanes = state["lanes"].values()
    drawn = [sum(s["source"]["counts"][j] for s in lanes) for j in range(2)]
    phase = [sum(s["source"]["phase_counts"][j] for s in lanes) for j in range(2)]
    assert main(["inspect", str(tmp_path / "s.json")]) == 0
    text = capsys.readouterr().out

    def share(counts: list[int]) -> str:
        return ", ".join(f"ds{j} {c} ({c / sum(counts):.1%})" for j, c in enumerate(counts))

    assert f"samples drawn per dataset (all lanes, from step 0): {share(drawn)}" in text
    assert f"samples drawn in each lane's current phase: {share(phase)}" in text
    if mix_by == "tokens":
        tokens = [sum(s["phase_gate"]["settled_tokens"][j] for s in lanes) for j in range(2)]
        assert sum(tokens) > 0
        assert f"tokens settled in each lane's current phase (mix_by tokens): {share(tokens)}" \
            in text
    else:
        assert "tokens settled" not in text
    assert main(["inspect", str(tmp_path / "s.json"), "--json"]) == 0
    realized = json.loads(capsys.readouterr().out)["realized"]
    assert realized["samples"] == drawn and realized["phase_samples"] == phase
