"""`zephon-vl digest`: the SHA-256 of every global batch, one JSON line per step."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from zephon_core import ConfigError, Execution, Recipe
from zephon_vl.cli.common import add_execution_args, execution_from, positive_int
from zephon_vl.cli.registry import command


def check_operator_names(recipe: Recipe, execution: Execution) -> None:
    """Typed settings for an operator the recipe lacks are a mistake: refuse them."""
    from zephon_core.extend import unknown_operators

    problem = unknown_operators([*recipe.ops, *recipe.row_ops], execution)
    if problem:
        raise ConfigError(f"{problem} (check --workers / --runners)")


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
