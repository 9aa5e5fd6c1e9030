"""`zephon-vl verify LEDGER_A LEDGER_B`: did two runs see the same batches?

Compares the steps both ledgers hold (`zephon_core.engine.ledger.compare_ledgers`):
exit 0 when they agree, 1 with the first divergent step, lane, row and
sample and what differs; 2 when the ledgers cannot be compared (another
recipe: the fingerprint field is named; not a ledger).
"""

from __future__ import annotations

import argparse

from zephon_core import Ledger
from zephon_core.internals import mixture_shares
from zephon_vl.cli.registry import command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="LEDGER_A")
    p.add_argument("b", metavar="LEDGER_B", nargs="?", default=None,
                   help="omit with --mixture to only show LEDGER_A's mixture")
    p.add_argument("--mixture", action="store_true",
                   help="also print each step's realized mixture (token and sample shares per "
                        "dataset, with the phase the recipe schedules for the step)")


@command("verify", "compare two ledgers; name the first step, lane, row and sample that differ",
         _args)
def cmd_verify(args: argparse.Namespace) -> int:
    from zephon_core import compare_ledgers, read_ledger

    a = read_ledger(args.a)
    if args.mixture:
        print(render_mixture(a))
    if args.b is None:
        if not args.mixture:
            print("verify needs LEDGER_B (or --mixture to show LEDGER_A's mixture)")
            return 2
        return 0
    b = read_ledger(args.b)
    result = compare_ledgers(a, b)
    if not result.common:
        print(f"no common steps: A holds {_span(list(a.steps))}, B holds {_span(list(b.steps))}")
        return 1
    if result.divergence is not None:
        print(f"A = {args.a}\nB = {args.b}")
        print(result.divergence.describe())
        return 1
    print(f"verified {len(result.common)} common steps ({_span(result.common)}): identical")
    return 0


def _span(steps: list[int]) -> str:
    return f"steps {min(steps)}..{max(steps)}" if steps else "no steps"


def render_mixture(ledger: Ledger) -> str:
    """One line per step: the phase the schedule gives the step, the phases its samples
    were drawn in, and the realized token/sample shares."""
    fp = ledger.fingerprint
    names = [d["name"] for d in fp.get("datasets", [])]
    starts = [0] + [p["start_step"] for p in fp.get("phases", [])
                    if p["start_step"] > 0 and "weights" in p]
    out = ["step  phase  drawn in  rows  " + "  ".join(f"{n} tokens/samples" for n in names)]
    for t in sorted(ledger.steps):
        entry = ledger.steps[t]
        tok = mixture_shares(entry, names, "tokens")
        smp = mixture_shares(entry, names, "samples")
        phase = sum(1 for s in starts[1:] if s <= t)
        drawn = ",".join(map(str, (entry.get("mixture") or {}).get("phases", [0])))
        out.append(f"{t:<5} {phase:<6} {drawn:<9} {len(entry['rows']):<5} "
                   + "  ".join(f"{tok[n]:.3f}/{smp[n]:.3f}" for n in names))
    return "\n".join(out)
