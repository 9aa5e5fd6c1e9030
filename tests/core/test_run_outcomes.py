"""How a run ends when it cannot run (issue 34): a count below one, or no batch at all.

Zero ranks once failed with an `IndexError` deep in the harness (after the whole
uninterrupted run, for a resume count of 0); a finite run whose every sample
was dropped ended quietly with no step, no message and no ledger. Now both are
a `ZephonError` that says what happened: the count and what it must be, or
that no batch was delivered and which drops, by reason, ate the data.
"""

from __future__ import annotations

import json

import pytest

from zephon_core import (
    BadSampleError,
    ConfigError,
    Dataset,
    ElasticRun,
    Execution,
    Filter,
    InMemoryReader,
    Loader,
    Map,
    NoRowsError,
    Pack,
    Read,
    Recipe,
    run_digests,
)

INLINE = Execution(runner="inline")


def _tokens(sample: dict) -> dict:
    import numpy as np

    if sample["n"] == 0:
        raise BadSampleError("empty_doc", f"doc {sample['id']}", "no tokens")
    return {"tokens": np.arange(sample["n"], dtype=np.int32)}


def _short(payload: dict) -> bool:
    return len(payload["tokens"]) < 10


def recipe_of(sizes: list[int], epochs: int | None = 1) -> Recipe:
    """Documents of `sizes` tokens; a 0 is an ``empty_doc`` drop, 10 or more ``too_long``."""
    reader = InMemoryReader([[{"id": i, "n": n} for i, n in enumerate(sizes)]])
    ops = [Read([reader], on_error="drop"), Map(_tokens, on_error="drop"),
           Filter(_short, reason="too_long"), Pack(16, {"overlong": "drop"})]
    return Recipe([Dataset("d", reader)], ops, global_batch_size=4, num_lanes=2,
                  epochs=epochs)


GOOD = [3, 5, 2, 7] * 10


@pytest.mark.parametrize("dp", [0, -1])
def test_a_rank_count_below_one_is_refused_naming_it(dp) -> None:
    with pytest.raises(ConfigError, match=rf"data-parallel rank count must be an int >= 1, "
                       rf"got {dp}"):
        Loader(recipe_of(GOOD), 0, dp, INLINE)
    with pytest.raises(ConfigError, match=rf"must be an int >= 1, got {dp}"):
        next(run_digests(lambda: recipe_of(GOOD), dp, 2, INLINE))


def test_a_resume_rank_count_below_one_is_refused_before_the_run() -> None:
    """Checked before the uninterrupted run, not after it (nothing is yielded)."""
    steps = run_digests(lambda: recipe_of(GOOD), 2, 3, INLINE, save_at=1, resume_dp=[1, 0])
    with pytest.raises(ConfigError, match=r"must be an int >= 1, got 0"):
        next(steps)
    with ElasticRun(lambda: recipe_of(GOOD), INLINE) as run:
        list(run.run(2, 2, save_at=1, resume_dp=[1]))
        with pytest.raises(ConfigError, match=r"must be an int >= 1, got 0"):
            next(run.resume(run.state, 0, 2))


def test_a_finite_run_that_delivers_nothing_says_why(tmp_path) -> None:
    """Every document dropped (two reasons): no step, so the harness raises, naming the
    drops by reason with counts and a sample of each; the ledger asked for is written,
    its header and an end line with every drop (its record and reason)."""
    sizes = [0, 12] * 10
    ledger = tmp_path / "ledger.jsonl"
    with pytest.raises(NoRowsError) as info:
        list(run_digests(lambda: recipe_of(sizes), 2, 4, INLINE, ledger=ledger))
    message = str(info.value)
    assert "delivered no batch" in message, message
    assert "0 rows" in message and "20 samples dropped" in message, message
    assert "10 empty_doc" in message and "10 too_long" in message, message
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert "zephon_ledger" in lines[0] and len(lines) == 2
    end = lines[1]
    assert end["end"] == 0 and end["rows"] == 0
    assert sorted((d["index"], d["reason"]) for d in end["drops"]) == \
        [(i, "empty_doc" if i % 2 == 0 else "too_long") for i in range(20)]
    from zephon_core.engine.ledger import read_ledger

    read = read_ledger(ledger)
    assert read.steps == {} and read.end == end
    one = tmp_path / "d1.jsonl"
    with pytest.raises(NoRowsError) as again:
        list(run_digests(lambda: recipe_of(sizes), 1, 4, Execution(runner="threads"),
                         ledger=one))
    assert str(again.value) == message  # the same words and lines at every D and runner
    assert read_ledger(one).end == end


def test_a_run_with_too_little_data_for_one_step_says_so() -> None:
    """Some rows, but fewer than one global batch needs: the same error, counting them."""
    with pytest.raises(NoRowsError) as info:
        list(run_digests(lambda: recipe_of([9, 9, 0]), 1, 2, INLINE))
    message = str(info.value)
    assert "delivered no batch" in message and "2 rows" in message, message
    assert "a step needs 4 rows" in message and "1 empty_doc" in message, message


def test_a_run_that_asks_for_no_step_or_ends_later_is_no_error() -> None:
    assert list(run_digests(lambda: recipe_of([0, 12] * 10), 1, 0, INLINE)) == []
    records = list(run_digests(lambda: recipe_of(GOOD), 2, 1000, INLINE))
    assert 0 < len(records) < 1000
    resumed = list(run_digests(lambda: recipe_of(GOOD), 2, 1000, INLINE,
                               save_at=len(records), resume_dp=[1]))
    assert [r.phase for r in resumed] == ["run"] * len(records)  # a resume at the end: none
