"""Issue 36, item 3: a setting's bounds are declared on it (`setting(min=..., above=...)`)
and checked wherever a settings object is built (Python, flat names as the command line,
the TorchTitan config and TOML tables give them), the error naming field, value and bound."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from zephon_core import ConfigError, Execution
from zephon_core.extend import (
    check_settings,
    flat_settings,
    setting,
    settings_from_table,
    settings_table,
)
from zephon_vl.cli.common import add_execution_args, execution_from
from zephon_vl.titan.dataloader import ZephonDataLoader
from zephon_vl.titan.settings import execution_of

BOUNDED = [s for s in flat_settings(Execution) if s.info.bounds()]


def outside(info) -> float:
    """A value just outside the declared bounds."""
    if info.min is not None:
        return info.min - 1
    if info.above is not None:
        return info.above
    if info.max is not None:
        return info.max + 1
    return info.below


def test_execution_declares_the_bounds_it_used_to_check_by_hand():
    assert {s.name for s in BOUNDED} >= {
        "group_size", "prefetch", "prefetch_steps", "group_timeout", "stall_seconds",
        "stall_drops", "backlog_bytes", "ray_connect_timeout", "retry_deadline",
        "retry_initial", "retry_maximum", "retry_request_timeout", "coalesce_max_bytes",
        "coalesce_max_gap"}


@pytest.mark.parametrize("leaf", BOUNDED, ids=lambda s: s.name)
def test_every_entry_point_refuses_a_value_outside_the_bounds(leaf):
    bad = outside(leaf.info)
    bad = int(bad) if leaf.annotation in (int, int | None) else bad
    bound = leaf.info.bounds()
    with pytest.raises(ConfigError) as err:
        Execution.from_flat({leaf.name: bad})
    assert leaf.name in str(err.value) and bound in str(err.value) and repr(bad) in str(err.value)
    p = argparse.ArgumentParser()
    add_execution_args(p)
    with pytest.raises(ConfigError, match=f"{leaf.name} must be {bound}"):
        execution_from(p.parse_args([leaf.flag, str(bad)]))
    with pytest.raises(ConfigError, match=f"{leaf.name} must be {bound}"):
        execution_of(ZephonDataLoader.Config(**{leaf.name: bad}))
    # and in Python, on the object that holds the field
    *path, name = leaf.path
    holder = Execution()
    for part in path:
        holder = getattr(holder, part)
    with pytest.raises(ConfigError, match=rf"{type(holder).__name__}\.{name} must be {bound}"):
        dataclasses.replace(holder, **{name: bad})


def test_the_bound_itself_passes_and_none_passes_where_optional():
    assert Execution(group_size=1, prefetch_steps=0, stall_drops=None).group_size == 1
    with pytest.raises(ConfigError, match=r"Execution\.stall_drops must be >= 1 or none; got 0"):
        Execution(stall_drops=0)


@dataclasses.dataclass(frozen=True)
class Knobs:
    """A throwaway settings class: what any settings class gets from its declarations."""

    count: int = setting(3, unit="items", min=1, max=10, help="how many")
    share: float = setting(0.5, unit="fraction", min=0, below=1, help="which share")

    def __post_init__(self) -> None:
        check_settings(self)


@pytest.mark.parametrize("table, match", [
    ({"count": 0}, r"count must be >= 1 and <= 10; got 0"),
    ({"count": "11"}, r"count must be >= 1 and <= 10; got 11"),
    ({"share": 1.0}, r"share must be >= 0 and < 1; got 1.0"),
])
def test_a_declared_bound_is_checked_in_tables_and_python(table, match):
    with pytest.raises(ConfigError, match=rf"\[knobs\] {match}"):
        settings_from_table(Knobs, table, "knobs")
    name, value = next(iter(table.items()))
    with pytest.raises(ConfigError, match=rf"Knobs\.{match}"):
        Knobs(**{name: type(Knobs.__dataclass_fields__[name].default)(value)})


def test_bounds_show_in_the_docs_table_and_the_help():
    assert "| `count` | `3` | items | how many (>= 1 and <= 10) |" in settings_table(Knobs)
    leaf = next(s for s in flat_settings(Execution) if s.name == "group_size")
    assert leaf.describe_type() == "int (samples) >= 1 or none"


@dataclasses.dataclass(frozen=True)
class MoreExecution(Execution):
    """docs/architecture.md, "to add an Execution setting": one declared field, nothing else."""

    shard_cache: int = setting(4, unit="shards", min=1, help="shards kept open per lane")


def test_adding_an_execution_setting_is_one_declaration():
    """The flag, its help, the flat name, the bound and the frozen object all follow from
    the declaration; the recipe's fingerprint never sees an execution setting."""
    p = argparse.ArgumentParser()
    add_execution_args(p, MoreExecution)
    assert "shards kept open per lane" in p.format_help()
    ex = execution_from(p.parse_args(["--shard-cache", "6", "--group-size", "2"]), MoreExecution)
    assert (ex.shard_cache, ex.group_size) == (6, 2) and ex.to_flat()["shard_cache"] == 6
    assert MoreExecution.from_flat({"shard_cache": "6"}) == dataclasses.replace(
        MoreExecution(), shard_cache=6)
    with pytest.raises(ConfigError, match=r"shard_cache must be >= 1; got 0"):
        execution_from(p.parse_args(["--shard-cache", "0"]), MoreExecution)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ex.shard_cache = 1  # type: ignore[misc]
    assert "| `shard_cache` | `4` | shards | shards kept open per lane (>= 1) |" in \
        settings_table(MoreExecution)
