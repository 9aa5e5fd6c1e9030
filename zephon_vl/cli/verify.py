"""`zephon-vl verify LEDGER_A LEDGER_B`: did two runs see the same batches?

Compares the steps both ledgers hold (`zephon_core.engine.ledger.compare_ledgers`):
exit 0 when they agree, 1 with the first divergent step, lane, row and
sample and what differs; 2 when the ledgers cannot be compared (another
recipe: the fingerprint field is named; not a ledger).
"""

from __future__ import annotations

import argparse

from zephon_vl.cli.main import command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="LEDGER_A")
    p.add_argument("b", metavar="LEDGER_B")


@command("verify", "compare two ledgers; name the first step, lane, row and sample that differ",
         _args)
def cmd_verify(args: argparse.Namespace) -> int:
    from zephon_core.engine.ledger import compare_ledgers, read_ledger

    a, b = read_ledger(args.a), read_ledger(args.b)
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
