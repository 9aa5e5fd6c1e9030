"""Settings declared once: a dataclass field carries its help, unit and choices, and every
entry point (Python, the command line, the TorchTitan config) is generated from it.

A settings class (`Execution`, `RetryPolicy`, ...) declares each field with `setting`.
`flat_settings` flattens it, nested settings objects included, into one `FlatSetting`
per leaf: ``retry.deadline`` is ``retry_deadline`` everywhere outside Python, in the same
unit (seconds, bytes). `from_flat` is the one way back: it takes the leaves by their flat
names, as typed values or as the strings a command line or a config file gives, so the
command line and the TorchTitan config accept and refuse the same spellings.

Spellings of a string value: ``none`` for None; ``true``/``false`` for booleans; sizes in
bytes with an optional binary suffix (``256MiB``, ``8K``); mappings as ``KEY=VALUE``
items separated by commas (``decode=2,tokenize=1``). A field may name its own parser
(``parse=``), for values no annotation describes (e.g. ``"auto"`` or a mapping); a tuple
is its items separated by commas (``0.5,0.5,0.5``).

A recipe's settings objects (``ImageSettings``, ``ShuffleSettings``...) are declared the
same way: `settings_from_table` reads their TOML tables, `check_choices` refuses a value
outside a field's declared choices, and `settings_table` renders the fields for the docs.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from zephon_core.errors import ConfigError

#: the key of a field's `SettingInfo` in its ``dataclasses.field`` metadata
META_KEY = "zephon_setting"

_SIZES = {"": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


@dataclass(frozen=True)
class SettingInfo:
    """What a settings field says about itself, beyond its type and default."""

    help: str
    unit: str = ""
    choices: tuple[str, ...] = ()
    #: a metavar for the command line (default: the unit, or the type)
    metavar: str = ""
    #: turns one flat string into the field's value (default: from the annotation)
    parse: Callable[[str], Any] | None = None
    #: the value's bounds (None: unbounded on that side): ``min <= value <= max``,
    #: ``above < value < below``; None itself passes where the field is optional
    min: float | None = None
    max: float | None = None
    above: float | None = None
    below: float | None = None
    #: the release that added the field (``"0.3.0"``; "" for the first): a fingerprint
    #: leaves it out while it holds its default (`settings_fingerprint`), so checkpoints
    #: written before it existed keep matching
    since: str = ""

    def bounds(self) -> str:
        """The declared bounds in words (``">= 1"``, ``"> 0 and < 0.5"``; "" for none)."""
        parts = [f"{op} {bound:g}" for op, bound in ((">=", self.min), (">", self.above),
                                                     ("<=", self.max), ("<", self.below))
                 if bound is not None]
        return " and ".join(parts)

    def out_of_bounds(self, value: Any) -> bool:
        """Whether a number `value` lies outside the declared bounds (None never does)."""
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return ((self.min is not None and not value >= self.min)
                or (self.max is not None and not value <= self.max)
                or (self.above is not None and not value > self.above)
                or (self.below is not None and not value < self.below))


def setting(default: Any = dataclasses.MISSING, *, help: str, unit: str = "",
            choices: tuple[str, ...] = (), metavar: str = "",
            parse: Callable[[str], Any] | None = None,
            default_factory: Any = dataclasses.MISSING, min: float | None = None,
            max: float | None = None, above: float | None = None,
            below: float | None = None, since: str = "") -> Any:
    """A dataclass field with its `SettingInfo`: the one place its help, unit, choices and
    bounds live (``setting(8, min=1, ...)``: at least 1; ``above=0``: more than 0). The
    bounds are checked wherever the settings object is built (`check_settings`, from its
    ``__post_init__``) and wherever a flat value is read (`FlatSetting.coerce`). `since`:
    the release that added the field, which fingerprints leave out at its default."""
    info = SettingInfo(help, unit, tuple(choices), metavar, parse, min, max, above, below,
                       since)
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={META_KEY: info})


@dataclass(frozen=True)
class FlatSetting:
    """One leaf of a settings class under its flat name (``retry_deadline``)."""

    name: str
    #: attribute names from the root object to the leaf: ``("retry", "deadline")``
    path: tuple[str, ...]
    annotation: Any
    default: Any
    info: SettingInfo

    @property
    def flag(self) -> str:
        """The command line's spelling of the name."""
        return "--" + self.name.replace("_", "-")

    @property
    def optional(self) -> bool:
        return _is_optional(self.annotation)

    @property
    def required(self) -> bool:
        """True for a field without a default (`from_flat` refuses to leave it out)."""
        return self.default is dataclasses.MISSING

    @property
    def mapping(self) -> bool:
        """True for ``KEY=VALUE`` mappings (repeatable on the command line)."""
        return _mapping_types(self.annotation) is not None

    def parse(self, text: str) -> Any:
        """The value a flat string spells (see the module docstring)."""
        if self.info.parse is not None:
            return self.info.parse(text)
        return parse_value(self.annotation, text, self.info.unit)

    def coerce(self, value: Any) -> Any:
        """A flat value: strings are parsed, other values (typed) pass unchanged; a value
        outside the declared bounds is refused under the flat name."""
        if isinstance(value, str) and not _is_plain_str(self.annotation):
            try:
                value = self.parse(value)
            except (ValueError, ConfigError) as exc:
                raise ConfigError(f"{self.name}: cannot read {value!r} ({exc}); "
                                  f"expected {self.describe_type()}") from None
        elif _is_plain_str(self.annotation) and self.optional and value in ("", "none"):
            return None
        if self.info.out_of_bounds(value):
            raise ConfigError(bound_error(self.name, value, self.info, self.optional))
        return value

    def describe_type(self) -> str:
        if self.info.choices:
            return " | ".join(self.info.choices)
        if self.mapping:
            return f"{self.info.metavar or 'KEY=VALUE'} items separated by commas"
        if _tuple_item(self.annotation) is not None:
            return "items separated by commas"
        base = _strip_optional(self.annotation)
        name = getattr(base, "__name__", str(base))
        if self.info.unit == "bytes":
            name = "bytes (e.g. 256MiB)"
        elif self.info.unit:
            name = f"{name} ({self.info.unit})"
        if self.info.bounds():
            name = f"{name} {self.info.bounds()}"
        return name + (" or none" if self.optional else "")

    def spell(self, value: Any) -> str:
        """The flat string of a value: what `parse` reads back as the same value."""
        if value is None:
            return "none"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, Mapping):
            return ",".join(f"{k}={v}" for k, v in value.items())
        if isinstance(value, tuple | list):
            return ",".join(str(v) for v in value)
        if self.info.unit == "bytes" and isinstance(value, int):
            for suffix, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
                if value and value % size == 0:
                    return f"{value // size}{suffix}"
        return str(value)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_settings_class(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _union_args(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _is_optional(tp: Any) -> bool:
    return type(None) in _union_args(tp)


def _strip_optional(tp: Any) -> Any:
    args = [a for a in _union_args(tp) if a is not type(None)]
    return args[0] if len(args) == 1 else typing.Union[tuple(args)]  # noqa: UP007


def _is_plain_str(tp: Any) -> bool:
    return _strip_optional(tp) is str


def _mapping_types(tp: Any) -> tuple[Any, Any] | None:
    for arg in _union_args(tp):
        if typing.get_origin(arg) in (dict, Mapping):
            key, value = typing.get_args(arg)
            return key, value
    return None


def _tuple_item(tp: Any) -> Any:
    """The item type of a ``tuple[X, ...]`` or ``tuple[X, X, X]`` annotation, else None."""
    base = _strip_optional(tp)
    if typing.get_origin(base) is not tuple:
        return None
    args = [a for a in typing.get_args(base) if a is not Ellipsis]
    return args[0] if args and all(a == args[0] for a in args) else None


def check_table_keys(cls: type, table: Mapping[str, Any], key: str) -> None:
    """Refuse a TOML table ``[key]`` holding a name that is not a field of dataclass `cls`."""
    known = [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]
    unknown = sorted(set(table) - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown key {unknown[0]!r} in [{key}]{hint}; known: "
                          f"{', '.join(known)}")


def check_choices(obj: Any) -> None:
    """Refuse a field of settings object `obj` whose value is not one of its declared
    choices (each item, for a tuple); None passes where the field is optional."""
    for f in dataclasses.fields(obj):
        info = f.metadata.get(META_KEY)
        if info is None or not info.choices:
            continue
        value = getattr(obj, f.name)
        where = f"{type(obj).__name__}.{f.name}"
        allowed = ", ".join(info.choices)
        if isinstance(value, tuple | list):
            for item in value:
                if item not in info.choices:
                    raise ConfigError(f"{where} names {item!r}, which is none of {allowed}")
        elif value not in info.choices and not (
                value is None and _is_optional(_hints(type(obj))[f.name])):
            raise ConfigError(f"{where} must be one of {allowed}; got {value!r}")


def bound_error(where: str, value: Any, info: SettingInfo, optional: bool) -> str:
    """The message for `value` of setting `where` outside its declared bounds."""
    none = " or none" if optional else ""
    return f"{where} must be {info.bounds()}{none}; got {value!r}"


def check_bounds(obj: Any) -> None:
    """Refuse a field of settings object `obj` outside its declared bounds (`setting`'s
    ``min``, ``max``, ``above``, ``below``), naming the field, the value and the bound."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        info = f.metadata.get(META_KEY)
        if info is not None and info.out_of_bounds(getattr(obj, f.name)):
            raise ConfigError(bound_error(f"{type(obj).__name__}.{f.name}",
                                          getattr(obj, f.name), info,
                                          _is_optional(hints[f.name])))


def check_settings(obj: Any) -> None:
    """Everything a settings object's declarations say about its values: choices
    (`check_choices`) and bounds (`check_bounds`). Call it from ``__post_init__``."""
    check_choices(obj)
    check_bounds(obj)


def settings_fingerprint(obj: Any) -> dict[str, Any]:
    """The JSON view of settings object `obj` for checkpoint fingerprints: every field
    (tuples as lists), except a field declared ``since`` a later release while it holds
    its declared default, so a checkpoint written before the field existed keeps its
    fingerprint; any other value is in, and a resume with a different one is refused."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if f.name.startswith("_"):
            continue
        value = getattr(obj, f.name)
        info = f.metadata.get(META_KEY)
        if info is not None and info.since and value == _declared_default(f):
            continue
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def _declared_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def parse_size(text: str) -> int:
    """``"256MiB"`` -> 268435456; a plain number is bytes."""
    t = text.strip().lower().replace("_", "")
    digits = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    suffix = t[len(digits):]
    if suffix not in _SIZES or not digits:
        raise ValueError(f"not a size: {text!r} (bytes, or a number with K, M, G, KiB, MiB, "
                         "GiB)")
    return int(float(digits) * _SIZES[suffix])


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "1", "yes", "on"):
        return True
    if t in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r} (true or false)")


