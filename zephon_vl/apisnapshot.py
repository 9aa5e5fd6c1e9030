"""The public API as plain text, one line per name, for docs/api.txt.

    python -m zephon_vl.apisnapshot --write docs/api.txt    # regenerate
    python -m zephon_vl.apisnapshot --check docs/api.txt    # exit 1 and a diff if it differs

What users import, call and write in a recipe file changes only on purpose (docs/api.md):
``tests/bench/test_api_snapshot.py`` compares this text with the committed file, so every
change to the surface is a visible diff that goes with a changelog line. It lists, for
`zephon_core`, `zephon_core.extend`, `zephon_core.internals`, `zephon_vl` and
`zephon_vl.titan`: each function's signature; each class's constructor, public methods,
properties and attributes (a dataclass's fields with their defaults, an enum's members);
each constant's value; a name re-exported from another namespace as an alias; every
deprecation still served; and the keys recipe files accept, by kind and table, and each
dataset format's options. The text is the same in every run and process: no memory
addresses, sets sorted, defaults spelled by a fixed rule.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import importlib
import inspect
import re
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from zephon_core.extend import deprecations, format_options
from zephon_core.internals import recipe_file_keys

#: the public namespaces, in the order aliases are resolved (a re-export names the first)
NAMESPACES = ("zephon_core", "zephon_core.extend", "zephon_core.internals", "zephon_vl",
              "zephon_vl.titan")
#: special methods that are part of a class's public behaviour
DUNDERS = ("__call__", "__len__", "__iter__", "__next__", "__enter__", "__exit__",
           "__getitem__", "__contains__")
HEADER = ("# The public API of zephon-vl (docs/api.md): one line per name, sorted.",
          "# Regenerate: python -m zephon_vl.apisnapshot --write docs/api.txt",
          "# Every change here needs a CHANGELOG.md line (Added, Changed, Deprecated, Removed).")
COMMAND = "python -m zephon_vl.apisnapshot --write docs/api.txt"


class _Text:
    """A value that prints as the given text (inside `inspect.Signature`)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def value_text(value: Any) -> str:
    """A default or constant spelled the same in every process."""
    if value is dataclasses.MISSING:
        return "dataclasses.MISSING"
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, set | frozenset):
        items = sorted(value_text(v) for v in value)
        return f"{type(value).__name__}({{{', '.join(items)}}})" if items else \
            f"{type(value).__name__}()"
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        inner = ", ".join(value_text(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return f"[{', '.join(value_text(v) for v in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{value_text(k)}: {value_text(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, type) or inspect.isroutine(value):
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', value)}"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def annotation_text(annotation: Any) -> str:
    """A type as written; ``Annotated[T, ...]`` as ``T`` (the metadata is help text)."""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, typing.ForwardRef):
        return annotation.__forward_arg__
    if typing.get_origin(annotation) is typing.Annotated:
        return annotation_text(typing.get_args(annotation)[0])
    return inspect.formatannotation(annotation)


def signature_text(obj: Callable[..., Any]) -> str:
    """``(a: int, *, b: str = 'x') -> Recipe``; ``(...)`` where Python cannot tell."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    params = [p.replace(
        annotation=p.empty if p.annotation is p.empty else _Text(annotation_text(p.annotation)),
        default=p.empty if p.default is p.empty else _Text(value_text(p.default)))
        for p in sig.parameters.values()]
    ret = sig.return_annotation
    return str(sig.replace(parameters=params, return_annotation=sig.empty if ret is sig.empty
                           else _Text(annotation_text(ret))))


def _ours(cls: type) -> bool:
    return cls.__module__.split(".")[0] in ("zephon_core", "zephon_vl")


def _kind(cls: type) -> str:
    tags = []
    if dataclasses.is_dataclass(cls):
        params = getattr(cls, "__dataclass_params__", None)
        tags.append("dataclass(frozen)" if params is not None and params.frozen else "dataclass")
    if issubclass(cls, enum.Enum):
        tags.append("enum")
    if hasattr(cls, "_fields") and issubclass(cls, tuple):
        tags.append("namedtuple")
    bases = ", ".join(b.__qualname__ if _ours(b) else f"{b.__module__}.{b.__qualname__}"
                      for b in cls.__bases__ if b is not object)
    return " ".join(["class", *tags]) + (f" ({bases})" if bases else "")


def _fields(name: str, cls: type) -> Iterator[str]:
    """A dataclass's or named tuple's fields: ``name.field: type = default``."""
    if dataclasses.is_dataclass(cls):
        declared = _declared(cls)
        for f in dataclasses.fields(cls):
            if f.name not in declared:
                continue  # a field of a base class that is not zephon's (torchtitan's)
            if f.default is not dataclasses.MISSING:
                default = f" = {value_text(f.default)}"
            elif f.default_factory is not dataclasses.MISSING:
                default = f" = {value_text(f.default_factory())}"
            else:
                default = ""
            init = "" if f.init else " [not in __init__]"
            yield f"{name}.{f.name}: {annotation_text(f.type)}{default}{init}"
    elif hasattr(cls, "_fields"):
        hints = getattr(cls, "__annotations__", {})
        for field in cls._fields:
            default = cls._field_defaults.get(field, dataclasses.MISSING)
            tail = "" if default is dataclasses.MISSING else f" = {value_text(default)}"
            yield f"{name}.{field}: {annotation_text(hints.get(field, 'Any'))}{tail}"


def _members(name: str, cls: type) -> Iterator[str]:
    """Public members defined in zephon's own classes of `cls`'s MRO (not Python's, not
    torchtitan's), each once, as the most derived class defines it."""
    seen: set[str] = set()
    skip = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    skip |= set(getattr(cls, "_fields", ()))
    for klass in cls.__mro__:
        if not _ours(klass):
            continue
        for attr, raw in vars(klass).items():
            if attr in seen or attr in skip or (attr.startswith("_") and attr not in DUNDERS):
                continue
            seen.add(attr)
            yield from _member(f"{name}.{attr}", cls, raw)


def _member(name: str, cls: type, raw: Any) -> Iterator[str]:
    if isinstance(raw, enum.Enum):
        yield f"{name} = {value_text(raw.value)}"
    elif isinstance(raw, property | _cached_property()):
        yield f"{name}: property"
    elif isinstance(raw, classmethod | staticmethod):
        kind = type(raw).__name__
        yield f"{name}{signature_text(raw.__func__)} [{kind}]"
    elif inspect.isfunction(raw):
        yield f"{name}{signature_text(raw)}"
    elif isinstance(raw, type):
        yield from describe(name, raw)
    elif not callable(raw):
        yield f"{name} = {value_text(raw)}"


def _cached_property() -> type:
    import functools

    return functools.cached_property


def describe(name: str, obj: Any) -> Iterator[str]:
    """The lines of one public name."""
    if isinstance(obj, type):
        yield f"{name} [{_kind(obj)}]"
        if dataclasses.is_dataclass(obj):
            yield f"{name}({_parameter_names(obj)})"  # types and defaults: the field lines
        elif not issubclass(obj, enum.Enum):
            init = obj.__init__ if "__init__" in vars(obj) else obj
            yield f"{name}{signature_text(init)}".replace("(self, ", "(", 1) \
                .replace("(self)", "()", 1)
        yield from _fields(name, obj)
        yield from _members(name, obj)
    elif callable(obj):
        yield f"{name}{signature_text(obj)}"
    else:
        yield f"{name} = {value_text(obj)}"


def _parameter_names(cls: type) -> str:
    """A dataclass constructor's parameters, names only, in order, with ``*`` and ``/``;
    those a base class from another package declares (TorchTitan's) are one ``...``, so
    an upgrade of that package does not change zephon's snapshot."""
    sig = inspect.signature(cls)
    declared = _declared(cls)
    params = [p.replace(annotation=p.empty, default=p.empty)
              for p in sig.parameters.values() if p.name in declared]
    text = str(sig.replace(parameters=params, return_annotation=sig.empty))[1:-1]
    if len(params) == len(sig.parameters):
        return text
    return f"{text}, ..." if text else "..."


def _declared(cls: type) -> set[str]:
    """The annotated names of `cls`'s own classes (zephon's) in its MRO."""
    return {a for k in cls.__mro__ if _ours(k) for a in vars(k).get("__annotations__", {})}


def _aliasable(obj: Any) -> bool:
    return isinstance(obj, type) or inspect.isroutine(obj) or callable(obj)


def api_lines() -> list[str]:
    """The snapshot's lines, sorted (the header first)."""
    lines: list[str] = []
    first: dict[int, str] = {}
    for module_name in NAMESPACES:
        module = importlib.import_module(module_name)
        for attr in module.__all__:
            obj = getattr(module, attr)
            name = f"{module_name}.{attr}"
            if _aliasable(obj) and id(obj) in first:
                lines.append(f"{name} = alias of {first[id(obj)]}")
                continue
            if _aliasable(obj):
                first[id(obj)] = name
            lines.extend(describe(name, obj))
    for d in deprecations():
        lines.append(f"deprecated: {d.old} -> {d.new} (since {d.since}, removed in "
                     f"{d.removed_in})")
    for kind, tables in recipe_file_keys().items():
        for table, keys in tables.items():
            where = f" {table}" if table else ""
            lines.extend(f"recipe file, kind {kind!r}:{where} {key}" for key in keys)
    for name, options in format_options().items():
        lines.extend(f"recipe file, [[datasets]] format = {name!r}: {key}" for key in options)
    return [*HEADER, *sorted(set(lines))]


def api_text() -> str:
    return "\n".join(api_lines()) + "\n"


def diff(committed: str, current: str, path: str = "docs/api.txt", limit: int = 120) -> str:
    """A unified diff of the committed snapshot against the current API (at most `limit`
    lines), '' when equal."""
    out = list(difflib.unified_diff(committed.splitlines(), current.splitlines(),
                                    f"{path} (committed)", "current API", lineterm="", n=0))
    if len(out) > limit:
        out = [*out[:limit], f"... {len(out) - limit} more lines"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zephon_vl.apisnapshot",
                                     description="The public API of zephon-vl as text.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="PATH", help="write the snapshot to PATH")
    group.add_argument("--check", metavar="PATH", help="exit 1, with a diff, if PATH differs")
    args = parser.parse_args(argv)
    text = api_text()
    if args.write:
        Path(args.write).write_text(text)
        print(f"wrote {args.write}: {text.count(chr(10))} lines")
        return 0
    if args.check:
        committed = Path(args.check).read_text() if Path(args.check).is_file() else ""
        found = diff(committed, text, args.check)
        if found:
            print(f"{found}\nthe public API differs from {args.check}: if on purpose, run "
                  f"`{COMMAND}` and add a CHANGELOG.md line for each change")
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
