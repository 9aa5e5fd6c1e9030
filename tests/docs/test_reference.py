"""The reference cannot fall behind the code (issue 40): every public name has a
docstring and a place in the reference pages, every command its help; and every relative
link of the README and the site reaches a file (the README is not part of the site, so the
strict build does not check its links).

The pages come from the same functions `make docs` runs (scripts/mkdocs_hooks.py), so
this runs in seconds without building the site.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.docblocks import ROOT, blocks, pages

PUBLIC = ["zephon_core", "zephon_vl", "zephon_core.extend", "zephon_core.internals"]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def hooks() -> ModuleType:
    pytest.importorskip("mkdocs", reason="the [docs] extra is not installed")
    spec = importlib.util.spec_from_file_location("mkdocs_hooks",
                                                  ROOT / "scripts" / "mkdocs_hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("package", PUBLIC)
def test_every_public_name_has_a_docstring_in_the_reference(package: str) -> None:
    h = hooks()
    page = next(p for name, p, _ in h.MODULES if name == package)
    assert page in (ROOT / "mkdocs.yml").read_text(), f"{page} is not in mkdocs.yml's nav"
    text = h.reference_page(package, "")  # raises UndocumentedError naming the name
    core = set(importlib.import_module("zephon_core").__all__)
    for name in importlib.import_module(package).__all__:
        if package == "zephon_vl" and name in core:
            continue  # on the zephon_core page, which the zephon_vl page links
        assert f"heading: {name}\n" in text or f"### `{name}`" in text, name


def test_the_command_line_page_has_every_command() -> None:
    from zephon_vl.cli.registry import COMMANDS

    text = hooks().cli_page()
    for name in COMMANDS:
        assert f"## `zephon-vl {name}`" in text, name
    assert "usage: zephon-vl digest" in text


def test_the_execution_page_has_every_setting() -> None:
    from zephon_core import Execution
    from zephon_core.extend import flat_settings

    text = hooks().execution_page()
    for leaf in flat_settings(Execution):
        assert f"| `{leaf.name}` |" in text, leaf.name


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_names_its_language(path: Path) -> None:
    """An untyped block would escape the examples test: say `python`, `bash` or `text`."""
    untyped = [b.where for b in blocks(path) if not b.lang]
    assert not untyped, f"fenced blocks without a language: {untyped}"


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file(path: Path) -> None:
    """A link to a moved or renamed file (a dated run now in benchmarks/results/) fails."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    broken = [t for t in LINK.findall(text)
              if "://" not in t and not t.startswith("mailto:")
              and not (path.parent / t).exists()]
    assert not broken, f"{path.relative_to(ROOT)} links to files that do not exist: {broken}"
