"""Run by tests/test_core_torchrun.py under `torchrun` (gloo): one loader per process.

Writes, per rank, the local batches' digests and tensors and the state_dict()
taken after `--save-at` steps, so the test can check that every rank returned
the same global state and that concatenated local batches form the global batch
(`--torch-dataset`: iterated and checkpointed through torchdata's StatefulDataLoader).
It also writes the native gloo threads still running after
``destroy_process_group``: a reference to a group held past it keeps them
alive into interpreter shutdown, where they abort the process now and then.
`--hold-group` keeps such a reference, so a test can see that the check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from zephon_core import Dataset, Execution, InMemoryReader, Loader, Map, Pack, Read, Recipe, Shuffle


def to_tokens(sample: dict) -> dict:
    return {"tokens": (np.arange(sample["n"], dtype=np.int32) * 7 + sample["id"]) % 5000}


def make_recipe() -> Recipe:
    rng = np.random.default_rng(5)
    shards = [[{"n": int(rng.integers(3, 90)), "id": s * 1000 + i} for i in range(40)]
              for s in range(6)]
    reader = InMemoryReader(shards)
    ops = [Shuffle(32), Read([reader]), Map(to_tokens), Pack(64, {"max_open_bins": 3})]
    # One epoch: ranks agree on the end of data over the loader's own gloo group.
    return Recipe([Dataset("mem", reader)], ops, global_batch_size=8, num_lanes=4, seed=11,
                  epochs=1)


def gloo_threads(patience: float = 10.0) -> list[str]:
    """The gloo threads left once they had `patience` seconds to go.

    A joined thread stays listed in /proc until the kernel reaps it, a moment
    later on a busy machine, so one look right after the join can see it; a
    thread kept alive by a reference is there for good.
    """
    deadline = time.monotonic() + patience
    while True:
        names = []
        for t in os.listdir("/proc/self/task"):
            try:
                names.append(Path(f"/proc/self/task/{t}/comm").read_text().strip())
            except FileNotFoundError:  # reaped while we looked
                continue
        left = sorted(n for n in names if "gloo" in n)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-at", type=int, default=None)
    p.add_argument("--resume", default=None)
    p.add_argument("--hold-group", action="store_true")
    p.add_argument("--torch-dataset", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    held = dist.group.WORLD if args.hold_group else None
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    loader = Loader(make_recipe(), rank, world, Execution(runner="inline"))
    # --torch-dataset: through torchdata's StatefulDataLoader and its own state_dict() call
    source: Any = (StatefulDataLoader(loader.as_torch_dataset(), batch_size=None)
                   if args.torch_dataset else loader)
    start = 0
    if args.resume:
        state = json.loads(Path(args.resume).read_text())
        source.load_state_dict(state)
        if args.torch_dataset:
            state = json.loads(state["dataset_state"]["zephon_state"])
        start = state["step"]
    batches = {}
    it = iter(source)
    for t in range(start, args.steps):
        batches[t] = next(it)
        if args.save_at is not None and t + 1 == args.save_at:
            state = source.state_dict()
            (out / f"state-rank{rank}.json").write_text(json.dumps(state, sort_keys=True))
    torch.save(batches, out / f"batches-rank{rank}.pt")
    loader.close()
    dist.barrier()
    dist.destroy_process_group()
    left = gloo_threads(patience=1.0 if held is not None else 10.0)
    (out / f"threads-rank{rank}.json").write_text(json.dumps(left))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
