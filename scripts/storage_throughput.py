"""Read throughput of the vlm-demo shards: local disk vs the local S3 server (moto),
each sample its own range request vs coalesced requests (`Execution.coalesce`).

Per storage and coalescing mode: raw reads (``WebDatasetReader.read_many`` over
every sample in groups of 8 neighbours, one thread) and the vlm-demo pipeline
(global batches per second, inline runner, one rank). The modes alternate
`--repeats` times in one run; medians are printed, one JSON line per case, and
a bar chart is written to `--plot`. Run:
``python scripts/storage_throughput.py --plot docs/storage_throughput.png``
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from zephon_core import Coalesce, Execution, Loader, RetryPolicy, qwen_tokenizer_dir
from zephon_core.extend import storage_settings
from zephon_vl import WebDatasetReader, build_demo_dataset
from zephon_vl.recipes import vlm_recipe
from zephon_vl.testing.storage_servers import s3_server

MODES = {"per sample": Coalesce(max_bytes=0), "coalesced": Coalesce()}


def execution(coalesce: Coalesce) -> Execution:
    return Execution(runner="inline", retry=RetryPolicy(deadline=30.0), coalesce=coalesce)


def raw(shards: list[str], coalesce: Coalesce, group: int = 8) -> dict:
    r = WebDatasetReader(shards)
    pointers = [(s, i) for s in range(r.num_shards) for i in range(r.shard_len(s))]
    with storage_settings(execution(coalesce).storage()):
        t0 = time.perf_counter()
        nbytes = 0
        for k in range(0, len(pointers), group):
            for sample in r.read_many(pointers[k:k + group]):
                nbytes += sum(len(v) for key, v in sample.items() if not key.startswith("__"))
        dt = time.perf_counter() - t0
    return {"samples_per_s": len(pointers) / dt, "MB_per_s": nbytes / dt / 1e6}


def pipeline(shards: list[str], coalesce: Coalesce, steps: int = 8) -> dict:
    recipe = vlm_recipe(shards, qwen_tokenizer_dir(), seq_len=2048, global_batch_size=8,
                        num_lanes=8)
    with Loader(recipe, 0, 1, execution(coalesce)) as loader:
        next(loader)
        t0 = time.perf_counter()
        for _ in range(steps):
            next(loader)
        dt = time.perf_counter() - t0
    return {"steps_per_s": steps / dt}


def measure(where: str, shards: list[str], repeats: int) -> list[dict]:
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for _ in range(repeats):
        for mode, co in MODES.items():
            runs[mode].append({**raw(shards, co), **pipeline(shards, co)})
    out = []
    for mode, rs in runs.items():
        row = {"where": where, "reads": mode}
        row.update({k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]})
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    labels = [f"{r['where'].split(' ')[0]}\n{r['reads']}" for r in rows]
    for ax, key, title in ((axes[0], "samples_per_s", "raw reads (samples/s, log)"),
                           (axes[1], "steps_per_s", "vlm-demo pipeline (steps/s)")):
        ax.bar(labels, [r[key] for r in rows], color=["#999", "#444"] * (len(rows) // 2))
        ax.set_title(title, fontsize=10)
        ax.tick_params(labelsize=8)
        if key == "samples_per_s":
            ax.set_yscale("log")
    fig.suptitle("vlm-demo shards: local disk vs S3 (moto, 127.0.0.1); medians", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--plot", default=None, help="write a PNG bar chart here")
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto logs every request
    ds = build_demo_dataset(out_dir=Path(tempfile.mkdtemp()), num_samples=160, seed=0,
                            videos=2, samples_per_shard=40)
    local = [str(p) for p in ds.shards]
    rows = measure("local disk (page cache)", local, args.repeats)
    with s3_server() as server:
        urls = server.upload("zephon-bench", local)
        rows += measure("S3 (moto, 127.0.0.1)", urls, args.repeats)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
