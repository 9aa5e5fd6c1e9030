"""Delivered training batches on vlm-demo: steps/s, collate time per step, peak memory.

Runs the public `Loader` (background=True, the command line's default
execution otherwise) on ``vlm-demo`` (L=8, G=16, S=2048, one rank) for each
pixel path (``collate``: float32 normalized on the CPU, the default;
``device``: uint8 rows + table, normalized by ``to_device``) and each variant:

* ``before``: the step collated in the driver thread, backlog unbounded
  (``Execution(collate_in="driver", backlog_bytes=None)``), as before issue 12;
* ``after``: the defaults (a collate thread, ``backlog_bytes`` 256 MiB);
* ``tight``: the defaults with ``backlog_bytes`` 64 MiB.

Per run it reports delivered global steps/s (timed after a warm-up step),
the median collate time per step and the pixel MB it writes, the peak PSS of
the process tree (the loader and its workers, from /proc/*/smaps_rollup), the
peak of /dev/shm in use by the loader's pools, and the peak of the loader's own
`backlog` count. Variants run interleaved, in one process, side by side.

    python scripts/delivery.py --steps 12 --json delivery.json
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
    "before": {"collate_in": "driver", "backlog_bytes": None},
    "after": {},
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


def run_one(normalize: str, variant: str, steps: int) -> dict:
    recipe = vlm_demo(image=ImageSettings(max_pixels=256 * 28 * 28, normalize=normalize))
    ex = Execution(**VARIANTS[variant])
    peaks = Peaks()
    peaks.start()
    t0 = time.perf_counter()
    with Loader(recipe, execution=ex, background=True) as loader:
        it = iter(loader)
        next(it)
        first = time.perf_counter() - t0
        collate, mb = [], []
        start = time.perf_counter()
        for _ in range(steps):
            batch = next(it)
            collate.append(loader.last_meta.collate_s)
            mb.append(batch["pixel_values"].numel() * batch["pixel_values"].element_size() / 1e6)
            del batch
        wall = time.perf_counter() - start
        backlog_peak = loader.backlog.peak
    peaks.done.set()
    peaks.join()
    med = statistics.median(collate)
    return {"normalize": normalize, "variant": variant, "steps": steps,
            "first_batch_s": round(first, 2), "steps_per_s": round(steps / wall, 3),
            "collate_s_median": round(med, 4), "pixel_mb_median": round(statistics.median(mb), 1),
            "collate_ms_per_mb": round(1000 * med / statistics.median(mb), 3),
            "peak_pss_mb": round(peaks.pss / 1e6), "peak_shm_mb": round(peaks.shm / 1e6),
            "backlog_peak_mb": round(backlog_peak / 1e6)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--normalize", nargs="+", default=["collate", "device"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    results = []
    for normalize in args.normalize:
        for variant in args.variants:
            r = run_one(normalize, variant, args.steps)
            print(json.dumps(r), flush=True)
            results.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
