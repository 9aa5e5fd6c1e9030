"""The distribution ships every package, and each package's public surface resolves."""

from __future__ import annotations

import ast
import importlib
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
                                     "zephon_vl.titan"])
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


def _core_imports(paths: list[Path]) -> list[tuple[str, int, str, str]]:
    """``(file, line, module, name)`` of every ``from zephon_core... import name``."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] == "zephon_core":
                out += [(str(path.relative_to(ROOT)), node.lineno, node.module, a.name)
                        for a in node.names]
    return out


def test_outside_code_uses_only_the_public_and_extension_names() -> None:
    """zephon_vl, the benchmarks and the scripts import from ``zephon_core`` (its
    ``__all__``) and ``zephon_core.extend`` (its ``__all__``) only (issue 22, item 4;
    ``lint-imports`` checks the modules, this the names)."""
    import zephon_core
    import zephon_core.extend

    allowed = {"zephon_core": set(zephon_core.__all__) | {"extend"},
               "zephon_core.extend": set(zephon_core.extend.__all__)}
    paths = [p for top in ("zephon_vl", "benchmarks", "scripts")
             for p in (ROOT / top).rglob("*.py")]
    bad = [f"{f}:{line}: from {m} import {n}" for f, line, m, n in _core_imports(paths)
           if n not in allowed.get(m, set())]
    assert not bad, "private core names used outside zephon_core:\n" + "\n".join(bad)
