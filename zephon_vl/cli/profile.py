"""`zephon-vl profile --recipe R`: which stage holds the loader back, and a worker split.

Runs the recipe's loader for `--steps` steps after `--warmup` steps (which start
the workers) with a consumer that does nothing, so every second is the loader's,
and reads its `LoaderMetrics` (docs/observability.md): each stage's busy
worker-seconds and utilisation. The bottleneck is the busiest stage. The
recommended split gives the usable cores to the worker stages in proportion to
the worker-seconds each used per step, at least one each: the arithmetic of
``--workers auto``, which applies it while the loader runs
(`zephon_core.engine.autoscale`).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from zephon_vl.cli.main import add_execution_args, command, execution_from


def recommend_split(stages: list[Any], cores: int) -> dict[str, int]:
    """Workers per worker stage (threads or processes), proportional to its busy seconds:
    the arithmetic of `Execution(workers="auto")` (`zephon_core.engine.autoscale`)."""
    from zephon_core.extend import split_workers

    return split_workers({s.name: s.busy_s for s in stages
                          if s.runner in ("threads", "processes")}, cores)


def workers_flags(split: dict[str, int]) -> str:
    """``--workers op=N`` for every operator of every stage (fused stages keep one count)."""
    return " ".join(f"--workers {op}={n}" for name, n in split.items() for op in name.split("+"))


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default="vlm-demo", help="built-in name or TOML file")
    p.add_argument("--steps", type=int, default=10, help="steps measured")
    p.add_argument("--warmup", type=int, default=2, help="steps run first and not measured")
    p.add_argument("--cores", type=int, default=0,
                   help="cores to split among the worker stages (default: usable cores)")
    p.add_argument("--png", default="", metavar="PATH", help="a bar chart of the stages")
    p.add_argument("--json", default="", metavar="PATH", help="the measurements as JSON")
    add_execution_args(p)


@command("profile", "find the loader's bottleneck stage and recommend a worker split", _args)
def cmd_profile(args: argparse.Namespace) -> int:
    from zephon_core import ConfigError, Loader, load_recipe, usable_cores
    from zephon_vl.cli.progress import Progress

    if args.steps < 1 or args.warmup < 0:
        raise ConfigError("zephon-vl profile: --steps must be >= 1 and --warmup >= 0")
    recipe = load_recipe(args.recipe)
    with Loader(recipe, execution=execution_from(args), wait_warn_share=None) as loader, \
            Progress("zephon-vl profile", args.warmup + args.steps, "steps") as progress:
        for _ in range(args.warmup):
            next(loader)
            progress.advance(note="warm-up")
        loader.metrics()  # closes the warm-up window
        t0 = time.perf_counter()
        for _ in range(args.steps):
            next(loader)
            progress.advance()
        wall = time.perf_counter() - t0
        m = loader.metrics()
    cores = args.cores or usable_cores()
    slow = m.slowest_stage()
    split = recommend_split(list(m.stages), cores)
    print(f"recipe {recipe.name}: {m.steps} steps in {wall:.2f} s ({m.steps / wall:.2f} steps/s, "
          f"{m.samples_per_s:.1f} samples/s, {m.tokens_per_s:.0f} tokens/s), fill {m.fill:.3f}")
    print(f"{'stage':<32} {'runner':<10} {'workers':>7} {'busy s/step':>11} {'busy %':>7}")
    for s in m.stages:
        print(f"{s.name:<32} {s.runner:<10} {s.workers:>7} {s.busy_s / m.steps:>11.3f} "
              f"{100 * s.utilisation:>6.0f}%")
    if slow is not None:
        print(f"bottleneck: {slow.name!r} ({slow.runner}, {slow.workers} worker(s), "
              f"{100 * slow.utilisation:.0f}% busy)")
    if split:
        print(f"recommended split of {cores} cores: "
              + ", ".join(f"{n}={k}" for n, k in split.items()) + f"  ({workers_flags(split)})")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"recipe": recipe.name, "wall_s": wall, "metrics": asdict(m),
             "bottleneck": slow.name if slow else None, "cores": cores,
             "recommended_workers": split}, indent=1))
    if args.png:
        _plot(m, Path(args.png))
    return 0


def _plot(m: Any, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        from zephon_core import ZephonError

        raise ZephonError(f"--png needs matplotlib ({exc}): pip install 'zephon-vl[bench]'") \
            from None
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(m.stages)))
    names = [f"{s.name} ({s.runner}, {s.workers})" for s in m.stages]
    ax.barh(names, [100 * s.utilisation for s in m.stages], color="tab:blue")
    ax.set_xlim(0, 100)
    ax.set_xlabel("busy % of the stage's workers")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
