"""Users' own operators: a map, a filter or an operator object, put into any recipe.

A `UserOp` says *what* runs (a function, an import path ``"package.module:function"``, or
a `Transform` object), *where* (`after` one of the recipe's built-in steps, the
`AFTER` points) and *how it is named in checkpoints* (its import path, `args` and a
`version` the user bumps when the function's code changes: all three are in the
fingerprint, so a changed operator refuses a checkpoint made with the old one).

Randomness is handed in, never drawn from a global generator: a function with a
parameter named ``rng`` receives a `numpy.random.Generator` seeded by the sample's
identity (dataset, shard, index, epoch), the recipe's seed and the operator's name
(`user_rng`). Nothing of the rank count, the runner or the grouping enters it, so
the same sample gets the same draws at every D, on every runner, and after a resume.

Where a function may run: an importable one (module level) anywhere, worker
processes and Ray included; a lambda or a local function only in the driver's
process (runner ``inline`` or ``threads``). Its operator then defaults to the
inline runner, and a stage asked to run it in processes is refused when the stage
is shipped to its workers, naming the operator (`UserTransform.__reduce__`).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon_core.common.hashing import rng
from zephon_core.errors import ConfigError, UnknownKeyError
from zephon_core.ops.contract import Operator, Transform, check_on_error
from zephon_core.records import Dropped, Element

#: where a user's operator may go: after the read (the raw record: a JSONL/Parquet record,
#: a WebDataset sample's members, a record format's sample), after the decode (VLM: the
#: document with its images as patch rows), on each still image's decoded pixels before the
#: resize to the patch grid (VLM: ``pixels``), or after the tokenize (tokens and targets)
AFTER = ("read", "pixels", "decode", "tokenize")
KINDS = ("map", "filter")
#: the keys of a recipe file's ``[[operators]]`` table
TABLE_KEYS = ("call", "after", "kind", "args", "version", "name", "reason", "on_error")
_SALT = 0x55534552  # "USER": user operators' draws never equal another operator's


def user_rng(key: int, name: str, part: int = 0) -> np.random.Generator:
    """The generator a user's operator `name` gets for the element whose randomness key is
    `key` (`Element.key`: the recipe seed, dataset, shard, index and epoch); `part` tells
    the images of one document apart (a ``pixels`` operator's k-th image: part k)."""
    return rng(key, _SALT, _name_key(name), part)


def _name_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def import_callable(path: str, what: str = "call") -> Callable[..., Any]:
    """The object at ``"package.module:attr"`` (``attr`` may be dotted); an error naming
    `what` (the key that gave the path) when it cannot be imported."""
    if not isinstance(path, str) or ":" not in path:
        raise ConfigError(f"{what} must be an import path \"package.module:function\", "
                          f"got {path!r}")
    module, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"{what} = {path!r}: module {module!r} cannot be imported ({exc}); "
                          "install it or put it on the Python path") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} = {path!r}: module {module!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{what} = {path!r} is not callable")
    return obj


def import_path(fn: Callable[..., Any]) -> str | None:
    """``"module:qualname"`` when importing it gives `fn` back (a module-level function or
    class), else None (a lambda, a local function, a bound method)."""
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qual or "<" in qual:
        return None
    try:
        found = import_callable(f"{module}:{qual}")
    except ConfigError:
        return None
    return f"{module}:{qual}" if found is fn else None


@dataclass(frozen=True)
class UserOp:
    """A user's operator and where it goes in a recipe (``operators=[...]`` of `text_recipe`,
    `vlm_recipe`, or a recipe file's ``[[operators]]`` tables; docs/operators.md).

    `fn`: a function, its import path ``"package.module:function"``, or a `Transform`
    object (inserted as it is; its own `settings()` are its fingerprint). A map returns
    the new value (or a `Dropped` to drop the sample); a filter returns True to keep,
    False to drop with `reason` (default: the operator's name), or a `Dropped`.
    `args` are keyword arguments given to `fn` on every call (JSON values: they are in
    the fingerprint). `version`: bump it when `fn`'s code changes the data.
    """

    fn: Callable[..., Any] | str | Transform
    after: str = "read"
    kind: str = "map"
    args: Mapping[str, Any] = field(default_factory=dict)
    version: str = "1"
    name: str | None = None
    reason: str | None = None
    on_error: str = "raise"

    def __post_init__(self) -> None:
        if self.after not in AFTER:
            raise ConfigError(f"after = {self.after!r}: a user operator goes after one of "
                              f"{', '.join(AFTER)}")
        if self.kind not in KINDS:
            raise ConfigError(f"kind = {self.kind!r}: a user operator is one of "
                              f"{', '.join(KINDS)}")
        if not isinstance(self.args, Mapping) or not all(isinstance(k, str) for k in self.args):
            raise ConfigError(f"args must be a table of keyword arguments, got {self.args!r}")
        try:
            json.dumps(dict(self.args), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"args of {self.label()} must be JSON values (they are in the "
                              f"checkpoint fingerprint): {exc}") from None
        if not isinstance(self.version, str) or not self.version:
            raise ConfigError(f"version must be a non-empty string (bump it when the "
                              f"function changes), got {self.version!r}")
        if self.reason is not None and (self.kind != "filter" or not self.reason):
            raise ConfigError("reason is a filter's drop reason: a non-empty string, with "
                              "kind = \"filter\"")
        check_on_error(self.on_error)
        if isinstance(self.fn, Transform) and self.after == "pixels":
            raise ConfigError("after = \"pixels\" takes a function of an image array, not "
                              f"an operator object ({type(self.fn).__name__})")

    def label(self) -> str:
        """The operator's name as the pipeline and the fingerprint show it."""
        if self.name:
            return self.name
        if isinstance(self.fn, Transform):
            return self.fn.name
        if isinstance(self.fn, str):
            return self.fn.rpartition(":")[2].rpartition(".")[2]
        return getattr(self.fn, "__name__", "user_op")

    def operator(self) -> Transform:
        """The transform that runs it (the object itself for an operator object)."""
        if isinstance(self.fn, Transform):
            if self.name:
                self.fn.name = self.name
            return self.fn
        return UserTransform(self)


class UserTransform(Transform):
    """A `UserOp`'s function as a transform: applied to each payload, with its ``rng``."""

    def __init__(self, op: UserOp) -> None:
        fn = import_callable(op.fn) if isinstance(op.fn, str) else op.fn
        if not callable(fn):
            raise ConfigError(f"operator {op.label()!r}: fn must be a function or an import "
                              f"path, got {fn!r}")
        self.op = op
        self.fn = fn
        self.name = op.label()
        self.on_error = op.on_error
        self.path = op.fn if isinstance(op.fn, str) else import_path(fn)
        self.wants_rng = _takes_rng(fn)
        self.reason = op.reason or self.name
        #: the operator whose stage runs it (itself; ``decode`` for a ``pixels`` operator)
        self.host = self.name
        # an importable function runs with the heavy operators; a local one stays in the driver
        self.default_runner = "processes" if self.path else None

    def settings(self) -> dict:
        out = {"call": self.path or _local_name(self.fn), "kind": self.op.kind,
               "after": self.op.after, "args": json.loads(json.dumps(dict(self.op.args))),
               "version": self.op.version}  # args as a checkpoint reads them back
        return {**out, "reason": self.reason} if self.op.kind == "filter" else out

    def apply(self, value: Any, key: int, part: int = 0) -> Any:
        """`value` after this operator (a `Dropped` where a filter refuses it); `key` is the
        element's randomness key, `part` the image's place in its document."""
        kw = dict(self.op.args)
        if self.wants_rng:
            kw["rng"] = user_rng(key, self.name, part)
        out = self.fn(value, **kw)
        if self.op.kind == "map" or isinstance(out, Dropped):
            return out
        if not isinstance(out, bool | np.bool_):
            raise ConfigError(f"filter {self.name!r} returned {type(out).__name__}; a filter "
                              "returns True (keep), False (drop) or a Dropped")
        return value if out else Dropped(self.reason)

    def process_many(self, elements: list[Element]) -> list[Any]:
        return [self.apply(e.payload, e.key) for e in elements]

    def __copy__(self) -> UserTransform:  # copies need no import path; pickles do
        out = UserTransform(self.op)
        out.host = self.host
        return out

    def __deepcopy__(self, memo: dict) -> UserTransform:
        return self.__copy__()

    def __reduce__(self) -> tuple:
        if self.path is None:
            raise ConfigError(
                f"operator {self.name!r} wraps {_local_name(self.fn)}, which worker processes "
                "cannot import: define it at module level in an importable module (and name "
                "it by import path), or run its stage in the driver (Execution(runners="
                f"{{{self.host!r}: 'threads'}}) or runner='inline')")
        return (_rebuild, (self.path, self.op.after, self.op.kind, dict(self.op.args),
                           self.op.version, self.name, self.op.reason, self.op.on_error))


def _rebuild(path: str, after: str, kind: str, args: dict, version: str, name: str,
             reason: str | None, on_error: str) -> UserTransform:
    return UserTransform(UserOp(path, after, kind, args, version, name, reason, on_error))


def _takes_rng(fn: Callable[..., Any]) -> bool:
    try:
        return "rng" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _local_name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def as_user_ops(items: Sequence[Any] | None) -> list[UserOp]:
    """A recipe's ``operators`` argument as `UserOp`s: each a `UserOp`, or its fields as a
    mapping (a recipe file's table, checked by `user_op_from_table`)."""
    out = []
    for i, item in enumerate(items or ()):
        if isinstance(item, UserOp):
            out.append(item)
        elif isinstance(item, Mapping):
            out.append(user_op_from_table(item, i))
        else:
            raise ConfigError(f"operators[{i}] is a {type(item).__name__}: give UserOp(fn, "
                              "after=..., kind=...) (a function or an operator object goes "
                              "in UserOp's fn)")
    return out


def user_ops_from_tables(tables: Any) -> list[UserOp]:
    """A recipe file's ``[[operators]]`` array of tables -> `UserOp`s."""
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError("operators must be an array of tables ([[operators]] with call = "
                          "\"package.module:function\", after = ...)")
    return [user_op_from_table(t, i) for i, t in enumerate(tables)]


def user_op_from_table(table: Mapping[str, Any], i: int = 0) -> UserOp:
    """One ``[[operators]]`` table -> a `UserOp`; an unknown or bad key is named."""
    where = f"[[operators]] #{i + 1}"
    unknown = sorted(set(table) - set(TABLE_KEYS))
    if unknown:
        raise UnknownKeyError(f"unknown key {unknown[0]!r} in {where}; known: "
                              f"{', '.join(TABLE_KEYS)}", unknown[0])
    if "call" not in table:
        raise ConfigError(f"{where} needs call = \"package.module:function\"")
    for key in ("after", "kind", "version", "name", "reason", "on_error"):
        if key in table and not isinstance(table[key], str):
            raise ConfigError(f"{where}: {key} must be a string, got {table[key]!r}")
    fields = {k: v for k, v in table.items() if k != "call"}
    try:
        import_callable(table["call"], "call")
        return UserOp(table["call"], **fields)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def insert_user_ops(ops: list[Operator], user: Sequence[UserOp],
                    points: Mapping[str, str], recipe: str) -> list[Operator]:
    """`ops` with each user operator inserted after the built-in operator its `after`
    names (`points`: an `AFTER` point -> that operator's name); several at one point run
    in the order given."""
    for u in user:
        if u.after not in points:
            raise ConfigError(f"operator {u.label()!r}: after = {u.after!r} is not a point of "
                              f"a {recipe} recipe; it takes {', '.join(points)}")
    out: list[Operator] = []
    for o in ops:
        out.append(o)
        out += [u.operator() for u in user if points[u.after] == o.name]
    return out