def parse_items(text: str, cast: Callable[[str], Any] = str, what: str = "KEY=VALUE") -> dict:
    """``"decode=2,tokenize=1"`` -> ``{"decode": cast("2"), "tokenize": cast("1")}``."""
    out: dict = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            out[name.strip()] = cast(value.strip())
        except ValueError:
            raise ConfigError(f"expected {what} items separated by commas, got {part!r} "
                              "(e.g. 'decode=2,tokenize=1')") from None
    return out


def parse_value(tp: Any, text: str, unit: str = "") -> Any:
    """One value of type `tp` from its flat spelling."""
    if _is_optional(tp) and text.strip().lower() in ("none", ""):
        return None
    items = _mapping_types(tp)
    if items is not None:
        return parse_items(text, items[1], "KEY=N" if items[1] in (int, float) else "KEY=VALUE")
    base = _strip_optional(tp)
    item = _tuple_item(tp)
    if item is not None:
        return tuple(parse_value(item, part.strip(), unit) for part in text.split(",")
                     if part.strip())
    if base is bool:
        return parse_bool(text)
    if base is int:
        return parse_size(text) if unit == "bytes" else int(text)
    if base is float:
        return float(text)
    if base is str:
        return text
    raise ValueError(f"no flat spelling for {tp!r}; give the field a parse=")


