"""MkDocs hooks of the user guide (mkdocs.yml): the pages that are made from the code.

Generated at build time, so none of them can fall behind the code it describes:

* ``reference/zephon_core.md``, ``reference/zephon_vl.md``, ``reference/extend.md``,
  ``reference/internals.md``: every name of the package's ``__all__``, rendered by
  mkdocstrings from its docstring. A public name without a docstring (a constant: without
  a ``#:`` comment above it) fails the build.
* ``reference/cli.md``: ``zephon-vl --help`` and every subcommand's help, from the parser.
* ``reference/execution.md``: every `Execution` setting with unit and default, from the
  declarations (`zephon_core.extend.settings_table`).

Dated benchmark runs live in ``benchmarks/results/``; a page links them as
``../benchmarks/results/NAME`` (a link that works on the forge too) and this hook serves them
under ``benchmark-results/`` in the site.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import posixpath
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_URI = "benchmark-results"
#: the public modules of the reference: (module, page, what the page says first)
MODULES = [
    ("zephon_core", "reference/zephon_core.md",
     "The modality-free engine and its text-only API: `from zephon_core import ...`."),
    ("zephon_vl", "reference/zephon_vl.md",
     "The vision names. `zephon_vl` also re-exports every name of "
     "[zephon_core](zephon_core.md), so a VLM user imports from `zephon_vl` alone."),
    ("zephon_core.extend", "reference/extend.md",
     "For authors of formats, operators, model families and trainer adapters "
     "([what to import](../api.md))."),
    ("zephon_core.internals", "reference/internals.md",
     "The engine's inside, for tests, benchmarks and the `zephon-vl` tools: public and "
     "under the deprecation rule, but not a base to build a format or adapter on "
     "([what to import](../api.md))."),
]


class UndocumentedError(RuntimeError):
    """A public name without a docstring: the reference would show it empty."""


def _defining_module(name: str, obj: Any, package: str) -> tuple[str, str]:
    """``(module, doc)`` of a constant: the module that assigns it at top level (under
    `name`, or another name that the package exports as `name`), and the ``#:`` comment
    above the assignment (its docstring)."""
    found = []
    for modname, module in sorted(sys.modules.items()):
        if not modname.startswith(("zephon_core.", "zephon_vl.")):
            continue
        names = [k for k, v in vars(module).items() if v is obj and k.isupper()]
        for attr in sorted(names, key=lambda k: k != name):
            try:
                source = inspect.getsource(module)
            except (OSError, TypeError):
                break
            match = re.search(rf"((?:^#:.*\n)*)^{attr}\s*(?::[^=]*)?=", source, re.M)
            if match:
                doc = " ".join(line[2:].strip() for line in match.group(1).splitlines())
                found.append((attr != name, modname, doc))
    if not found:
        raise UndocumentedError(f"{package}.{name}: no module assigns it at top level")
    _, modname, doc = min(found)
    return modname, doc


def _entry(package: str, name: str, exclude: set[str]) -> tuple[str, str] | None:
    """``(group, markdown)`` of one public name; None when `exclude` has it."""
    if name in exclude:
        return None
    obj = getattr(importlib.import_module(package), name)
    if inspect.isclass(obj) or callable(obj):
        module = getattr(obj, "__module__", package)
        if not (inspect.getdoc(obj) or "").strip():
            raise UndocumentedError(
                f"{package}.{name} ({module}) has no docstring: write one that says why "
                "a user calls it")
        qual = getattr(obj, "__qualname__", name)
        return module, f"::: {module}.{qual}\n    options:\n      heading: {name}\n"
    module, doc = _defining_module(name, obj, package)
    if not doc:
        raise UndocumentedError(
            f"{package}.{name} ({module}) has no `#:` comment above its assignment")
    value = repr(obj)
    value = value if len(value) < 120 else value[:117] + "..."
    return module, (f"### `{name}` {{ #{package}.{name} }}\n\n`{name} = {value}` "
                    f"(`{module}`)\n\n{doc[:1].upper() + doc[1:]}\n")


def reference_page(package: str, intro: str) -> str:
    """The reference page of `package`: its ``__all__``, grouped by defining module."""
    module = importlib.import_module(package)
    exclude = set(importlib.import_module("zephon_core").__all__) \
        if package == "zephon_vl" else set()
    groups: dict[str, list[str]] = {}
    for name in sorted(module.__all__, key=str.lower):
        entry = _entry(package, name, exclude)
        if entry is not None:
            groups.setdefault(entry[0], []).append(entry[1])
    out = [f"# `{package}`\n\n{intro} Import every name of this page from `{package}`. "
           "The sections name the module that defines each one: where to read its code, not "
           "an import path that stays. Generated from the docstrings when the site is built "
           "(`scripts/mkdocs_hooks.py`).\n"]
    for group in sorted(groups):
        out.append(f"## `{group}`\n")
        out += groups[group]
    return "\n".join(out)


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `zephon-vl` parser and each command's, built as `zephon_vl.cli.main.main`
    builds them."""
    import zephon_vl.cli.commands  # noqa: F401  (registers every command)
    from zephon_vl.cli.registry import COMMANDS

    parser = argparse.ArgumentParser(prog="zephon-vl",
                                     description="The `zephon-vl` command line.")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {}
    for name, (help_text, configure, _) in COMMANDS.items():
        commands[name] = sub.add_parser(name, help=help_text, description=help_text)
        configure(commands[name])
    return parser, commands


