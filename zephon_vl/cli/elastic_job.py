"""One rank of `zephon-vl elastic-demo --torchrun` (run by torchrun, gloo backend).

Each rank iterates its local batches, all-gathers them to rank 0, which hashes
the global batch of every step; `state_dict()` (global, identical on every
rank, checked here) is written after `--save-at` steps.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist

from zephon_core import Execution, Loader, batch_digest, load_recipe


def _gather_global(batch: dict) -> dict | None:
    """Concatenate the ranks' local batches along dim 0 (0-d tensors are shared ids)."""
    world = dist.get_world_size()
    out = {}
    for name in sorted(batch):
        t = batch[name]
        if t.dim() == 0:
            out[name] = t
            continue
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([t.shape[0]]))
        longest = int(max(s.item() for s in sizes))
        padded = torch.zeros((longest, *t.shape[1:]), dtype=t.dtype)
        padded[:t.shape[0]] = t
        parts = [torch.zeros_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        out[name] = torch.cat([p[:int(n.item())] for p, n in zip(parts, sizes, strict=True)])
    return out if dist.get_rank() == 0 else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--recipe", required=True)
    p.add_argument("--lanes", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-at", type=int, default=None)
    p.add_argument("--resume", default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    recipe = load_recipe(args.recipe, num_lanes=args.lanes)
    loader = Loader(recipe, rank, world, Execution(runner="inline"))
    start = 0
    if args.resume:
        state = json.loads(Path(args.resume).read_text())
        loader.load_state_dict(state)
        start = state["step"]
    digests = {}
    for t in range(start, args.steps):
        merged = _gather_global(next(loader))
        if merged is not None:
            digests[t] = batch_digest(merged)
        if args.save_at is not None and t + 1 == args.save_at:
            state = loader.state_dict()
            blobs = [None] * world
            dist.all_gather_object(blobs, json.dumps(state, sort_keys=True))
            if rank == 0:
                if len(set(blobs)) != 1:
                    raise SystemExit("ranks returned different global states")
                Path(args.out, "state.json").write_text(blobs[0])
    if rank == 0:
        Path(args.out, "digests.json").write_text(json.dumps(digests))
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
