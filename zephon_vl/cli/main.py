"""The `zephon-vl` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from zephon_core import (
    Coalesce,
    ConfigError,
    Execution,
    Recipe,
    RetryPolicy,
    ZephonError,
    parse_resources,
    parse_runners,
    parse_workers,
)
from zephon_core.engine.runners import RUNNERS

Command = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Command]] = {}


def command(name: str, help_text: str, configure: Callable[[argparse.ArgumentParser], None]):
    def wrap(fn: Command) -> Command:
        COMMANDS[name] = (help_text, configure, fn)
        return fn
    return wrap


def add_execution_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("execution (never changes the data; defaults are Execution's)")
    g.add_argument("--runner", choices=["auto", *RUNNERS],
                   default=Execution.runner, help="default runner of every operator (auto: each "
                   "operator's own: processes for read, decode and tokenize, fused into one stage)")
    g.add_argument("--workers", action="append", default=[], metavar="OP=N",
                   help="workers of one operator, e.g. --workers tokenize=2 (repeatable); "
                   "--workers auto: split the worker budget over the process stages by "
                   "measured cost while the loader runs")
    g.add_argument("--default-workers", type=int, default=Execution.default_workers,
                   help="workers of every operator without --workers (default: usable cores "
                   "// ranks on this machine for process stages, one thread for thread stages)")
    g.add_argument("--op-runner", action="append", default=[], metavar="OP=KIND",
                   help="runner of one operator, e.g. --op-runner read=threads")
    g.add_argument("--ray-address", default=Execution.ray_address, metavar="HOST:PORT",
                   help="with --runner ray: the Ray cluster's head (default: RAY_ADDRESS, "
                   "else the latest cluster started on this machine, else a local one)")
    g.add_argument("--ray-resources", action="append", default=[], metavar="NAME=N",
                   help="with --runner ray: a custom resource every task asks for, e.g. "
                   "--ray-resources zephon_cpu=1 (only nodes offering it run zephon tasks)")
    g.add_argument("--group-size", type=int, default=Execution.group_size)
    g.add_argument("--prefetch", type=int, default=Execution.prefetch,
                   help="groups in flight per lane and stage (default: two per worker over the "
                   "rank's lanes, at least 2)")
    g.add_argument("--prefetch-steps", type=int, default=Execution.prefetch_steps)
    g.add_argument("--retry-deadline", type=float, default=RetryPolicy.deadline,
                   metavar="SECONDS", help="keep retrying a failing read from a URL this "
                   "long, then stop naming the shard and offset (never a skipped sample)")
    g.add_argument("--coalesce-bytes", type=int, default=Coalesce.max_bytes, metavar="BYTES",
                   help="largest range request that merges neighbouring samples of one "
                   "remote shard (0: one request per sample)")
    g.add_argument("--backlog-mb", type=int, default=(Execution.backlog_bytes or 0) >> 20,
                   help="MiB of finished documents a rank's lanes may hold before they stop "
                   "drawing (backpressure; 0: no bound)")
    g.add_argument("--stall-seconds", type=float, default=Execution.stall_seconds or 0,
                   metavar="SECONDS", help="log each lane's drops by reason after this long "
                   "without a new row, repeated while it lasts (0: never)")
    g.add_argument("--stall-drops", type=int, default=Execution.stall_drops or 0, metavar="N",
                   help="stop with an error naming the reasons when a lane drops N samples "
                   "in a row, e.g. every sample longer than seq_len (0: never)")


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
    from zephon_core.engine.plan import unknown_operators

    problem = unknown_operators(recipe.ops, execution)
    if problem:
        raise ConfigError(f"{problem} (check --workers / --op-runner)")


def execution_from(args: argparse.Namespace) -> Execution:
    return Execution(runner=args.runner, workers=parse_workers(args.workers),
                     runners=parse_runners(args.op_runner), default_workers=args.default_workers,
                     group_size=args.group_size, prefetch=args.prefetch,
                     prefetch_steps=args.prefetch_steps,
                     retry=RetryPolicy(deadline=args.retry_deadline),
                     coalesce=Coalesce(max_bytes=args.coalesce_bytes),
                     backlog_bytes=(args.backlog_mb << 20) or None,
                     stall_seconds=args.stall_seconds or None, stall_drops=args.stall_drops or None,
                     ray_address=args.ray_address or None,
                     ray_resources=parse_resources(args.ray_resources))


def recipe_factory(args: argparse.Namespace) -> Callable:
    from zephon_core import load_recipe

    return lambda: load_recipe(args.recipe, num_lanes=args.lanes)


def _digest_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default="text-demo", help="built-in name or TOML file")
    p.add_argument("--lanes", type=int, default=None, help="L (default: the recipe's)")
    p.add_argument("--dp", type=int, default=1, help="simulated data-parallel ranks D")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-at", type=int, default=None, help="checkpoint after this many steps")
    p.add_argument("--resume-dp", default=None,
                   help="restore the checkpoint on these rank counts (comma-separated)")
    p.add_argument("--state-out", default=None, help="also write the checkpoint JSON here")
    p.add_argument("--resume-global-batch-size", type=int, default=None, metavar="G",
                   help="the resumes take G rows per step from --save-at on (a multiple of "
                        "L): same lane rows, other step boundaries (docs/elastic-changes.md)")
    p.add_argument("--resume-lanes", type=int, default=None, metavar="L2",
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
    resume = [int(x) for x in args.resume_dp.split(",")] if args.resume_dp else None

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
        print(json.dumps(rec.to_json()), flush=True)
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
