#!/usr/bin/env python
"""GPU smoke test: per-step global-batch digests and losses, uninterrupted vs resumed on another D.

    python scripts/gpu_smoke.py                      # one CUDA GPU (the default when present)
    python scripts/gpu_smoke.py --device cpu --steps 4 --save-at 2   # slowly, anywhere

Data-parallel ranks are simulated in one process: ``--dp`` ``ZephonDataLoader``
instances (built through their TorchTitan Config with the trainer's
arguments) each give their micro-batches, and TorchTitan's debug model
(``llama3`` by default, or ``qwen3_5`` with ``--model qwen3_5`` on
``vlm-demo``) trains on the global batch, rank by rank, on one device. After
``--save-at`` steps the weights, the AdamW state and the dataloader state (the
same JSON every real rank would put into the distributed checkpoint) are
saved; a second run restores them at ``--resume-dp`` ranks and continues.

It prints one line per step: the SHA-256 of the global batch and the loss of
both runs. It exits 1 unless every digest of the resumed run equals the
uninterrupted run's. Because the micro-batch size is fixed, the global rows
are processed in the same order at every D, so the losses match too (to the
bit on CPU; on a GPU up to non-deterministic kernels). The result is written
as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _loaders(args: argparse.Namespace, dp: int) -> list:
    from zephon_vl.titan.dataloader import ZephonDataLoader

    vlm = args.model == "qwen3_5"
    cfg = ZephonDataLoader.Config(
        recipe="vlm-demo" if vlm else "text-demo", num_lanes=args.lanes,
        global_batch_size=args.global_batch, model_format="qwen3_5" if vlm else "text",
        image_preset="qwen3_5" if vlm else "", max_pixels=args.max_pixels)
    return [cfg.build(dp_world_size=dp, dp_rank=d, tokenizer=None, seq_len=args.seq_len,
                      local_batch_size=args.local_batch, snapshot_every_n_steps=None)
            for d in range(dp)]


def _global_step(loaders: list, iters: list) -> tuple[list, str]:
    from zephon_core import batch_digest
    from zephon_vl.titan.dataloader import step_rows

    micro = [next(it) for it, dl in zip(iters, loaders, strict=True)
             for _ in range(dl.microbatches)]
    return micro, batch_digest(step_rows(micro))


def _run(args: argparse.Namespace, dp: int, steps: range, device, ckpt: Path,
         save: bool, resume: bool) -> list[dict]:
    import torch

    from zephon_vl.testing.tiny_model import build_model, fold_vocab, make_optimizer, train_step
    from zephon_vl.titan.dataloader import merged_state

    model = (build_model(args.model, device=device, seed=0, vocab_size=args.fold_vocab)
             if args.fold_vocab else build_model(args.model, device=device, seed=0))
    opt = make_optimizer(model, lr=args.lr)
    loaders = _loaders(args, dp)
    if resume:
        model.load_state_dict(torch.load(ckpt / "model.pt", map_location=device))
        opt.load_state_dict(torch.load(ckpt / "optim.pt", map_location=device))
        state = json.loads((ckpt / "dataloader.json").read_text())
        for dl in loaders:
            dl.load_state_dict(state)
    iters = [iter(dl) for dl in loaders]
    out = []
    for t in steps:
        t0 = time.perf_counter()
        micro, digest = _global_step(loaders, iters)
        if args.fold_vocab:
            micro = fold_vocab(micro, args.fold_vocab)
        loss = train_step(model, opt, micro, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.append({"step": t, "sha256": digest, "loss": loss,
                    "seconds": round(time.perf_counter() - t0, 3)})
        print(f"  D={dp} step {t}: {digest[:16]} loss {loss:.6f} "
              f"({out[-1]['seconds']:.2f}s)", flush=True)
        if save and t + 1 == args.save_at:
            ckpt.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), ckpt / "model.pt")
            torch.save(opt.state_dict(), ckpt / "optim.pt")
            (ckpt / "dataloader.json").write_text(json.dumps(merged_state(loaders)))
    for dl in loaders:
        dl.close()
    return out


def main(argv: list[str] | None = None) -> int:
    import tempfile

    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", choices=["llama3", "qwen3_5"], default="llama3")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--resume-dp", type=int, default=4)
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--local-batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--max-pixels", type=int, default=64 * 32 * 32)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-at", type=int, default=4)
    p.add_argument("--lr", type=float, default=8e-4)
    p.add_argument("--fold-vocab", type=int, default=0,
                   help="fold token ids modulo N before the model (fast on CPU; 0 = the "
                        "full 248,320-id vocabulary)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.deterministic = True
        print(f"device: {torch.cuda.get_device_name(device)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="zephon-gpu-smoke-") as tmp:
        ckpt = Path(tmp, "ckpt")
        print(f"uninterrupted run, D={args.dp}:", flush=True)
        ref = _run(args, args.dp, range(args.steps), device, ckpt, save=True, resume=False)
        print(f"resumed after step {args.save_at - 1}, D={args.resume_dp}:", flush=True)
        res = _run(args, args.resume_dp, range(args.save_at, args.steps), device, ckpt,
                   save=False, resume=True)
    by_step = {r["step"]: r for r in ref}
    same = all(r["sha256"] == by_step[r["step"]]["sha256"] for r in res)
    diff = max(abs(r["loss"] - by_step[r["step"]]["loss"]) for r in res)
    print(f"\nstep  D={args.dp} digest     D={args.resume_dp} digest     loss D={args.dp}  "
          f"loss D={args.resume_dp}")
    for r in res:
        a = by_step[r["step"]]
        print(f"{r['step']:<5} {a['sha256'][:16]}  {r['sha256'][:16]}  {a['loss']:.6f}  "
              f"{r['loss']:.6f}")
    verdict = "all global batches identical" if same else "MISMATCH"
    print(f"{verdict}; max |loss diff| after resume = {diff:.3g} ({args.device})")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(device), "args": vars(args),
                                               "uninterrupted": ref, "resumed": res,
                                               "digests_identical": same,
                                               "max_abs_loss_diff": diff}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
