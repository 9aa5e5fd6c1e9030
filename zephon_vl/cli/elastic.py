"""`zephon-vl elastic-demo`: the published elastic result, reproduced on CPU.

Simulated (default): an uninterrupted run on `--save-dp` ranks over
`--lanes` lanes, a checkpoint after `--save-at` steps, restored on each of
`--resume-dp`; the per-step digests are printed side by side. With
`--torchrun`, the same with real processes (gloo): one run on `--save-dp`
processes, resumed from its checkpoint on each `--resume-dp` process count.
Exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from zephon_vl.cli.common import positive_int, print_digest_table
from zephon_vl.cli.registry import command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default="text-demo")
    p.add_argument("--lanes", type=positive_int, default=None,
                   help="default: 64, or 8 with --torchrun")
    p.add_argument("--save-dp", type=positive_int, default=None,
                   help="default: 16, or 4 with --torchrun")
    p.add_argument("--resume-dp", default=None, help="default: 8,32,64, or 2,8 with --torchrun")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-at", type=int, default=3)
    p.add_argument("--torchrun", action="store_true", help="real processes with torchrun/gloo")
    p.add_argument("--ledger", default=None, metavar="PATH",
                   help="the saving run's ledger; each resume writes PATH.resumed-dN.jsonl")


def _simulated(args: argparse.Namespace, resume: list[int]) -> dict[int, dict[str, str]]:
    from zephon_core import Execution, load_recipe, run_digests
    table: dict[int, dict[str, str]] = {}
    reference = run_digests(lambda: load_recipe(args.recipe, num_lanes=args.lanes,
                                                global_batch_size=args.lanes),
                            args.save_dp, args.steps, Execution(runner="inline"),
                            args.save_at, resume, ledger=args.ledger)
    for rec in reference:
        col = f"D={rec.dp}" + ("" if rec.phase == "run" else " (resumed)")
        table.setdefault(rec.step, {})[col] = rec.sha256
        print(json.dumps(rec.report()), file=sys.stderr, flush=True)
    return table


def _torchrun(args: argparse.Namespace, resume: list[int]) -> dict[int, dict[str, str]]:
    from zephon_core import resumed_ledger_path

    table: dict[int, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="zephon-elastic-") as tmp:
        def launch(nproc: int, out: Path, *extra: str) -> dict[str, str]:
            out.mkdir()
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={nproc}", "-m", "zephon_vl.cli.elastic_job",
                   "--recipe", args.recipe, "--lanes", str(args.lanes),
                   "--steps", str(args.steps), "--out", str(out), *extra]
            print(f"$ torchrun --nproc_per_node={nproc} ... {' '.join(extra)}", file=sys.stderr,
                  flush=True)
            subprocess.run(cmd, check=True)
            return json.loads((out / "digests.json").read_text())

        first = Path(tmp, f"d{args.save_dp}")
        ledger = ("--ledger", args.ledger) if args.ledger else ()
        for t, d in launch(args.save_dp, first, "--save-at", str(args.save_at),
                           *ledger).items():
            table.setdefault(int(t), {})[f"D={args.save_dp}"] = d
        for d2 in resume:
            ledger = ("--ledger", str(resumed_ledger_path(args.ledger, d2))) \
                if args.ledger else ()
            got = launch(d2, Path(tmp, f"resume-d{d2}"), "--resume", str(first / "state.json"),
                         *ledger)
            for t, d in got.items():
                table[int(t)][f"D={d2} (resumed)"] = d
    return table


@command("elastic-demo", "save on D ranks, resume on others, compare every global digest",
         _args)
def cmd_elastic(args: argparse.Namespace) -> int:
    if args.torchrun:
        args.lanes = args.lanes or 8
        args.save_dp = args.save_dp or 4
        args.resume_dp = args.resume_dp or "2,8"
    else:
        args.lanes = args.lanes or 64
        args.save_dp = args.save_dp or 16
        args.resume_dp = args.resume_dp or "8,32,64"
    resume = [int(x) for x in args.resume_dp.split(",") if x]
    table = _torchrun(args, resume) if args.torchrun else _simulated(args, resume)
    cols = sorted({c for row in table.values() for c in row},
                  key=lambda c: (c.endswith("(resumed)"), int(c.split()[0][2:])))
    ok = print_digest_table(table, cols)
    print(f"{'all global batches identical' if ok else 'MISMATCH'} "
          f"(L={args.lanes}, saved at D={args.save_dp} after step {args.save_at - 1}, "
          f"resumed at D={args.resume_dp})")
    return 0 if ok else 1