def cli_page() -> str:
    """``zephon-vl --help`` and each subcommand's help, as the parser prints them."""
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width
    parser, commands = _parsers()
    out = ["# The command line\n",
           "Every `zephon-vl` command with its options, printed by its parser when the site "
           "is built (`zephon-vl COMMAND --help` prints the same). Execution settings "
           "(`--workers`, `--runner`, ...) are [the same settings](execution.md) as "
           "`Execution` and TorchTitan's `--dataloader.*` fields.\n",
           "```text", parser.format_help().rstrip(), "```\n"]
    for name, p in sorted(commands.items()):
        out += [f"## `zephon-vl {name}`\n", "```text", p.format_help().rstrip(), "```\n"]
    return "\n".join(out)


def execution_page() -> str:
    """Every `Execution` setting, from its declaration."""
    from zephon_core import Execution
    from zephon_core.extend import settings_table

    return ("# Execution settings\n\n"
            "How a loader runs, never what it delivers: no setting of this table changes a "
            "batch. Each one has one name and one unit in Python (`Execution(...)`), on the "
            "command line (`--name-with-dashes`) and in TorchTitan (`--dataloader.name`); "
            "a nested one is `<field>_<leaf>` (`retry_deadline`). "
            "[Settings](../settings.md) says how they are declared, and lists the recipe "
            "settings. Generated from the declarations when the site is built.\n\n"
            + settings_table(Execution).replace("| `` |", "| (empty) |") + "\n")


def _generate(files: Files, config: Any, uri: str, content: str) -> None:
    """`uri` made from `content`, in place of the short page the repository holds there
    (which says, for a reader on the forge, that the page is generated and how to see it)."""
    stub = files.get_file_from_path(uri)
    if stub is not None:
        files.remove(stub)
    files.append(File.generated(config, uri, content=content))


def on_files(files: Files, config: Any) -> Files:
    sys.path.insert(0, str(ROOT))  # the checkout's packages, not an installed copy
    for package, page, intro in MODULES:
        _generate(files, config, page, reference_page(package, intro))
    _generate(files, config, "reference/cli.md", cli_page())
    _generate(files, config, "reference/execution.md", execution_page())
    for path in sorted(RESULTS.glob("*")):
        if path.suffix in (".png", ".json"):
            f = File(f"{RESULTS_URI}/{path.name}", src_dir=None, dest_dir=config["site_dir"],
                     use_directory_urls=config["use_directory_urls"])
            f.abs_src_path = str(path)
            files.append(f)
    return files


_RESULT_LINK = re.compile(r"\]\(((?:\.\./)+benchmarks/results/)([^)\s#]+)\)")
_OUTSIDE_LINK = re.compile(r"\[([^\]]+)\]\(((?:\.\./)+[^)\s#]+)\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Links that leave docs/, right on the forge, made right in the site: a dated run
    (``../benchmarks/results/X``) -> the copy the site serves; another file of the
    repository (``../CHANGELOG.md``) -> its path as code, since the site does not hold it.
    A link to a file that does not exist stays, and the strict build refuses it."""
    here = posixpath.dirname(page.file.src_uri)

    def to_site(m: re.Match[str]) -> str:
        return "](" + posixpath.relpath(f"{RESULTS_URI}/{m.group(2)}", here or ".") + ")"

    def to_code(m: re.Match[str]) -> str:
        target = (ROOT / "docs" / here / m.group(2)).resolve()
        if target.is_relative_to(ROOT / "docs") or not target.exists():
            return m.group(0)
        path = target.relative_to(ROOT).as_posix()
        return m.group(1) if m.group(1).strip("`") == path else f"{m.group(1)} (`{path}`)"

    return _OUTSIDE_LINK.sub(to_code, _RESULT_LINK.sub(to_site, markdown))