def flat_settings(cls: type, prefix: str = "", path: tuple[str, ...] = ()) -> list[FlatSetting]:
    """Every leaf of settings class `cls`, nested settings objects flattened under
    ``<field>_``: the one list the command line and the TorchTitan config are made from.

    Every leaf must be declared with `setting` (a field without help is a mistake that
    would leave a flag undocumented), except nested settings objects themselves.
    """
    hints = _hints(cls)
    out: list[FlatSetting] = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        tp = hints[f.name]
        if _is_settings_class(tp):
            out += flat_settings(tp, f"{prefix}{f.name}_", (*path, f.name))
            continue
        info = f.metadata.get(META_KEY)
        if info is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting()")
        default = (f.default_factory() if f.default_factory is not dataclasses.MISSING
                   else f.default)
        out.append(FlatSetting(prefix + f.name, (*path, f.name), tp, default, info))
    return out


def from_flat(cls: type, flat: Mapping[str, Any]) -> Any:
    """An instance of `cls` from flat names (`flat_settings`), missing ones defaulted.

    Values may be typed or the flat strings of the command line and config files;
    an unknown name is refused with the known ones.
    """
    leaves = {s.name: s for s in flat_settings(cls)}
    unknown = sorted(set(flat) - set(leaves))
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} settings {unknown}; known: "
                          f"{', '.join(leaves)}")
    missing = [s for s in leaves.values() if s.required and s.name not in flat]
    if missing:
        raise ConfigError(f"{cls.__name__} needs {missing[0].name}: {missing[0].info.help}")
    tree: dict = {}
    for name, value in flat.items():
        s = leaves[name]
        node = tree
        for part in s.path[:-1]:
            node = node.setdefault(part, {})
        node[s.path[-1]] = s.coerce(value)
    return _build(cls, tree)


