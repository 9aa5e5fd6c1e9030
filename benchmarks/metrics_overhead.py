"""What loader metrics cost per step (docs/observability.md quotes it).

    python -m zephon_bench.metrics_overhead --recipe vlm-demo --steps 12

Measured as *work added*, exactly, because an end-to-end A/B of well under a
percent drowns in a shared machine's noise: a loader runs `--steps` steps on the
inline runner (every stage in the calling thread), keeping each step's rows,
drops and stage events; then a fresh `MetricsRecorder` of that loader is fed the
very same inputs (the consumer's two clock reads, every stage event, the step's
rows) and timed, with the lanes' span per group, once without snapshots
(the cost every step pays) and once with a full snapshot at *every* step (the
most ``metrics_every=1`` asks for). The share is that time over the loader's own
step time (without collation, so the share is an upper bound).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from zephon_core import Execution, Loader, StageEvent, load_recipe
from zephon_core.internals import WAIT_WARN_SHARE, recorder_for


def measure(recipe_name: str, steps: int, repeats: int) -> dict:
    recipe = load_recipe(recipe_name)
    events: list[StageEvent] = []
    per_step: list[tuple[list, list, list[StageEvent]]] = []
    step_s: list[float] = []
    with Loader(recipe, execution=Execution(runner="inline"), observer=events.append) as loader:
        for _ in range(steps):
            t0 = time.perf_counter()
            rows = loader.next_rows()
            step_s.append(time.perf_counter() - t0)
            assert rows is not None and loader.last_meta is not None
            per_step.append((rows, loader.last_meta.drops, list(events)))
            events.clear()
        costs: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeats):
            for snapshots in (False, True):
                recorder = recorder_for(loader, WAIT_WARN_SHARE)
                add = recorder.events.add  # what the lanes call, with a span per group
                t0 = time.perf_counter()
                for k, (rows, drops, evs) in enumerate(per_step):
                    recorder.next_started(time.monotonic())
                    for e in evs:
                        add((e.stage, time.monotonic(), time.monotonic(), len(e.origins)))
                    recorder.delivered(k, rows, drops)
                    recorder.next_returned(time.monotonic())
                    if snapshots:
                        recorder.snapshot()
                costs[snapshots].append((time.perf_counter() - t0) / steps)
    warm = step_s[1:] or step_s  # the first step starts the pipeline
    step = statistics.median(warm)
    always = min(costs[False])
    every = min(costs[True])
    return {"recipe": recipe_name, "steps": steps, "step_s": step,
            "events_per_step": statistics.mean(len(e) for _, _, e in per_step),
            "recording_s_per_step": always, "share_of_step": always / step,
            "snapshot_s": every - always, "share_with_snapshot_every_step": every / step}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", action="append", default=[],
                   help="built-in recipe(s) (default: vlm-demo and text-demo)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default="")
    args = p.parse_args()
    out = [measure(r, args.steps, args.repeats) for r in args.recipe or ["vlm-demo", "text-demo"]]
    for m in out:
        print(f"{m['recipe']}: step {1000 * m['step_s']:.1f} ms (inline, no collate), "
              f"{m['events_per_step']:.0f} stage events/step; recording "
              f"{1e6 * m['recording_s_per_step']:.0f} us/step = "
              f"{100 * m['share_of_step']:.3f}% of the step; a snapshot "
              f"{1e6 * m['snapshot_s']:.0f} us (every step: "
              f"{100 * m['share_with_snapshot_every_step']:.3f}%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
