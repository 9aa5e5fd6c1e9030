"""The `zephon-vl` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from zephon_core import ConfigError, Execution, Recipe, ZephonError
from zephon_core.extend import FlatSetting, flat_settings

Command = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Command]] = {}


def command(name: str, help_text: str, configure: Callable[[argparse.ArgumentParser], None]):
    def wrap(fn: Command) -> Command:
        COMMANDS[name] = (help_text, configure, fn)
        return fn
    return wrap


def add_execution_args(p: argparse.ArgumentParser) -> None:
    """One flag per `Execution` setting, made from its declaration (`flat_settings`): the
    same names (``--retry-deadline`` is ``Execution.retry.deadline``), units and spellings
    as the TorchTitan config's fields."""
    g = p.add_argument_group("execution (never changes the data; defaults are Execution's)")
    for s in flat_settings(Execution):
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


def check_operator_names(recipe: Recipe, execution: Execution) -> None:
    """Typed settings for an operator the recipe lacks are a mistake: refuse them."""
    from zephon_core.extend import unknown_operators

    problem = unknown_operators(recipe.ops, execution)
    if problem:
        raise ConfigError(f"{problem} (check --workers / --runners)")


def execution_from(args: argparse.Namespace) -> Execution:
    """The `Execution` of the flags given (the others: its defaults), via `from_flat`."""
    flat = {}
    for s in flat_settings(Execution):
        value = getattr(args, s.name, None)
        if value is not None:
            flat[s.name] = ",".join(value) if s.mapping else value
    return Execution.from_flat(flat)


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a lane or rank count)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def positive_ints(text: str) -> list[int]:
    """An argparse type: comma-separated integers >= 1 (rank counts)."""
    return [positive_int(x) for x in text.split(",") if x.strip()] or [positive_int(text)]


def recipe_factory(args: argparse.Namespace) -> Callable:
    from zephon_core import load_recipe

    return lambda: load_recipe(args.recipe, num_lanes=args.lanes)


def _digest_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default="text-demo", help="built-in name or TOML file")
    p.add_argument("--lanes", type=positive_int, default=None,
                   help="L (default: the recipe's)")
    p.add_argument("--dp", type=positive_int, default=1, help="simulated data-parallel ranks D")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-at", type=int, default=None, help="checkpoint after this many steps")
    p.add_argument("--resume-dp", type=positive_ints, default=None,
                   help="restore the checkpoint on these rank counts (comma-separated)")
    p.add_argument("--state-out", default=None, help="also write the checkpoint JSON here")
    p.add_argument("--resume-global-batch-size", type=int, default=None, metavar="G",
                   help="the resumes take G rows per step from --save-at on (a multiple of "
                        "L): same lane rows, other step boundaries (docs/elastic-changes.md)")
    p.add_argument("--resume-lanes", type=positive_int, default=None, metavar="L2",
                   help="the resumes run the recipe with L2 lanes: the checkpoint's remaining "
                        "work is re-dealt to them (docs/elastic-changes.md)")
    p.add_argument("--explain", action="store_true", help="print the plan to stderr first")
    p.add_argument("--ledger", default=None, metavar="PATH",
                   help="write the per-step ledger here (resumes: PATH.resumed-dN.jsonl)")
    add_execution_args(p)


@command("digest", "print the SHA-256 of every global batch, one JSON line per step", _digest_args)
def cmd_digest(args: argparse.Namespace) -> int:
    from zephon_core import Loader, run_digests

    make = recipe_factory(args)
    ex = execution_from(args)
    check_operator_names(make(), ex)
    if args.explain:
        with Loader(make(), 0, args.dp, ex) as probe:
            print(probe.explain(), file=sys.stderr)
    resume = args.resume_dp

    def keep_state(state: str) -> None:
        if args.state_out:
            with open(args.state_out, "w") as f:
                f.write(state)

    relane = None
    if args.resume_lanes is not None:
        from zephon_core import load_recipe

        relane = lambda: load_recipe(args.recipe, num_lanes=args.resume_lanes)  # noqa: E731
    for rec in run_digests(make, args.dp, args.steps, ex, args.save_at, resume, keep_state,
                           args.ledger, args.resume_global_batch_size, relane):
        print(json.dumps(rec.report()), flush=True)
    return 0


def _tokenizer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, help="folder (default: the zephon cache)")


@command("tokenizer", "build the bundled Qwen3.6 tokenizer folder and print its path",
         _tokenizer_args)
def cmd_tokenizer(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zephon_core import qwen_tokenizer_dir

    print(qwen_tokenizer_dir(Path(args.out) if args.out else None))
    return 0


def main(argv: list[str] | None = None) -> int:
    import zephon_vl.cli.commands  # noqa: F401  (registers the commands of the other modules)

    parser = argparse.ArgumentParser(prog="zephon-vl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, configure, _) in COMMANDS.items():
        configure(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][2](args)
    except ZephonError as exc:
        print(f"zephon-vl {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # `python -m zephon_vl.cli.main`: the commands register into the imported module,
    # not into this __main__ copy of it.
    from zephon_vl.cli.main import main as imported_main

    sys.exit(imported_main())