def settings_from_table(cls: type, value: Any, key: str, base: Any = None) -> Any:
    """The TOML table ``[key]`` (or any mapping of flat names) as settings class `cls`,
    its fields over `base`'s (None: the declared defaults); a `cls` passes unchanged.

    An unknown key is named with the known ones; strings are read per the declared
    type and unit (`FlatSetting.coerce`), as on the command line.
    """
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key!r} must be a table ([{key}]) of {cls.__name__} fields, got "
                          f"{value!r}")
    check_table_keys(cls, value, key)
    try:
        if base is None:
            return from_flat(cls, value)
        leaves = {s.name: s for s in flat_settings(cls)}
        return dataclasses.replace(base, **{k: leaves[k].coerce(v) for k, v in value.items()})
    except ConfigError as exc:
        raise ConfigError(f"[{key}] {exc}") from None


def _build(cls: type, tree: Mapping[str, Any]) -> Any:
    hints = _hints(cls)
    kwargs = {k: (_build(hints[k], v) if _is_settings_class(hints[k]) else v)
              for k, v in tree.items()}
    return cls(**kwargs)


def to_flat(obj: Any) -> dict[str, Any]:
    """The flat view of a settings object: flat name -> typed value."""
    out = {}
    for s in flat_settings(type(obj)):
        value = obj
        for part in s.path:
            value = getattr(value, part)
        out[s.name] = value
    return out


def _spell_default(s: FlatSetting) -> str:
    if s.required:
        return "required"
    if isinstance(s.default, tuple | list):
        return "`[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v)
                                for v in s.default) + "]`"
    return f"`{s.spell(s.default)}`"


def settings_table(cls: type) -> str:
    """A Markdown table of `cls`'s settings (name, default, unit, help and choices), made
    from their declarations: what the docs show, so they cannot drift from the code."""
    lines = ["| setting | default | unit | meaning |", "| --- | --- | --- | --- |"]
    for s in flat_settings(cls):
        meaning = s.info.help
        if s.info.bounds():
            meaning += f" ({s.info.bounds()})"
        if s.info.choices:
            meaning += ". One of: " + ", ".join(s.info.choices)
        meaning = meaning.replace("|", "\\|")
        lines.append(f"| `{s.name}` | {_spell_default(s)} | {s.info.unit} | {meaning} |")
    return "\n".join(lines) + "\n"
