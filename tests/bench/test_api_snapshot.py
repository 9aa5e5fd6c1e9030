"""The public API changes only on purpose (guarantee 12, issue 35): its names, signatures,
fields, defaults and recipe-file keys equal the committed snapshot docs/api.txt."""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import zephon_core
import zephon_core.extend
import zephon_core.internals
import zephon_vl
from zephon_vl.apisnapshot import COMMAND, api_text, describe, diff, signature_text, value_text

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "docs" / "api.txt"


@pytest.fixture(scope="module")
def current() -> str:
    return api_text()


def test_the_public_api_equals_the_committed_snapshot(current: str) -> None:
    committed = SNAPSHOT.read_text() if SNAPSHOT.is_file() else ""
    found = diff(committed, current)
    assert not found, (
        f"the public API differs from docs/api.txt:\n{found}\n\nIf the change is on purpose, "
        f"regenerate the snapshot with `{COMMAND}` and add a line to CHANGELOG.md for each "
        "change (Added / Changed / Deprecated / Removed). A renamed or removed name, keyword "
        "or recipe-file key keeps working for one minor version with a DeprecationWarning "
        "(zephon_core.common.deprecation; docs/api.md).")


@pytest.mark.slow
def test_the_snapshot_is_the_same_in_another_process(current: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-m", "zephon_vl.apisnapshot"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=True)
    assert done.stdout == current


def test_zephon_vl_is_the_one_user_namespace() -> None:
    """zephon_vl holds every user name of zephon_core (the same objects); the author names
    of zephon_core.extend and the engine's inside (zephon_core.internals) are in neither."""
    assert set(zephon_core.__all__) <= set(zephon_vl.__all__)
    for name in zephon_core.__all__:
        assert getattr(zephon_vl, name) is getattr(zephon_core, name), name
    assert not set(zephon_core.extend.__all__) & set(zephon_vl.__all__)
    assert not set(zephon_core.internals.__all__) & set(zephon_vl.__all__)
    assert not set(zephon_core.internals.__all__) & set(zephon_core.extend.__all__)


def test_a_signature_or_default_change_changes_the_lines() -> None:
    def before(a: int, *, b: str = "x") -> None: ...

    def after(a: int, *, b: str = "y") -> None: ...

    assert signature_text(before) == "(a: int, *, b: str = 'x') -> None"
    assert signature_text(before) != signature_text(after)

    class Mode(enum.Enum):
        FAST = "fast"

    @dataclass(frozen=True)
    class Settings:
        mode: Mode = Mode.FAST
        names: frozenset = frozenset({"b", "a", "c"})
        items: list = field(default_factory=lambda: [object])

    Settings.__module__ = "zephon_core.test"  # described as one of zephon's own classes
    lines = list(describe("x.Settings", Settings))
    assert lines[:2] == ["x.Settings [class dataclass(frozen)]", "x.Settings(mode, names, items)"]
    assert "x.Settings.mode: Mode = Mode.FAST" in lines
    assert "x.Settings.names: frozenset = frozenset({'a', 'b', 'c'})" in lines
    assert "x.Settings.items: list = [builtins.object]" in lines
    assert " at 0x" not in value_text(object()) and value_text({3, 1, 2}) == "set({1, 2, 3})"
