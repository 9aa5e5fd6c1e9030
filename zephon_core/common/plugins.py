"""Plugins: how packages add formats, recipes, recipe kinds and model families.

The core ships the text format, the text kind and ``text-demo``; everything else
arrives through one mechanism, a Python entry point in the group ``zephon.plugins``
that names a function (``"package.module:register"``). The registries call
`ensure_plugins` before their first lookup; it loads every such entry point once
and calls it, and the function registers its package's names with the core's
``register_*`` calls (names and ``"module:attr"`` references, imported only when a
dataset or a recipe asks for one). ``zephon_vl`` is one such package
(``zephon_vl.plugin:register``); a third-party package is another, with the same
two lines in its ``pyproject.toml``. docs/architecture.md says why entry points.

The entry point names a module path, resolved by the usual import system when it
is loaded: the installed metadata says only *that* a package has a plugin, the code
registered is the one ``import`` finds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib import metadata

from zephon_core.errors import ConfigError

#: the entry point group packages declare their plugin in
GROUP = "zephon.plugins"

_loaded: dict[str, str] = {}   # entry point name -> its value, once called
_state = {"done": False, "loading": False}
_lock = threading.RLock()   # held while loading: other threads wait, the loading one re-enters


def ensure_plugins() -> None:
    """Load the installed plugins once (see `load_plugins`); later calls do nothing."""
    if _state["done"]:
        return
    with _lock:
        if not (_state["done"] or _state["loading"]):
            load_plugins()


def load_plugins() -> list[str]:
    """Call every ``zephon.plugins`` entry point not called yet, in name order; the names
    of all called so far. Call it again after installing a package in a running process.

    A plugin that cannot be loaded is refused with its name, its value and the cause,
    rather than left out: a missing format would otherwise read as a typo in a recipe.
    """
    with _lock:
        _state["loading"] = True   # a plugin's own register_* calls must not load again
        try:
            for entry in sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name):
                if entry.name not in _loaded:
                    _call(entry)
            _state["done"] = True
        finally:
            _state["loading"] = False
        return sorted(_loaded)


def _call(entry: metadata.EntryPoint) -> None:
    _loaded[entry.name] = entry.value
    try:
        register: Callable[[], None] = entry.load()
        register()
    except Exception as exc:
        del _loaded[entry.name]
        raise ConfigError(f"the zephon plugin {entry.name!r} ({entry.value}, entry point "
                          f"group {GROUP!r}) failed to load: {type(exc).__name__}: {exc}; "
                          "reinstall or uninstall the package that declares it") from exc


def plugin_hint() -> str:
    """The end of an 'unknown name' message: where names from packages come from."""
    loaded = ", ".join(sorted(_loaded)) or "none"
    return (f" (plugins loaded: {loaded}; packages add names through the entry point group "
            f"{GROUP!r}: a package installed in editable mode before it declared one needs "
            "`pip install -e` again)")
