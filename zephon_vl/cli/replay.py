"""`zephon-vl replay STATE --steps N --dp D`: recompute the steps after a checkpoint, offline.

Restores STATE (a state JSON or a TorchTitan DCP checkpoint folder, see
`inspect`) on `D` simulated ranks (any `D` dividing `L`), with the recipe
the checkpoint names (a built-in or `--recipe` for a TOML file), and
computes the next `N` steps' ledger lines; `--ledger OUT` writes them,
`--against LEDGER` compares them with a ledger of the real run: "verified N
steps" (exit 0) or the first divergence (exit 1).
"""

from __future__ import annotations

import argparse

from zephon_vl.cli.common import add_execution_args, execution_from, positive_int
from zephon_vl.cli.registry import command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("state", help="a state JSON file or a TorchTitan DCP checkpoint folder")
    p.add_argument("--steps", type=int, required=True, help="steps to recompute")
    p.add_argument("--dp", type=positive_int, default=1, help="simulated ranks (must divide L)")
    p.add_argument("--recipe", default=None,
                   help="built-in name or TOML file (default: the name in the checkpoint)")
    p.add_argument("--ledger", default=None, metavar="OUT", help="write the replayed ledger")
    p.add_argument("--against", default=None, metavar="LEDGER",
                   help="compare the replayed steps with this ledger")
    add_execution_args(p)


def recipe_for(fp: dict, name: str | None):
    """A factory of the recipe a checkpoint was made with (its fingerprint's settings)."""
    from zephon_core import load_recipe

    kwargs = {"num_lanes": fp["num_lanes"], "global_batch_size": fp["global_batch_size"],
              "seq_len": fp["seq_len"], "seed": fp["seed"]}
    if fp.get("epochs") is not None:
        kwargs["epochs"] = fp["epochs"]
    return lambda: load_recipe(name or fp["recipe"], **kwargs)


@command("replay", "recompute the next N steps of a checkpoint offline and check them", _args)
def cmd_replay(args: argparse.Namespace) -> int:
    from zephon_core import ElasticRun, Ledger, LedgerError, compare_ledgers, read_ledger
    from zephon_core.internals import compare_entries
    from zephon_vl.cli.inspect import read_state
    from zephon_vl.cli.progress import Progress

    state = read_state(args.state)
    start = int(state["step"])
    against = read_ledger(args.against) if args.against else None
    with ElasticRun(recipe_for(state["fingerprint"], args.recipe), execution_from(args),
                    digests=True) as run:
        if against is not None:
            compare_ledgers(against, Ledger("the checkpoint", run.recipe.fingerprint()))
        lines = []
        with Progress("zephon-vl replay", args.steps, "steps") as progress:
            for rec in run.resume(state, args.dp, start + args.steps, ledger=args.ledger):
                lines.append(rec.out.ledger)
                progress.advance()
    print(f"replayed steps {start}..{start + len(lines) - 1} on D={args.dp}"
          + (f"; ledger written to {args.ledger}" if args.ledger else ""))
    if len(lines) < args.steps:
        print(f"the data ended after {len(lines)} of {args.steps} steps")
    if against is None:
        return 0
    missing = [e["step"] for e in lines if e["step"] not in against.steps]
    divergence = compare_entries(lines, against.steps)
    if divergence is not None:
        print(divergence.describe() + f" (A = replay, B = {args.against})")
        return 1
    checked = len(lines) - len(missing)
    if checked == 0:
        raise LedgerError(f"{args.against} holds none of the replayed steps "
                          f"{start}..{start + len(lines) - 1}")
    print(f"verified {checked} steps against {args.against}"
          + (f" ({len(missing)} replayed steps are not in it)" if missing else ""))
    return 0
