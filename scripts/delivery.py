"""Delivered training batches on vlm-demo: steps/s, collate cost per step, peak memory.

Runs the public `Loader` (background=True, the command line's default
execution otherwise) on ``vlm-demo`` (L=8, G=16, S=2048, one rank) for each
pixel path (``collate``: float32 normalized on the CPU, the default;
``device``: uint8 rows + table, normalized later by ``to_device``) and each
execution variant:

* ``default``: ``Execution()`` (collate in the driver thread,
  ``backlog_bytes`` 256 MiB);
* ``thread``: ``Execution(collate_in="thread")``, a collate thread beside the
  driver;
* ``unbounded``: ``Execution(backlog_bytes=None)``, as before issue 12 but
  for the collate's one-pass kernel;
* ``tight``: ``Execution(backlog_bytes=64 MiB)``.

Per run: delivered global steps/s (after the first batch), the peak PSS of
the process tree (the loader and its workers, /proc/*/smaps_rollup), the peak
of /dev/shm used by the loader's segments, the loader's own backlog peak. Per
pixel path, once: the collate alone, timed on two steps' rows (median of 3
calls each), in ms per step and per MB of pixels written. Only public names
are used, and attributes added by issue 12 are optional, so the same script
measures an older checkout: run it with the Python of a second virtual environment
where that checkout is installed (``pip install -e <checkout>``), e.g.
``/tmp/venv-main/bin/python scripts/delivery.py --variants default``.

    python scripts/delivery.py --steps 8 --json delivery.json --plot delivery.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

from zephon_core import Execution, Loader
from zephon_vl import ImageSettings, vlm_demo

VARIANTS = {
    "default": {},
    "thread": {"collate_in": "thread"},
    "unbounded": {"backlog_bytes": None},
    "tight": {"backlog_bytes": 64 << 20},
}


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                kids = Path(f"/proc/{p}/task/{tid}/children").read_text().split()
                todo += [int(k) for k in kids]
        except OSError:
            continue
    return out


def _pss(pid: int) -> int:
    total = 0
    for p in _tree(pid):
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def _shm_bytes(prefix: str) -> int:
    total = 0
    for f in Path("/dev/shm").glob(f"{prefix}*"):
        try:
            total += f.stat().st_blocks * 512
        except OSError:
            continue
    return total


class Peaks(threading.Thread):
    """Samples PSS of the process tree and /dev/shm every 50 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.pss = self.shm = 0
        self.done = threading.Event()
        self.prefix = f"zephon-{os.getpid()}-"

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.pss = max(self.pss, _pss(os.getpid()))
            self.shm = max(self.shm, _shm_bytes(self.prefix))


def _recipe(normalize: str):
    return vlm_demo(image=ImageSettings(max_pixels=256 * 28 * 28, normalize=normalize))


def collate_cost(normalize: str, steps: int = 2, calls: int = 3) -> dict:
    """The collate alone on real rows: ms per step and per MB of pixel output."""
    recipe = _recipe(normalize)
    times, mbs = [], []
    with Loader(recipe, execution=Execution(runner="inline")) as loader:
        for _ in range(steps):
            rows = loader.next_rows()
            for _ in range(calls):
                start = time.perf_counter()
                batch = recipe.collate(rows)
                times.append(time.perf_counter() - start)
                pv = batch["pixel_values"]
                mbs.append(pv.numel() * pv.element_size() / 1e6)
                del batch
    ms, mb = 1000 * statistics.median(times), statistics.median(mbs)
    return {"normalize": normalize, "collate_ms_per_step": round(ms, 1),
            "pixel_mb_per_step": round(mb, 1), "collate_ms_per_mb": round(ms / mb, 3)}


def run_one(normalize: str, variant: str, steps: int) -> dict:
    ex = Execution(**VARIANTS[variant])
    peaks = Peaks()
    peaks.start()
    t0 = time.perf_counter()
    with Loader(_recipe(normalize), execution=ex, background=True) as loader:
        it = iter(loader)
        next(it)
        first = time.perf_counter() - t0
        collate = []
        start = time.perf_counter()
        for _ in range(steps):
            next(it)
            collate.append(getattr(loader.last_meta, "collate_s", float("nan")))
        wall = time.perf_counter() - start
        backlog = getattr(loader, "backlog", None)
    peaks.done.set()
    peaks.join()
    return {"normalize": normalize, "variant": variant, "steps": steps,
            "first_batch_s": round(first, 2), "steps_per_s": round(steps / wall, 3),
            "collate_s_in_loader": round(statistics.median(collate), 3),
            "peak_pss_mb": round(peaks.pss / 1e6), "peak_shm_mb": round(peaks.shm / 1e6),
            "backlog_peak_mb": round(backlog.peak / 1e6) if backlog is not None else None}


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results if "variant" in r]
    labels = [f"{r['normalize']}\n{r['variant']}" for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key, title in zip(axes, ["steps_per_s", "peak_pss_mb", "peak_shm_mb"],
                              ["delivered global steps/s", "peak PSS, process tree (MB)",
                               "peak /dev/shm (MB)"], strict=True):
        ax.bar(range(len(runs)), [r[key] for r in runs], color="tab:blue")
        ax.set_xticks(range(len(runs)), labels, fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.suptitle("vlm-demo, L=8, G=16, S=2048, one rank (scripts/delivery.py)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--normalize", nargs="+", default=["collate", "device"])
    ap.add_argument("--variants", nargs="+", default=["default", "thread"],
                    choices=list(VARIANTS))
    ap.add_argument("--repeats", type=int, default=1, help="rounds of variants, interleaved")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--plot", help="a PNG of steps/s and peak memory per run")
    args = ap.parse_args()
    results = []
    for normalize in args.normalize:
        r = collate_cost(normalize)
        print(json.dumps(r), flush=True)
        results.append(r)
    for _ in range(args.repeats):
        for normalize in args.normalize:
            for variant in args.variants:
                r = run_one(normalize, variant, args.steps)
                print(json.dumps(r), flush=True)
                results.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
