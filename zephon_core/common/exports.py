"""Lazy package exports: a package's public names, imported on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from zephon_core.common.deprecation import MovedName, library_package, user_stacklevel


def lazy_exports(package: str, table: dict[str, str], namespace: dict[str, Any],
                 moved: Mapping[str, MovedName] | None = None,
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose name `n` lives in module `table[n]`
    (``"module:attr"`` when it has another name there).

    Importing the package then costs nothing, and a worker process loads only
    the modules its operators use. `moved` (`zephon_core.common.deprecation.moved_names`):
    names that left the package and still resolve, for one minor version, with a
    `DeprecationWarning` naming their new home; they are neither cached nor listed, so
    every use warns. The package's frames count as the library's for warnings
    (`library_package`): a deprecation warns at the user's line, not at the package's.
    """
    library_package(package)
    moved = dict(moved or {})

    def getattr_(name: str) -> Any:
        module = table.get(name)
        if module is None:
            if name in moved:
                if not _probed_by_import():
                    moved[name].deprecation.warn(stacklevel=user_stacklevel() + 1)
                return moved[name].resolve()
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = module.partition(":")
        value = getattr(importlib.import_module(module), attr or name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(table))

    return getattr_, dir_


def _probed_by_import() -> bool:
    """Whether the caller's caller is the import system checking that ``from package import
    name`` can find `name` (the statement then asks for it once more, and that warns): one
    warning per import line, not two."""
    import inspect  # only when a moved name is asked for

    frame = inspect.currentframe()
    caller = frame.f_back.f_back if frame and frame.f_back else None
    return caller is not None and caller.f_code.co_name == "_handle_fromlist" and \
        caller.f_code.co_filename.startswith("<frozen importlib")
