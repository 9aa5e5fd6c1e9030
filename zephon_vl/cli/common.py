"""What several commands share: one flag per `Execution` setting and the `Execution` they
give, an argparse type for counts, and the side-by-side table of step digests."""

from __future__ import annotations

import argparse

from zephon_core import Execution
from zephon_core.extend import FlatSetting, flat_settings


def add_execution_args(p: argparse.ArgumentParser, cls: type[Execution] = Execution) -> None:
    """One flag per `Execution` setting, made from its declaration (`flat_settings`): the
    same names (``--retry-deadline`` is ``Execution.retry.deadline``), units and spellings
    as the TorchTitan config's fields. `cls`: `Execution` or a subclass with more."""
    g = p.add_argument_group("execution (never changes the data; defaults are Execution's)")
    for s in flat_settings(cls):
        g.add_argument(s.flag, dest=s.name, default=None,
                       action="append" if s.mapping else "store",
                       choices=s.info.choices or None,
                       metavar=None if s.info.choices else _metavar(s),
                       help=f"{s.info.help} [{'' if s.info.choices else s.describe_type() + '; '}"
                            f"default: {s.spell(s.default) or 'none'}"
                            + ("; repeatable]" if s.mapping else "]"))


def _metavar(s: FlatSetting) -> str | None:
    if s.info.metavar:
        return s.info.metavar
    if s.annotation is bool:
        return "true|false"
    return {"bytes": "BYTES", "seconds": "SECONDS"}.get(s.info.unit, "N" if s.info.unit else None)


def execution_from(args: argparse.Namespace, cls: type[Execution] = Execution) -> Execution:
    """The `Execution` (or subclass `cls`) of the flags given (the others: its defaults),
    via `from_flat`."""
    flat = {}
    for s in flat_settings(cls):
        value = getattr(args, s.name, None)
        if value is not None:
            flat[s.name] = ",".join(value) if s.mapping else value
    return cls.from_flat(flat)


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a lane or rank count)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def print_digest_table(table: dict[int, dict[str, str]], cols: list[str]) -> bool:
    """Digests of each step side by side, one column per run; True if every row agrees."""
    width = max(18, *(len(c) + 2 for c in cols))
    print("step  " + "  ".join(f"{c:<{width}}" for c in cols) + "  same")
    ok = True
    for t in sorted(table):
        row = table[t]
        same = len(set(row.values())) == 1
        ok &= same
        print(f"{t:<5} " + "  ".join(f"{row.get(c, '-')[:16]:<{width}}" for c in cols)
              + f"  {'yes' if same else 'NO'}")
    return ok
