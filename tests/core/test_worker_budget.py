"""Issue 12: process workers per rank share the machine's cores among its ranks."""

from __future__ import annotations

import pytest

from zephon_core import ConfigError, Execution, Read
from zephon_core.common.system import worker_budget
from zephon_core.extend import usable_cores


def _read_workers(ex: Execution) -> int:
    return ex.runner_for(Read([]))[1]


@pytest.mark.parametrize("ranks", [1, 2, 8, 64])
def test_default_is_cores_over_local_ranks(monkeypatch, ranks: int) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    want = max(1, usable_cores() // ranks)
    assert worker_budget() == want
    assert _read_workers(Execution()) == want
    assert f"// {ranks} rank(s) on this machine" in Execution().budget_note()


def test_outside_torchrun_one_rank_has_every_core(monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert _read_workers(Execution()) == usable_cores()


def test_an_explicit_setting_wins(monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert _read_workers(Execution(default_workers=3)) == 3
    assert _read_workers(Execution(workers={"read": 5})) == 5
    assert "set explicitly" in Execution(default_workers=3).budget_note()


def test_a_bad_local_world_size_is_named(monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "eight")
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE='eight'"):
        Execution().runner_for(Read([]))
