"""What the per-step ledger costs on the `vlm-demo` pipeline.

    python -m zephon_bench.ledger_overhead --steps 8 --repeats 3 --json out.json

Two measurements, because on a small shared machine an end-to-end A/B of
a few percent drowns in noise:

* **Work added**, exact: the inline runner does every stage in one thread,
  so per delivered step the ledger's work is the sample digests (what the
  workers compute, `sample_digest` over each sample's payload) plus the
  driver's share (`lane_entries` + `step_entry` + the JSON line), timed on
  the very rows of the run, against the step's time without the ledger.
  With process workers the digests run beside decode and tokenize, so their
  share of the step is at most this fraction.
* **End to end**: the median step time with and without the ledger, runs
  interleaved (A B A B ...), on the runner given (``--runner``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from zephon_core import ElasticRun, Execution
from zephon_core.internals import lane_entries, reader_keys, sample_digest, step_entry


def _make(lanes: int):
    from zephon_vl import vlm_demo

    return lambda: vlm_demo(num_lanes=lanes)


def _steps(make, ex: Execution, steps: int, ledger: Path | None) -> list[float]:
    with ElasticRun(make, ex, ledger) as run:
        return [rec.seconds for rec in run.run(1, steps)][1:]


def work_added(make, steps: int) -> dict:
    """Per step (after the first): digest and ledger-line time vs the inline step time."""
    ex = Execution(runner="inline")
    with ElasticRun(make, ex) as run:
        sim = run.ranks(1, run.recipe)
        keys = reader_keys(sim.recipe)
        lanes, r = sim.loaders[0].lanes, sim.recipe.rows_per_lane
        step_s, digest_s, driver_s = [], [], []
        for t in range(steps):
            t0 = time.perf_counter()
            out = sim.global_step()
            step = time.perf_counter() - t0
            if out is None:
                break
            t1 = time.perf_counter()
            for row in out.rows:
                row.digests = [sample_digest(s.payload) for s in row.segments]
            t2 = time.perf_counter()
            line = json.dumps(step_entry(t, lane_entries(lanes, r, out.rows, keys)),
                              sort_keys=True)
            t3 = time.perf_counter()
            if t:
                step_s.append(step)
                digest_s.append(t2 - t1)
                driver_s.append(t3 - t2)
    total = sum(step_s)
    return {"steps": len(step_s), "step_s": total / len(step_s),
            "digest_s": sum(digest_s) / len(step_s), "driver_s": sum(driver_s) / len(step_s),
            "line_bytes": len(line),
            "fraction": (sum(digest_s) + sum(driver_s)) / total}


def end_to_end(make, ex: Execution, steps: int, repeats: int) -> dict:
    off: list[float] = []
    on: list[float] = []
    with tempfile.TemporaryDirectory(prefix="zephon-ledger-bench-") as tmp:
        for i in range(repeats):
            off += _steps(make, ex, steps, None)
            on += _steps(make, ex, steps, Path(tmp, f"l{i}.jsonl"))
    a, b = statistics.median(off), statistics.median(on)
    return {"median_step_s_without": a, "median_step_s_with": b, "overhead": b / a - 1,
            "samples": len(off)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--runner", default="auto")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    make = _make(args.lanes)
    report = {"work_added": work_added(make, args.steps),
              "end_to_end": end_to_end(make, Execution(runner=args.runner), args.steps,
                                       args.repeats),
              "config": vars(args)}
    w, e = report["work_added"], report["end_to_end"]
    print(f"work added per step: digests {w['digest_s'] * 1e3:.1f} ms + ledger line "
          f"{w['driver_s'] * 1e3:.1f} ms on an inline step of {w['step_s'] * 1e3:.0f} ms = "
          f"{w['fraction']:.2%} ({w['line_bytes']} bytes per line)")
    print(f"end to end ({args.runner}, median of {e['samples']} steps): "
          f"{e['median_step_s_without'] * 1e3:.0f} ms without, "
          f"{e['median_step_s_with'] * 1e3:.0f} ms with the ledger ({e['overhead']:+.1%})")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
