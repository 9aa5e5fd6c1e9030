"""`zephon-vl demo`: the main job, end to end on real photos.

Builds the demo data if needed, runs the `vlm-demo` recipe with a process
pool on `--dp` simulated ranks, saves the global state at `--save-at`,
resumes it on every `--resume-dp` (`zephon_core.engine.simulate.ElasticRun`),
and prints the per-step digests side by side with throughput and fill; with
`--ledger`, every run writes its ledger. Exits 1 if any digest differs.

The rate it prints is of *delivered* global batches (collated training
tensors) of the uninterrupted run after step 0: the clock stops when a batch
is made, before its digest is hashed (without `--ledger`; with it, each step
also writes its ledger line and the rate includes digests and ledger).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from zephon_core import ElasticRun, StepRecord, batch_digest
from zephon_vl.cli.common import (
    add_execution_args,
    execution_from,
    positive_int,
    print_digest_table,
)
from zephon_vl.cli.registry import command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-at", type=int, default=None,
                   help="checkpoint after this many steps (default: half of --steps)")
    p.add_argument("--lanes", type=positive_int, default=8)
    p.add_argument("--dp", type=positive_int, default=2, help="ranks of the uninterrupted run")
    p.add_argument("--resume-dp", default="1,4,8", help="rank counts to resume on")
    p.add_argument("--samples", type=int, default=2000, help="size of the demo data set")
    p.add_argument("--json", default=None, help="also write the summary as JSON here")
    p.add_argument("--ledger", default=None, metavar="PATH",
                   help="write the run's ledger here and each resume's beside it "
                   "(PATH.resumed-dN.jsonl); compare them with zephon-vl verify")
    add_execution_args(p)


@dataclass
class _Tally:
    """The per-step digests by rank count and the uninterrupted run's counters (the rates
    leave out step 0, whose time is the start-up)."""

    table: dict[int, dict[str, str]] = field(default_factory=dict)
    samples: int = 0
    images: int = 0
    tokens: int = 0
    t_first: float = 0.0
    steady: float = 0.0
    elapsed: float = 0.0

    def add(self, rec: StepRecord, save_at: int) -> None:
        """Record one step: a resumed one only fills its digest cell."""
        col = f"D={rec.dp}"
        if rec.phase != "run":
            self.table[rec.step][col] = rec.sha256
            if rec.step == save_at:
                print(f"resumed on D={rec.dp} from step {save_at} (restore and first "
                      f"step {rec.seconds:.2f}s)", flush=True)
            return
        self.elapsed += rec.seconds
        if rec.step == 0:
            self.t_first = rec.seconds
        else:
            self.steady += rec.seconds
            self.samples += rec.out.documents
            self.images += int(rec.out.batch["grid_thw"].shape[0])
            self.tokens += rec.tokens
        self.table.setdefault(rec.step, {})[col] = rec.sha256
        print(f"step {rec.step}: {rec.sha256[:16]}  ({self.elapsed:.1f}s)", flush=True)


def _build_data(args: argparse.Namespace) -> None:
    """Check `--save-at` (defaulting it to half the steps), then build or reuse the demo data
    so that the runs below time only the loader."""
    from zephon_core import ConfigError
    from zephon_vl.demo.data import build_demo_dataset
    from zephon_vl.media.image import pillow_backend

    if args.save_at is None:
        args.save_at = max(1, args.steps // 2)
    if not 1 <= args.save_at < args.steps:
        raise ConfigError(f"--save-at {args.save_at} must lie in [1, --steps) = [1, {args.steps}): "
                          "the resumed runs continue from the saved step")
    t0 = time.perf_counter()
    demo = build_demo_dataset(num_samples=args.samples)
    print(f"data: {demo.num_samples} samples, {demo.num_images} images in {len(demo.shards)} "
          f"shards at {demo.root} ({'built' if demo.built else 'reused'} in "
          f"{time.perf_counter() - t0:.1f}s); PIL backend: {pillow_backend()}", flush=True)


@command("demo", "end-to-end VLM demo: process pool, save on one D, resume on others", _args)
def cmd_demo(args: argparse.Namespace) -> int:
    from zephon_vl import vlm_demo

    _build_data(args)

    def make():
        return vlm_demo(num_lanes=args.lanes, num_samples=args.samples)

    resume = [int(x) for x in args.resume_dp.split(",") if x]
    tally = _Tally()
    with ElasticRun(make, execution_from(args), args.ledger) as run:
        print(run.ranks(args.dp, run.recipe).explain(), flush=True)
        records = run.run(args.dp, args.steps, args.save_at, resume) if args.ledger else \
            _timed_run(run, args.dp, args.steps, args.save_at, resume)
        for rec in records:
            tally.add(rec, args.save_at)
        if len(tally.table) < args.steps:
            print("data ran out before --steps", file=sys.stderr)
            return 1
    table = tally.table
    for t in range(args.save_at, args.steps):
        for d2 in resume:
            table[t].setdefault(f"D={d2}", "<end of data>")
    fill = tally.tokens / max(1, (args.steps - 1) * run.recipe.global_batch_size
                              * run.recipe.seq_len)
    print()
    ok = print_digest_table(table, [f"D={args.dp}"] + [f"D={d}" for d in resume])
    _report(args, ok, tally, fill)
    return 0 if ok else 1


def _report(args: argparse.Namespace, ok: bool, tally: _Tally, fill: float) -> None:
    """The demo's closing lines (rates over the steps after the first) and its JSON."""
    steady = tally.steady
    summary = {
        "ok": ok, "steps": args.steps, "save_at": args.save_at, "lanes": args.lanes,
        "steps_per_s": (args.steps - 1) / steady if steady else 0.0,
        "samples_per_s": tally.samples / steady if steady else 0.0,
        "images_per_s": tally.images / steady if steady else 0.0,
        "tokens_per_s": tally.tokens / steady if steady else 0.0,
        "fill": fill, "first_batch_s": tally.t_first,
        "digests": {str(t): r for t, r in tally.table.items()},
    }
    timing = ("with digests and ledger in the clock" if args.ledger
              else "digests hashed outside the clock")
    print(f"\ndelivered global batches after step 0 (collated, {timing}): "
          f"{summary['steps_per_s']:.2f} steps/s, {summary['samples_per_s']:.1f} samples/s, "
          f"{summary['images_per_s']:.1f} images/s, {summary['tokens_per_s']:.0f} tokens/s; "
          f"fill {fill:.1%}; first batch {tally.t_first:.1f}s")
    print("digests identical across rank counts and resumes" if ok else
          "MISMATCH: a resumed or re-sharded run saw different batches")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


def _timed_run(run: ElasticRun, dp: int, steps: int, save_at: int,
               resume: list[int]) -> Iterator[StepRecord]:
    """`run.run` with each uninterrupted step timed up to its delivered batch: the digest is
    hashed after the clock stops (the resumes only need digests)."""
    sim = run.ranks(dp, run.recipe)
    capacity = sim.recipe.global_batch_size * sim.recipe.seq_len
    for t in range(steps):
        if t == save_at:
            run.state = sim.state_json()
        t0 = time.perf_counter()
        out = sim.global_step()
        seconds = time.perf_counter() - t0
        if out is None:
            return
        yield StepRecord(t, batch_digest(out.batch), dp, "run", sim.recipe.global_batch_size,
                         out.tokens, out.tokens / capacity, out.drops, seconds, out)
    if run.state is None:
        run.state = sim.state_json()
    for d2 in resume:
        yield from run.resume(run.state, d2, steps, f"resumed@{save_at}")
