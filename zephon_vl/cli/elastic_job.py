"""One rank of `zephon-vl elastic-demo --torchrun` (run by torchrun, gloo backend).

Each rank iterates its local batches, all-gathers them to rank 0, which hashes
the global batch of every step; `state_dict()` (global, identical on every
rank, checked here) is written after `--save-at` steps.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch.distributed as dist

from zephon_core import Execution, Loader, gathered_batch_digest, load_recipe


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--recipe", required=True)
    p.add_argument("--lanes", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-at", type=int, default=None)
    p.add_argument("--resume", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--ledger", default=None)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    recipe = load_recipe(args.recipe, num_lanes=args.lanes)
    loader = Loader(recipe, rank, world, Execution(runner="inline"), ledger=args.ledger)
    start = 0
    if args.resume:
        state = json.loads(Path(args.resume).read_text())
        loader.load_state_dict(state)
        start = state["step"]
    digests = {}
    for t in range(start, args.steps):
        digest = gathered_batch_digest(next(loader))
        if digest is not None:
            digests[t] = digest
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
