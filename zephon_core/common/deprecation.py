"""Deprecations: a renamed, moved or removed public name, keyword or recipe-file key keeps
working for one minor version, with a `DeprecationWarning` that names its replacement.

A script written against one release must run against the next (docs/api.md). So a change
to the public surface is made in two steps: the old spelling keeps working and warns
(declared here, so it is listed in the API snapshot ``docs/api.txt`` and the changelog),
and it goes one minor version later. Three kinds, one record (`Deprecation`):

* a name that left a namespace (``from zephon_core import StageFn``): `moved_names`, which
  `lazy_exports` serves;
* a keyword that was renamed or moved into a settings object
  (``text_recipe(overlong="split")``): `moved_keywords`, a decorator;
* a recipe-file key that was renamed: `renamed_keys`.

`deprecations()` lists every one declared, so a test can refuse a deprecation that outlived
its removal version and the snapshot can list them.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from zephon_core.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])

#: how a removal without a successor (`removed_names`) spells its `Deprecation.new`
NO_REPLACEMENT = "no replacement"


class Deprecation(NamedTuple):
    """One deprecated spelling: `old` as a user writes it, `new` its replacement, the
    version that deprecated it (`since`, ``"0.4.0"``); it goes in `removed_in`, the next
    minor version. (Named tuples, not dataclasses, here: ``import zephon_core`` declares
    deprecations, and stays a millisecond.)"""

    old: str
    new: str
    since: str

    @property
    def removed_in(self) -> str:
        """One minor version after `since` (``0.4.x`` -> ``0.5.0``)."""
        major, minor = (int(p) for p in self.since.split(".")[:2])
        return f"{major}.{minor + 1}.0"

    def message(self) -> str:
        if self.new.startswith(NO_REPLACEMENT):  # `removed_names`: nothing to use instead
            return (f"{self.old} is deprecated since zephon-vl {self.since} and will be "
                    f"removed in {self.removed_in} with {self.new}")
        return (f"{self.old} is deprecated since zephon-vl {self.since} and will be removed "
                f"in {self.removed_in}; use {self.new}")

    def warn(self, stacklevel: int = 1) -> None:
        """Warn; `stacklevel` counts from the caller of `warn` (1: that caller's line)."""
        warnings.warn(self.message(), DeprecationWarning, stacklevel=stacklevel + 1)


#: every deprecation declared in a module imported so far (the API snapshot imports all)
_DECLARED: list[Deprecation] = []


def deprecations() -> list[Deprecation]:
    """Every deprecation declared by the modules imported so far, in declaration order."""
    return list(_DECLARED)


def deprecation(old: str, new: str, since: str) -> Deprecation:
    """Declare a deprecation (listed by `deprecations`)."""
    record = Deprecation(old, new, since)
    if record not in _DECLARED:
        _DECLARED.append(record)
    return record


# -- names ---------------------------------------------------------------------------


class MovedName(NamedTuple):
    """A public name that left `package`: its object is now ``new`` (a dotted path), or,
    for a name removed without a successor (`removed_names`), ``target``, where the
    library keeps it for its own use."""

    name: str
    new: str
    deprecation: Deprecation
    target: str = ""

    def resolve(self) -> Any:
        module, _, attr = (self.target or self.new).rpartition(".")
        return getattr(importlib.import_module(module), attr)


def moved_names(package: str, moves: Mapping[str, str], since: str) -> dict[str, MovedName]:
    """``{old name: "new.module.Name"}`` -> the table `lazy_exports` serves for `package`:
    ``package.old`` still returns the object, with a warning naming where it lives now."""
    return {old: MovedName(old, new, deprecation(f"{package}.{old}", new, since))
            for old, new in moves.items()}


def removed_names(package: str, removed: Mapping[str, str], since: str,
                  why: str) -> dict[str, MovedName]:
    """``{old name: "module.Name"}`` -> the table `lazy_exports` serves for names that
    leave `package` without a public successor (`why` says why, in the warning): the
    object, from where the library keeps it, with a warning that nothing replaces it."""
    new = f"{NO_REPLACEMENT} ({why})"
    return {old: MovedName(old, new, deprecation(f"{package}.{old}", new, since), target)
            for old, target in removed.items()}


def user_stacklevel() -> int:
    """How many frames above the caller of the function that asks (1: that caller) the
    first frame outside zephon's own packages is, as `warnings.warn` counts them (it skips
    the import system's frames itself: ``from package import Old`` reaches a module's
    ``__getattr__`` through them). A recipe file is read several calls deep, and the
    warning belongs to the user's line. Pass ``user_stacklevel() + 1`` to
    `Deprecation.warn` or `warnings.warn`."""
    import inspect  # only when a deprecated spelling is used

    here = inspect.currentframe()
    frame = here.f_back.f_back if here and here.f_back else None  # the asker's caller
    level = 1
    while frame is not None and (_importlib(frame) or _zephon(frame)):
        level += 0 if _importlib(frame) else 1
        frame = frame.f_back
    return level


def _importlib(frame: Any) -> bool:
    return frame.f_code.co_filename.startswith("<frozen importlib")


#: top-level packages whose frames are the library's, not the user's (`library_package`)
_LIBRARY = {"zephon_core"}


def library_package(name: str) -> None:
    """Count the frames of package `name` (its top level) as the library's when a warning
    looks for the user's line; `lazy_exports` marks each package that packages its names
    with it (zephon_vl does), so the core names no package built on it."""
    _LIBRARY.add(name.split(".")[0])


def _zephon(frame: Any) -> bool:
    return frame.f_globals.get("__name__", "").split(".")[0] in _LIBRARY


# -- keywords ------------------------------------------------------------------------


def moved_keywords(function: str, since: str, moves: Mapping[str, str]) -> Callable[[F], F]:
    """Decorate `function` (its public name, for the message) so that each old keyword of
    `moves` still works: ``{"old": "new"}`` renames it, ``{"old": "group.field"}`` moves its
    value into the settings parameter ``group`` (None, a mapping of fields, or a settings
    object). The call warns at the caller's line; giving a value both ways is refused.
    The signature users see (`inspect.signature`) is the new one."""
    records = {old: deprecation(f"{function}({old}=...)", _new_spelling(function, new), since)
               for old, new in moves.items()}

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old in [k for k in kwargs if k in moves]:
                records[old].warn(stacklevel=2)
                _move(kwargs, old, moves[old], function)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def _new_spelling(function: str, new: str) -> str:
    group, _, field = new.partition(".")
    if not field:
        return f"{function}({new}=...)"
    return f"{function}({group}={{{field!r}: ...}})"


def _move(kwargs: dict[str, Any], old: str, new: str, function: str) -> None:
    value = kwargs.pop(old)
    group, _, field = new.partition(".")
    if not field:
        if new in kwargs:
            raise TypeError(f"{function}() got {old}= and its replacement {new}=; give {new}=")
        kwargs[new] = value
        return
    given = kwargs.get(group)
    if given is None:
        kwargs[group] = {field: value}
    elif isinstance(given, Mapping):
        if field in given:
            raise TypeError(f"{function}() got {old}= and {group}[{field!r}]; give it once, "
                            f"in {group}")
        kwargs[group] = {**given, field: value}
    elif hasattr(given, "__dataclass_fields__"):  # a settings object
        import dataclasses

        kwargs[group] = dataclasses.replace(given, **{field: value})
    else:
        raise TypeError(f"{function}() got {old}= and {group}={given!r}; give {field} in "
                        f"{group}")


# -- recipe-file keys ------------------------------------------------------------------


def renamed_key(old: str, new: str, since: str) -> tuple[str, tuple[str, Deprecation]]:
    """Declare a renamed recipe-file key, an item of the table `renamed_keys` takes: `old`
    is ``"key"`` (top level) or ``"table.key"`` (a key of the ``[table]`` table, or of every
    ``[[table]]`` entry); `new` is the key's new name in the same place."""
    table, _, key = old.rpartition(".")
    where = f" in [{table}]" if table else ""
    return old, (new, deprecation(f"the recipe-file key {key!r}{where}", repr(new), since))


def renamed_keys(table: Mapping[str, Any], renames: Mapping[str, tuple[str, Deprecation]],
                 where: str) -> dict[str, Any]:
    """A recipe file's `table` with each renamed key (`renamed_key`) under its new name,
    warning with the file's name (`where`); a key given under both names is refused."""
    out = dict(table)
    for path, (new, record) in renames.items():
        section, _, key = path.rpartition(".")
        if not section:
            _rename(out, key, new, record, where)
            continue
        inner = out.get(section)
        if isinstance(inner, Mapping):
            out[section] = dict(inner)
            _rename(out[section], key, new, record, where)
        elif isinstance(inner, list):
            out[section] = [dict(t) if isinstance(t, Mapping) else t for t in inner]
            for t in out[section]:
                if isinstance(t, dict):
                    _rename(t, key, new, record, where)
    return out


def _rename(table: dict[str, Any], old: str, new: str, record: Deprecation,
            where: str) -> None:
    if old not in table:
        return
    if new in table:
        raise ConfigError(f"{where}: {old!r} is the old name of {new!r} and both are given; "
                          f"keep {new!r}")
    warnings.warn(f"{where}: {record.message()}", DeprecationWarning,
                  stacklevel=user_stacklevel() + 1)
    table[new] = table.pop(old)
