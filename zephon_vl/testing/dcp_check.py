"""One rank of the distributed-checkpoint round trip (run under torchrun, gloo).

    torchrun --standalone --nproc_per_node=2 -m zephon_vl.testing.dcp_check \\
        --out OUT --steps 6 --save-at 3
    torchrun --standalone --nproc_per_node=4 -m zephon_vl.testing.dcp_check \\
        --out OUT2 --steps 6 --resume OUT/ckpt

Every rank builds ``ZephonDataLoader`` through its TorchTitan ``Config`` with
the arguments TorchTitan's trainer passes, iterates its micro-batches, and the
global batch of each step (every rank's micro-batches, gathered in rank
order) is hashed with ``zephon_core.engine.simulate.gathered_batch_digest``. With ``--save-at
K`` the dataloader is saved through ``torch.distributed.checkpoint`` after
step ``K-1`` under the top-level key ``dataloader``, as TorchTitan's
checkpointer does; with ``--resume`` it is loaded from such a checkpoint and
the run continues from the saved step. ``--config zephon_qwen35_debug`` takes the
dataloader, ``seq_len`` and local batch size of a ready TorchTitan config instead,
and ``--compute-seconds S`` sleeps after each micro-batch as a trainer's step would
(the loader's workers run ahead meanwhile). Rank 0 writes ``digests.json``
(``{step: sha256}``) and ``state_sha.json`` (each rank's state SHA-256).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from zephon_core import Execution, gathered_batch_digest
from zephon_vl.titan.check import load_titan_config
from zephon_vl.titan.dataloader import STATE_KEY, ZephonDataLoader, step_rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--recipe", default="text-demo")
    p.add_argument("--lanes", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--local-batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-at", type=int, default=None)
    p.add_argument("--resume", default=None)
    p.add_argument("--runner", default=Execution.runner)
    p.add_argument("--ledger", default="", help="the dataloader's ledger file (Config.ledger)")
    p.add_argument("--config", default="",
                   help="take the dataloader, seq_len and local batch size from this TorchTitan "
                        "config of zephon_vl.titan (e.g. zephon_qwen35_debug) instead")
    p.add_argument("--compute-seconds", type=float, default=0.0,
                   help="sleep this long after each micro-batch, as a trainer's forward and "
                        "backward would: the loader's background driver runs ahead meanwhile")
    return p


def _build(args: argparse.Namespace, rank: int, world: int) -> ZephonDataLoader:
    """This rank's loader, built as TorchTitan's trainer builds it (from a ready config or
    from the flags)."""
    if args.config:
        trainer = load_titan_config(args.config)
        cfg = dataclasses.replace(trainer.dataloader, ledger=args.ledger)
        seq_len, local_batch = trainer.training.seq_len, trainer.training.local_batch_size
    else:
        cfg = ZephonDataLoader.Config(recipe=args.recipe, num_lanes=args.lanes,
                                      global_batch_size=args.global_batch, runner=args.runner,
                                      ledger=args.ledger)
        seq_len, local_batch = args.seq_len, args.local_batch
    return cfg.build(dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=seq_len,
                     local_batch_size=local_batch, snapshot_every_n_steps=None)


def _steps(dl: ZephonDataLoader, args: argparse.Namespace, start: int,
           world: int) -> tuple[dict[int, str], list[str]]:
    """Run steps `start`..`--steps`: the global batch digests by step, and every rank's
    state SHA-256 where the loader was saved (empty without `--save-at`)."""
    it = iter(dl)
    digests: dict[int, str] = {}
    shas: list[str] = []
    for t in range(start, args.steps):
        micro = []
        for _ in range(dl.microbatches):
            micro.append(next(it))
            time.sleep(args.compute_seconds)
        digest = gathered_batch_digest(step_rows(micro))
        if digest is not None:
            digests[t] = digest
        if args.save_at is not None and t + 1 == args.save_at:
            sd = dl.state_dict()
            mine = hashlib.sha256(sd[STATE_KEY].encode()).hexdigest()
            every: list[str | None] = [None] * world
            dist.all_gather_object(every, mine)
            shas = [s for s in every if s is not None]
            dcp.save({"dataloader": dl}, checkpoint_id=str(Path(args.out) / "ckpt"))
    return digests, shas


def main(argv: list[str] | None = None) -> int:
    """One rank's round trip; rank 0 writes the digests and the state SHAs."""
    args = _parser().parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dl = _build(args, rank, world)
    out = Path(args.out)
    start = 0
    if args.resume:
        dcp.load({"dataloader": dl}, checkpoint_id=args.resume)
        start = dl.step
    digests, shas = _steps(dl, args, start, world)
    if rank == 0:
        (out / "digests.json").write_text(json.dumps(digests))
        (out / "state_sha.json").write_text(json.dumps(shas))
    dl.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
