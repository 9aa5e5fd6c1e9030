"""CPU of the loader's driver on the text workload, per 1,000 rows, counted (issue 39).

The loader of ``zephon-vl bench --workload text`` (`zephon_bench.text_bench`: 2048-token
rows, best fit into 4 open rows, 16 rows a step, 8 lanes, shuffle on), run in this
process: after 20% of `--rows` rows (warm), the CPU the driver process spends (each of
its threads apart), the workers' CPU, the driver's full garbage collections and the
messages handed to and from the workers, all per 1,000 rows. CPU time, not wall time: on
a machine shared with other work, counts stay comparable where rates do not.
Run: ``python scripts/text_driver_cost.py --rows 1000 --execution '{"group_size": 8}'``
(``--freeze``: with `gc.freeze()` after the warm-up)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from collections import Counter
from typing import Any

import psutil
from zephon_bench.text_bench import SCENARIOS, TextSpec
from zephon_bench.text_data import build_text_data

from zephon_core import Execution, Loader, qwen_tokenizer_dir


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process, by thread id."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def workers_cpu() -> float:
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


class FullCollections:
    """Time in the garbage collector's full (generation 2) collections, while counting."""

    def __init__(self) -> None:
        self.count, self.seconds, self._start = 0, 0.0, 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.thread_time()
        else:
            self.count += 1
            self.seconds += time.thread_time() - self._start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1000, help="rows counted (after 20%% more)")
    p.add_argument("--documents", type=int, default=10000, help="documents a dataset")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="text")
    p.add_argument("--execution", default="{}", help="Execution.from_flat's settings, JSON")
    p.add_argument("--freeze", action="store_true",
                   help="gc.freeze() after the warm-up, as a training script may (its "
                        "objects then stay out of the driver's full collections)")
    args = p.parse_args()
    data = build_text_data(args.documents)
    spec = TextSpec({k: [str(f) for f in v] for k, v in data.shards.items()},
                    SCENARIOS[args.scenario], str(qwen_tokenizer_dir()), args.rows)
    loader = Loader(spec.recipe(), 0, 1, Execution.from_flat(json.loads(args.execution)))
    rows, warm = 0, args.rows // 5
    try:
        for _ in loader:
            rows += len(loader.last_meta.rows)
            if rows >= warm:
                break
        if args.freeze:
            gc.freeze()
        collections = FullCollections()
        threads, cpu, workers, start = thread_cpu(), time.process_time(), workers_cpu(), rows
        for _ in loader:
            rows += len(loader.last_meta.rows)
            if rows >= start + args.rows:
                break
        n = (rows - start) / 1000
        after = thread_cpu()
        driver = (time.process_time() - cpu) / n
        report = Counter({f"thread {t}": (after[t] - threads.get(t, 0.0)) / n for t in after})
        print(f"{args.scenario}, {rows - start} rows, execution {args.execution}: "
              f"driver {driver:.3f} s / 1,000 rows, workers {(workers_cpu() - workers) / n:.3f};"
              f" full GCs {collections.count} ({collections.seconds / n:.3f} s / 1,000 rows)")
        for name, seconds in report.most_common():
            if seconds >= 0.005:
                print(f"  {name}: {seconds:.3f} s / 1,000 rows")
    finally:
        loader.close()


if __name__ == "__main__":
    main()
