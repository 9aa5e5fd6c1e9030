"""`zephon_core.extend` holds what an author of a format, family, operator or adapter needs,
each name documented; what tests, benchmarks and tools use to look inside the engine is
`zephon_core.internals`; a name that left `extend` keeps working for one minor version,
with a warning (issue 36; guarantee 12, docs/api.md)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

import zephon_core.extend
import zephon_core.internals
from zephon_core.common.deprecation import deprecations

ROOT = Path(__file__).resolve().parents[2]
HERE = str(Path(__file__).resolve())


def documented(module: str) -> list[str]:
    """The names listed (``- `name`: ...``) under docs/api.md's "`module`, name by name"."""
    text = (ROOT / "docs" / "api.md").read_text()
    start = text.index(f"## `{module}`, name by name")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else None]
    return re.findall(r"^- `(\w+)`: \S", section, flags=re.MULTILINE)


@pytest.mark.parametrize("module", [zephon_core.extend, zephon_core.internals])
def test_every_name_is_documented_once_in_api_md(module) -> None:
    names = documented(module.__name__)
    assert sorted(names) == module.__all__, (
        f"docs/api.md, {module.__name__}: missing {sorted(set(module.__all__) - set(names))}, "
        f"stale {sorted(set(names) - set(module.__all__))}")
    assert len(names) == len(set(names))


def test_extend_and_internals_share_no_name() -> None:
    assert not set(zephon_core.extend.__all__) & set(zephon_core.internals.__all__)


def left_extend() -> dict[str, str]:
    return {d.old.removeprefix("zephon_core.extend."): d.new for d in deprecations()
            if d.old.startswith("zephon_core.extend.")}


def test_a_name_that_moved_to_internals_still_imports_from_extend_with_one_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"use zephon_core\.internals\.make_runner") \
            as caught:
        from zephon_core.extend import make_runner
    assert make_runner is zephon_core.internals.make_runner
    assert [w.filename for w in caught] == [HERE]  # one warning, at the import line
    moved = {name for name, new in left_extend().items()
             if new == f"zephon_core.internals.{name}"}
    assert moved <= set(zephon_core.internals.__all__) and len(moved) == 26
    for name in moved:
        assert name not in zephon_core.extend.__all__ and name not in dir(zephon_core.extend)
        with pytest.warns(DeprecationWarning) as caught:
            value = getattr(zephon_core.extend, name)
        assert len(caught) == 1 and "0.5.0" in str(caught[0].message), name
        assert value is getattr(zephon_core.internals, name), name


def test_a_name_that_left_the_surface_resolves_with_a_warning_that_nothing_replaces_it() -> None:
    removed = {name for name, new in left_extend().items() if new.startswith("no replacement")}
    assert removed == {"Backlog", "accepted_keys"}
    with pytest.warns(DeprecationWarning, match="removed in 0.5.0 with no replacement"):
        from zephon_core.extend import Backlog
    from zephon_core.engine.backlog import Backlog as engine_backlog

    assert Backlog is engine_backlog


def test_the_public_names_import_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for module in (zephon_core.extend, zephon_core.internals):
            for name in module.__all__:
                assert getattr(module, name) is not None, f"{module.__name__}.{name}"
