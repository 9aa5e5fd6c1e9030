"""The per-step ledger: rank-independent, resumable, and `compare` names the first divergence."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest

from zephon_core.common.digest import sample_digest
from zephon_core.engine.execution import Execution
from zephon_core.engine.ledger import (
    LedgerError,
    LedgerWriter,
    compare_ledgers,
    read_ledger,
)
from zephon_core.engine.loader import Loader
from zephon_core.engine.simulate import ElasticRun, resumed_ledger_path
from zephon_core.ops.contract import Digested, Filter, Map, StageFn
from zephon_core.recipes.registry import load_recipe
from zephon_core.records import Dropped, Element

INLINE = Execution(runner="inline")
LANES, STEPS = 4, 5


def make(**kw):
    return lambda: load_recipe("text-demo", num_lanes=LANES, **kw)


def ledger_of(path: Path, dp: int, execution: Execution = INLINE, save_at: int | None = None,
              resume_dp: list[int] | None = None, steps: int = STEPS, **kw) -> list:
    with ElasticRun(make(**kw), execution, path) as run:
        return list(run.run(dp, steps, save_at, resume_dp))


def step_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if '"zephon_ledger"' not in line]


def test_ledger_is_the_same_across_D_runners_and_resumes(tmp_path: Path) -> None:
    recs = ledger_of(tmp_path / "d2.jsonl", 2, save_at=2, resume_dp=[1, 4])
    ledger_of(tmp_path / "d1.jsonl", 1, Execution(runner="threads", default_workers=2))
    assert step_lines(tmp_path / "d2.jsonl") == step_lines(tmp_path / "d1.jsonl")
    ref = read_ledger(tmp_path / "d1.jsonl")
    assert sorted(ref.steps) == list(range(STEPS))
    for d2 in (1, 4):
        resumed = read_ledger(resumed_ledger_path(tmp_path / "d2.jsonl", d2))
        assert sorted(resumed.steps) == list(range(2, STEPS))
        result = compare_ledgers(ref, resumed)
        assert result.ok and result.common == list(range(2, STEPS))
    # every row of a step line is a row of the batch, every sample carries its digest
    entry = ref.steps[0]
    assert len(entry["rows"]) == recs[0].rows
    assert sum(s["span"][1] - s["span"][0] for r in entry["rows"] for s in r["samples"]) \
        == recs[0].tokens
    assert all(set(s["digest"]) == {"tokens"} for r in entry["rows"] for s in r["samples"])
    assert list(entry["lanes"]) == [str(lane) for lane in range(LANES)]


def test_worker_digests_match_the_inline_ones(tmp_path: Path) -> None:
    """Digests made in worker processes (the stage call) equal those of the inline runner."""
    ex = Execution(runner="processes", default_workers=1)
    ledger_of(tmp_path / "p.jsonl", 2, ex, steps=2)
    ledger_of(tmp_path / "i.jsonl", 1, steps=2)
    assert step_lines(tmp_path / "p.jsonl") == step_lines(tmp_path / "i.jsonl")


def test_stage_fn_hashes_what_it_makes() -> None:
    fn = StageFn([Map(lambda p: {"tokens": [p, p]}, name="twice"),
                  Filter(lambda p: p["tokens"][0] != 2, name="no_two")], digests=True)
    out = fn([Element(0, 1), Element(0, 2)])
    assert out[0] == Digested({"tokens": [1, 1]}, sample_digest({"tokens": [1, 1]}))
    assert isinstance(out[1], Dropped)
    assert StageFn(fn.transforms)([Element(0, 1)]) == [{"tokens": [1, 1]}]


def test_ledger_changes_no_batch(tmp_path: Path) -> None:
    with_ledger = [r.sha256 for r in ledger_of(tmp_path / "a.jsonl", 2, steps=3)]
    with ElasticRun(make(), INLINE) as run:
        assert [r.sha256 for r in run.run(2, 3)] == with_ledger


def test_loader_resume_supersedes_the_crashed_lines(tmp_path: Path, caplog) -> None:
    path = tmp_path / "run.jsonl"
    with Loader(make()(), execution=INLINE, ledger=path) as loader:
        for t in range(4):
            next(loader)
            if t == 1:
                state = json.loads(json.dumps(loader.state_dict()))
    lines = path.read_text().splitlines()
    bogus = json.loads(lines[-1])
    bogus["digest"] = "0" * 64
    with path.open("a") as f:  # the crashed run wrote a wrong step 3, then died mid-line
        f.write(json.dumps(bogus) + "\n" + lines[-1][:50])
    with caplog.at_level(logging.WARNING, "zephon_core.engine.ledger"):
        assert read_ledger(path).steps[3]["digest"] == "0" * 64
    assert "cut short" in caplog.text
    with Loader(make()(), execution=INLINE, ledger=path) as loader:
        loader.load_state_dict(state)
        for _ in range(3):
            next(loader)
    assert path.read_text().endswith("\n")
    resumed = read_ledger(path)
    assert resumed.resumes == [0, 2] and sorted(resumed.steps) == list(range(5))
    ledger_of(tmp_path / "ref.jsonl", 1)
    assert compare_ledgers(read_ledger(tmp_path / "ref.jsonl"), resumed).common == list(range(5))
    assert compare_ledgers(read_ledger(tmp_path / "ref.jsonl"), resumed).ok


def test_another_recipe_is_refused_naming_the_field(tmp_path: Path) -> None:
    ledger_of(tmp_path / "a.jsonl", 1, steps=1)
    ledger_of(tmp_path / "b.jsonl", 1, steps=1, seq_len=256)
    with pytest.raises(LedgerError, match=r"fingerprint\.\S*seq_len is 512 in .*a\.jsonl but 256"):
        compare_ledgers(read_ledger(tmp_path / "a.jsonl"), read_ledger(tmp_path / "b.jsonl"))


def test_not_a_ledger_and_a_damaged_middle_line(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text('{"step": 0, "digest": "a"}\n')
    with pytest.raises(LedgerError, match="before any header"):
        read_ledger(tmp_path / "x.jsonl")
    ledger_of(tmp_path / "a.jsonl", 1, steps=2)
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    (tmp_path / "a.jsonl").write_text("\n".join([lines[0], lines[1][:30], lines[2]]) + "\n")
    with pytest.raises(LedgerError, match="line 2 is not a ledger line"):
        read_ledger(tmp_path / "a.jsonl")
    with pytest.raises(LedgerError, match="cannot read ledger"):
        read_ledger(tmp_path / "missing.jsonl")


def _tamper(path: Path, out: Path, step: int, change, fake: str = "f") -> None:
    ledger = read_ledger(path)
    entry = copy.deepcopy(ledger.steps[step])
    lane = change(entry)
    entry["digest"] = fake * 64
    entry["lanes"][str(lane)] = fake * 63 + "e"
    writer = LedgerWriter(out, ledger.fingerprint)
    for t in sorted(ledger.steps):
        writer.write(entry if t == step else ledger.steps[t])
    writer.close()


def test_compare_names_step_lane_row_sample_and_what(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    ledger_of(a, 2, steps=3)

    def content(e):
        e["rows"][5]["samples"][0]["digest"]["tokens"] = "0" * 16
        return e["rows"][5]["lane"]

    def other_sample(e):
        e["rows"][5]["samples"][1]["index"] += 1
        return e["rows"][5]["lane"]

    def extra_drop(e):
        e["drops"].append({"lane": 3, "seq": 1, "dataset": 0, "shard": 0, "index": 7,
                           "epoch": 0, "reason": "too_short"})
        return 3

    cases = [(content, "step 2, lane 1, row 5, sample 0: same sample dataset",
              "different content: field(s) tokens differ"),
             (other_sample, "step 2, lane 1, row 5, sample 1: different sample",
              "B has dataset"),
             (extra_drop, "step 2, lane 3: a drop on one side only: in B, dataset 0 shard 0 "
              "index 7 (epoch 0) dropped as 'too_short'", "")]
    for change, where, what in cases:
        b = tmp_path / f"{change.__name__}.jsonl"
        _tamper(a, b, 2, change)
        result = compare_ledgers(read_ledger(a), read_ledger(b))
        text = result.divergence.describe()
        assert where in text and what in text, text
        assert result.divergence.step == 2


def test_ledgers_hashed_differently_are_refused(tmp_path: Path) -> None:
    ledger_of(tmp_path / "a.jsonl", 1, steps=1)
    text = (tmp_path / "a.jsonl").read_text()
    assert '"sample_digest": "xxh3_64"' in text
    (tmp_path / "b.jsonl").write_text(text.replace('"sample_digest": "xxh3_64"',
                                                   '"sample_digest": "sha256"'))
    with pytest.raises(LedgerError, match="hash samples differently: sample_digest is 'xxh3_64'"):
        compare_ledgers(read_ledger(tmp_path / "a.jsonl"), read_ledger(tmp_path / "b.jsonl"))


def test_fields_a_ledger_of_an_older_version_lacks_are_no_divergence(tmp_path: Path) -> None:
    """Drops gained their sample's key: a ledger written before that, compared with one
    written after, is the same data (the README-command test once ran its D=2 half on the
    old code and its resume on the new, and reported a drop "on one side only")."""
    a = tmp_path / "a.jsonl"
    ledger_of(a, 2, steps=3)

    def drop(key):
        def change(e):
            d = {"lane": 3, "seq": 1, "dataset": 0, "shard": 0, "index": 7, "epoch": 0,
                 "reason": "too_short"}
            if key is not None:
                d["key"] = key
            e["drops"].append(d)
            return 3
        change.__name__ = f"key_{key}"
        return change

    with_key, without_key, other_key = (tmp_path / f"{n}.jsonl" for n in ("k", "none", "o"))
    _tamper(a, with_key, 2, drop("000007"))
    _tamper(a, without_key, 2, drop(None))
    _tamper(a, other_key, 2, drop("000008"), fake="c")
    same = compare_ledgers(read_ledger(with_key), read_ledger(without_key))
    assert same.ok and same.common == [0, 1, 2], same
    differ = compare_ledgers(read_ledger(with_key), read_ledger(other_key))
    assert not differ.ok and "a drop on one side only" in differ.divergence.describe()
    # the same content under other digests is still an edited ledger
    edited = tmp_path / "edited.jsonl"
    _tamper(a, edited, 2, lambda e: 3)
    result = compare_ledgers(read_ledger(a), read_ledger(edited))
    assert not result.ok and "an edited ledger?" in result.divergence.describe()
