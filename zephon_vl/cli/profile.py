"""`zephon-vl profile --recipe R`: which stage holds the loader back, and a worker split.

Runs the recipe's loader for `--steps` steps after `--warmup` steps (which start
the workers) with a consumer that does nothing, so every second is the loader's,
and reads its `LoaderMetrics` (docs/observability.md): each stage's busy
worker-seconds and utilisation. The bottleneck is the busiest stage. The
recommended split gives the usable cores to the process stages (else the thread
stages) in proportion to the worker-seconds each used per step, at least one each:
the arithmetic of ``--workers auto``, which applies it while the loader runs
(`zephon_core.engine.autoscale`).

CPU per sample is what the workers measured around each operator
(`Runner.cpu_seconds`: the worker thread's CPU clock for inline and thread
stages, the worker process's for process stages) over the measured steps,
divided by the elements the stage finished then. Driver stages (shuffle,
pack) report the driver thread's seconds on them. The driver's share is this
process's CPU over the measured steps (`time.process_time`), less the thread
stages' work, per delivered sample and as a share of all the CPU measured.
The slowest step's timeline is every stage's groups (the loader's stage
observer) that overlap the longest ``next()`` call.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from zephon_core import RunnerKind
from zephon_vl.cli.common import add_execution_args, execution_from
from zephon_vl.cli.registry import command

#: the runners whose stages have workers of their own in this machine, measured by CPU
_WORKER_KINDS = (RunnerKind.THREADS, RunnerKind.PROCESSES)


def recommend_split(stages: list[Any], cores: int) -> dict[str, int]:
    """Workers per worker stage, proportional to its busy seconds: the arithmetic of
    `Execution(workers="auto")` (`zephon_core.engine.autoscale`). With process stages the
    cores go to them, and a thread stage keeps its threads: it runs in the loader's own
    process (the VLM recipes' planning thread), and a core of its own would be taken from
    the decode on a small machine. With thread stages only (text on threads) they share
    the cores."""
    from zephon_core.internals import split_workers

    pooled = [s for s in stages if s.runner == RunnerKind.PROCESSES]
    if not pooled:
        return split_workers({s.name: s.busy_s for s in stages
                              if s.runner in _WORKER_KINDS}, cores)
    split = split_workers({s.name: s.busy_s for s in pooled}, cores)
    return {s.name: split.get(s.name, s.workers) for s in stages
            if s.runner in _WORKER_KINDS}


def workers_flags(split: dict[str, int]) -> str:
    """``--workers op=N`` for every operator of every stage (fused stages keep one count)."""
    return " ".join(f"--workers {op}={n}" for name, n in split.items() for op in name.split("+"))


def _cpu(runners: dict[int, Any]) -> dict[int, tuple[float, ...]]:
    return {i: r.cpu_seconds() for i, r in runners.items()}


def stage_report(m: Any, plan: Any, before: dict[int, tuple[float, ...]],
                 after: dict[int, tuple[float, ...]]) -> list[dict[str, Any]]:
    """Each stage of `m` (a `LoaderMetrics` window) with its CPU per element from the
    runners' meters read at the window's start (`before`) and end (`after`)."""
    out = []
    for st, s in zip(plan.stages, m.stages, strict=True):
        ops = [o.name for o in st.ops]
        per = max(s.elements, 1)
        row: dict[str, Any] = {"name": s.name, "runner": s.runner, "workers": s.workers,
                               "elements": s.elements, "busy_s": s.busy_s,
                               "utilisation": s.utilisation}
        was, now = before.get(st.index), after.get(st.index)
        if now:  # measured by the runner
            was = was or ()
            secs = [v - (was[k] if k < len(was) else 0.0) for k, v in enumerate(now)]
            row["cpu_s"] = sum(secs)
            row["cpu_clock"] = "process" if s.runner == RunnerKind.PROCESSES else "thread"
            row["operators"] = {op: 1000 * v / per for op, v in zip(ops, secs, strict=False)}
        else:  # a driver stage (or one whose runner does not measure): the driver's seconds
            row["cpu_s"] = s.busy_s
            row["cpu_clock"] = "driver wall" if s.runner == "driver" else "busy wall"
            row["operators"] = {s.name: 1000 * s.busy_s / per}
        row["cpu_ms_per_sample"] = 1000 * row["cpu_s"] / per
        out.append(row)
    return out


def slowest_step(steps: list[tuple[float, float]], events: list[Any],
                 first_step: int) -> dict[str, Any]:
    """The longest ``next()`` of `steps` ((call, return) times) and every stage group that
    overlaps it, as seconds from the call."""
    k = max(range(len(steps)), key=lambda i: steps[i][1] - steps[i][0])
    lo, hi = steps[k]
    spans = [{"stage": e.stage, "name": e.name, "runner": e.runner, "lane": e.lane,
              "start": max(e.start, lo) - lo, "end": min(e.end, hi) - lo}
             for e in events if e.end > lo and e.start < hi]
    return {"step": first_step + k, "seconds": hi - lo, "spans": spans}


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default="vlm-demo", help="built-in name or TOML file")
    p.add_argument("--steps", type=int, default=10, help="steps measured")
    p.add_argument("--warmup", type=int, default=2, help="steps run first and not measured")
    p.add_argument("--cores", type=int, default=0,
                   help="cores to split among the worker stages (default: usable cores)")
    p.add_argument("--png", default="", metavar="PATH",
                   help="the stages' bars and the slowest step's timeline")
    p.add_argument("--json", default="", metavar="PATH", help="the measurements as JSON")
    add_execution_args(p)


@command("profile", "find the loader's bottleneck stage and recommend a worker split", _args)
def cmd_profile(args: argparse.Namespace) -> int:
    from zephon_core import ConfigError, Loader, load_recipe
    from zephon_core.extend import usable_cores
    from zephon_vl.cli.progress import Progress

    if args.steps < 1 or args.warmup < 0:
        raise ConfigError("zephon-vl profile: --steps must be >= 1 and --warmup >= 0")
    recipe = load_recipe(args.recipe)
    events: list[Any] = []
    with Loader(recipe, execution=execution_from(args), wait_warn_share=None,
                observer=events.append) as loader, \
            Progress("zephon-vl profile", args.warmup + args.steps, "steps") as progress:
        for _ in range(args.warmup):
            next(loader)
            progress.advance(note="warm-up")
        loader.metrics()  # closes the warm-up window
        first = loader.step
        del events[:]
        cpu0, proc0 = _cpu(loader.runners), time.process_time()
        steps: list[tuple[float, float]] = []
        t0 = time.perf_counter()
        for _ in range(args.steps):
            call = time.monotonic()
            next(loader)
            steps.append((call, time.monotonic()))
            progress.advance()
        wall = time.perf_counter() - t0
        proc = time.process_time() - proc0
        m = loader.metrics()
        cpu1 = _cpu(loader.runners)
        stages = stage_report(m, loader.plan, cpu0, cpu1)
    cores = args.cores or usable_cores()
    slow = m.slowest_stage()
    split = recommend_split(list(m.stages), cores)
    driver = driver_share(stages, proc, m.samples)
    timeline = slowest_step(steps, events, first)
    print(f"recipe {recipe.name}: {m.steps} steps in {wall:.2f} s ({m.steps / wall:.2f} steps/s, "
          f"{m.samples_per_s:.1f} samples/s, {m.tokens_per_s:.0f} tokens/s), fill {m.fill:.3f}")
    print_stages(stages, m.steps)
    print(f"driver: {driver['cpu_ms_per_sample']:.2f} ms CPU per delivered sample "
          f"({driver['cpu_s']:.2f} s for {m.samples} samples), {100 * driver['share']:.0f}% of "
          "the CPU measured")
    if slow is not None:
        print(f"bottleneck: {slow.name!r} ({slow.runner}, {slow.workers} worker(s), "
              f"{100 * slow.utilisation:.0f}% busy)")
    if split:
        print(f"recommended split of {cores} cores: "
              + ", ".join(f"{n}={k}" for n, k in split.items()) + f"  ({workers_flags(split)})")
    print(f"slowest step: {timeline['step']} ({timeline['seconds']:.3f} s, "
          f"{len(timeline['spans'])} stage groups)")
    report = {"recipe": recipe.name, "wall_s": wall, "metrics": asdict(m),
              "bottleneck": slow.name if slow else None, "cores": cores,
              "recommended_workers": split, "stages": stages, "driver": driver,
              "slowest_step": timeline}
    write_report(report, args.json, args.png)
    return 0


def write_report(report: dict[str, Any], json_path: str | None, png_path: str | None) -> None:
    """The report as JSON and as a PNG (`profile_figure`), where asked."""
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1))
    if png_path:
        fig = profile_figure(report)
        fig.savefig(png_path, dpi=100)
        import matplotlib.pyplot as plt

        plt.close(fig)


def driver_share(stages: list[dict[str, Any]], process_cpu_s: float,
                 samples: int) -> dict[str, float]:
    """The driver's CPU: this process's over the run less its thread workers', per
    delivered sample and as a share of all CPU measured (driver + workers)."""
    in_process = sum(s["cpu_s"] for s in stages if s["runner"] == RunnerKind.THREADS)
    workers_cpu = sum(s["cpu_s"] for s in stages if s["runner"] in _WORKER_KINDS)
    driver_cpu = max(0.0, process_cpu_s - in_process)
    total_cpu = driver_cpu + workers_cpu
    return {"cpu_s": driver_cpu, "samples": samples,
            "cpu_ms_per_sample": 1000 * driver_cpu / max(samples, 1),
            "share": driver_cpu / total_cpu if total_cpu > 0 else 0.0}


def print_stages(stages: list[dict[str, Any]], steps: int) -> None:
    """The stage table: busy time per step, busy share, CPU per sample (per operator of a
    fused stage too)."""
    print(f"{'stage':<32} {'runner':<10} {'workers':>7} {'busy s/step':>11} {'busy %':>7} "
          f"{'CPU ms/sample':>13}")
    for s in stages:
        print(f"{s['name']:<32} {s['runner']:<10} {s['workers']:>7} "
              f"{s['busy_s'] / steps:>11.3f} {100 * s['utilisation']:>6.0f}% "
              f"{s['cpu_ms_per_sample']:>13.2f}  ({s['cpu_clock']})")
        if len(s["operators"]) > 1:
            for op, ms in s["operators"].items():
                print(f"  {op:<30} {'':<10} {'':>7} {'':>11} {'':>7} {ms:>13.2f}")


def profile_figure(report: dict[str, Any]) -> Any:
    """A matplotlib figure of a profile's report (its ``--json``): the stages' busy share
    and CPU per sample above, the slowest step's stage groups over time below."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        from zephon_core import ZephonError

        raise ZephonError(f"--png needs matplotlib ({exc}): pip install 'zephon-vl[bench]'") \
            from None
    stages = report["stages"]
    n = len(stages)
    fig, (bars, line) = plt.subplots(2, 1, figsize=(8, 1.5 + 0.9 * n))
    names = [f"{s['name']} ({s['runner']}, {s['workers']})" for s in stages]
    bars.barh(names, [100 * s["utilisation"] for s in stages], color="tab:blue")
    for y, s in enumerate(stages):
        bars.text(1, y, f"{s['cpu_ms_per_sample']:.2f} ms CPU/sample", va="center", fontsize=8,
                  color="white" if s["utilisation"] > 0.3 else "black")
    bars.set_xlim(0, 100)
    bars.set_xlabel("busy % of the stage's workers")
    bars.set_title(f"{report['recipe']}: bottleneck {report['bottleneck']}\ndriver "
                   f"{report['driver']['cpu_ms_per_sample']:.2f} ms CPU/sample "
                   f"({100 * report['driver']['share']:.0f}% of CPU)", fontsize=9)
    bars.invert_yaxis()
    step = report["slowest_step"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i in range(n):  # groups in flight at once stacked in sub-rows of the stage's band
        mine = sorted((sp for sp in step["spans"] if sp["stage"] == i), key=lambda sp: sp["start"])
        ends: list[float] = []
        rows = []
        for sp in mine:
            r = next((k for k, e in enumerate(ends) if e <= sp["start"]), len(ends))
            ends[r:r + 1] = [sp["end"]]
            rows.append(r)
        h = 0.8 / max(len(ends), 1)
        for sp, r in zip(mine, rows, strict=True):
            line.broken_barh([(1000 * sp["start"], 1000 * (sp["end"] - sp["start"]))],
                             (i - 0.4 + r * h, h), color=colors[i % len(colors)],
                             edgecolor="black", linewidth=0.3)
    line.set_yticks(range(n), [s["name"] for s in stages])
    line.set_ylim(n - 0.5, -0.5)
    line.set_xlim(0, max(1000 * step["seconds"], 1e-3))
    line.set_xlabel(f"ms into step {step['step']} (the slowest: {step['seconds']:.3f} s); "
                    "a bar is one group of elements")
    fig.tight_layout()
    return fig
