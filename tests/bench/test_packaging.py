"""The distribution ships every package, and each package's public surface resolves."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_the_distribution() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for top in ("zephon_core", "zephon_vl") for p in (ROOT / top).rglob("__init__.py")}
    found.add("zephon_bench")
    assert listed == found, f"pyproject packages differ: missing {found - listed}, " \
                            f"stale {listed - found}"
    assert config["package-dir"]["zephon_bench"] == "benchmarks"


@pytest.mark.parametrize("package", ["zephon_core", "zephon_vl", "zephon_core.extend",
                                     "zephon_core.internals", "zephon_vl.titan"])
def test_public_names_resolve(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__all__ == sorted(module.__all__)
    missing = [name for name in module.__all__ if getattr(module, name, None) is None]
    assert not missing, f"{package}.__all__ names that do not resolve: {missing}"


def test_core_imports_no_vision_or_model_library() -> None:
    """Text-only training must not pull in PIL, av, transformers or zephon_vl."""
    code = ("import sys, zephon_core as z\n"
            "for n in z.__all__: getattr(z, n)\n"
            "bad = [m for m in ('PIL', 'av', 'transformers', 'zephon_vl') if m in sys.modules]\n"
            "print(','.join(bad))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "", f"zephon_core imported {done.stdout.strip()}"


def _imports_of(sources: list[tuple[str, str]], top: str) -> list[tuple[str, int, str, str]]:
    """``(file, line, module, name)`` of every ``from <top>... import name`` in the
    ``(file, text)`` pairs; ``import <top>.x`` counts as the name ``*`` of module ``<top>.x``."""
    out = []
    for where, text in sources:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] == top:
                out += [(where, node.lineno, node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                out += [(where, node.lineno, a.name, "*") for a in node.names
                        if a.name.split(".")[0] == top and a.name != top]
    return out


def _core_imports(paths: list[Path]) -> list[tuple[str, int, str, str]]:
    """``(file, line, module, name)`` of every ``from zephon_core... import name``."""
    sources = [(str(path.relative_to(ROOT)), path.read_text()) for path in paths]
    return [i for i in _imports_of(sources, "zephon_core") if i[3] != "*"]


def _notebook_code() -> list[tuple[str, str]]:
    """Each code cell of the walkthroughs in notebooks/ as ``(notebook[cell i], source)``."""
    out = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        out += [(f"{path.name}[cell {i}]", "".join(c["source"]))
                for i, c in enumerate(cells) if c["cell_type"] == "code"]
    return out


def test_outside_code_uses_only_the_public_and_extension_names() -> None:
    """zephon_vl, the benchmarks and the scripts import from ``zephon_core``,
    ``zephon_core.extend`` and ``zephon_core.internals`` (each its ``__all__``) only (issue
    22, item 4; ``lint-imports`` checks the modules, this the names)."""
    import zephon_core
    import zephon_core.extend
    import zephon_core.internals

    allowed = {"zephon_core": set(zephon_core.__all__) | {"extend", "internals"},
               "zephon_core.extend": set(zephon_core.extend.__all__),
               "zephon_core.internals": set(zephon_core.internals.__all__)}
    paths = [p for top in ("zephon_vl", "benchmarks", "scripts")
             for p in (ROOT / top).rglob("*.py")]
    bad = [f"{f}:{line}: from {m} import {n}" for f, line, m, n in _core_imports(paths)
           if n not in allowed.get(m, set())]
    assert not bad, "private core names used outside zephon_core:\n" + "\n".join(bad)


def test_notebooks_use_only_public_names() -> None:
    """The walkthroughs show what a user writes: names from ``zephon_core.__all__`` and
    ``zephon_vl.__all__``, or a documented module (``zephon_vl.testing``,
    ``zephon_vl.titan``), never the engine's modules (docs/architecture.md)."""
    import zephon_core
    import zephon_vl

    public = {"zephon_core": set(zephon_core.__all__), "zephon_vl": set(zephon_vl.__all__)}
    documented = ("zephon_vl.testing", "zephon_vl.titan")
    code = _notebook_code()
    assert code, "no notebook cells found"
    bad = [f"{where}:{line}: {m} {n}"
           for top in public for where, line, m, n in _imports_of(code, top)
           if n not in public.get(m, set()) and not m.startswith(documented)]
    assert not bad, "notebooks import names outside the public surface:\n" + "\n".join(bad)
