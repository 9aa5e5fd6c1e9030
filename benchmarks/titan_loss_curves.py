"""Loss curves of TorchTitan's llama3 debug model fed by zephon at D = 1, 2, 4 (CPU, gloo).

    python -m zephon_bench.titan_loss_curves            # writes docs/titan_loss_curves.{png,json}

Each data-parallel degree is a real ``torchrun`` job (gloo). Every job starts
from the same initial weights (built once, saved, loaded by every rank) and
gets its batches from ``ZephonDataLoader`` built through its TorchTitan
Config; the forward, backward and loss are TorchTitan's model code
(``zephon_vl.testing.tiny_model``), gradients are summed over ranks with
``all_reduce``. The ``D = 2`` job saves a checkpoint after ``--save-at`` steps
(weights and AdamW state with ``torch.save``, the dataloader through
``torch.distributed.checkpoint`` as TorchTitan does); it is resumed at
``D = 4`` and ``D = 1``.

Per step, each job records the SHA-256 of the global batch (zephon's digest of
the gathered rows) and the global mean loss. The global batches are identical
at every ``D``; the losses may differ in the last bits, because the ranks'
gradient sums are added in a different order (floating-point addition is
not associative).

Token ids: the debug model has 2048 embedding rows, the Qwen tokenizer 248,077
ids. At 248,320 rows the output layer costs about 5 s per micro-batch on a
2-core CPU, so this benchmark folds the ids modulo 2048 before the model
(``--fold-vocab 0`` keeps the full vocabulary). The fold is a fixed function
applied after the digest, identically at every ``D``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zephon_bench.portable import ROOT, portable


def _worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from zephon_core import gathered_batch_digest
    from zephon_vl.testing.tiny_model import build_model, fold_vocab, make_optimizer, train_step
    from zephon_vl.titan.dataloader import ZephonDataLoader, step_rows

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, 2 // world))
    vocab = args.fold_vocab or None
    model = build_model("llama3", vocab_size=vocab) if vocab else build_model("llama3")
    model.load_state_dict(torch.load(args.init, weights_only=True))
    opt = make_optimizer(model, lr=args.lr)
    dl = ZephonDataLoader.Config(recipe="text-demo", num_lanes=args.lanes,
                                 global_batch_size=args.global_batch).build(
        dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=args.seq_len,
        local_batch_size=args.local_batch, snapshot_every_n_steps=None)
    out = Path(args.out)
    start = 0
    if args.resume:
        ck = Path(args.resume)
        model.load_state_dict(torch.load(ck / "model.pt", weights_only=True))
        opt.load_state_dict(torch.load(ck / "optim.pt", weights_only=True))
        dcp.load({"dataloader": dl}, checkpoint_id=str(ck / "dcp"))
        start = dl.step
    it = iter(dl)
    records = []
    for t in range(start, args.steps):
        t0 = time.perf_counter()
        micro = [next(it) for _ in range(dl.microbatches)]
        digest = gathered_batch_digest(step_rows(micro))
        if vocab:
            micro = fold_vocab(micro, vocab)
        loss = train_step(model, opt, micro, torch.device("cpu"))
        records.append({"step": t, "loss": loss, "sha256": digest,
                        "seconds": round(time.perf_counter() - t0, 3)})
        if rank == 0:
            print(f"D={world} step {t} loss {loss:.6f} {digest[:12]}", flush=True)
        if args.save_at is not None and t + 1 == args.save_at:
            ck = out / "ckpt"
            if rank == 0:
                ck.mkdir(parents=True, exist_ok=True)
                torch.save(model.state_dict(), ck / "model.pt")
                torch.save(opt.state_dict(), ck / "optim.pt")
            dcp.save({"dataloader": dl}, checkpoint_id=str(ck / "dcp"))
    if rank == 0:
        (out / "records.json").write_text(json.dumps(records))
    dl.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _launch(nproc: int, out: Path, args: argparse.Namespace, *extra: str) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", "zephon_bench.titan_loss_curves", "--worker",
           "--out", str(out), "--init", str(args.init), "--steps", str(args.steps),
           "--lanes", str(args.lanes), "--global-batch", str(args.global_batch),
           "--local-batch", str(args.local_batch), "--seq-len", str(args.seq_len),
           "--lr", str(args.lr), "--fold-vocab", str(args.fold_vocab), *extra]
    print(f"$ torchrun --nproc_per_node={nproc} ... {' '.join(extra)}", flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads((out / "records.json").read_text())


def _orchestrate(args: argparse.Namespace) -> int:
    import torch

    from zephon_vl.testing.tiny_model import build_model

    dps = [int(x) for x in args.dps.split(",")]
    resume = [int(x) for x in args.resume_dps.split(",") if x]
    with tempfile.TemporaryDirectory(prefix="zephon-titan-curves-") as tmp:
        args.init = Path(tmp, "init.pt")
        model = (build_model("llama3", vocab_size=args.fold_vocab) if args.fold_vocab
                 else build_model("llama3"))
        torch.save(model.state_dict(), args.init)
        del model
        runs: dict[str, list[dict]] = {}
        wall: dict[str, float] = {}
        for d in dps:
            extra = ("--save-at", str(args.save_at)) if d == args.save_dp else ()
            t0 = time.perf_counter()
            runs[f"D={d}"] = _launch(d, Path(tmp, f"d{d}"), args, *extra)
            wall[f"D={d}"] = round(time.perf_counter() - t0, 1)
        ck = Path(tmp, f"d{args.save_dp}", "ckpt")
        for d in resume:
            name = f"D={args.save_dp}->D={d} (resumed)"
            t0 = time.perf_counter()
            runs[name] = _launch(d, Path(tmp, f"resume{d}"), args, "--resume", str(ck))
            wall[name] = round(time.perf_counter() - t0, 1)
    report = _report(runs, args)
    report["wall_seconds"] = wall
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "titan_loss_curves.json").write_text(json.dumps(report, indent=1))
    _plot(runs, args, out / "titan_loss_curves.png")
    print(report["table"])
    return 0 if report["digests_identical"] else 1


def _report(runs: dict[str, list[dict]], args: argparse.Namespace) -> dict:
    ref_name = next(iter(runs))
    ref = {r["step"]: r for r in runs[ref_name]}
    lines = [f"| run | steps | global batches equal to {ref_name} | max abs loss diff vs "
             f"{ref_name} |", "| --- | --- | --- | --- |"]
    ok = True
    per_run = {}
    for name, recs in runs.items():
        same = all(r["sha256"] == ref[r["step"]]["sha256"] for r in recs)
        diff = max(abs(r["loss"] - ref[r["step"]]["loss"]) for r in recs)
        ok &= same
        per_run[name] = {"digests_equal": same, "max_abs_loss_diff": diff,
                         "losses": [r["loss"] for r in recs],
                         "steps": [r["step"] for r in recs]}
        lines.append(f"| {name} | {recs[0]['step']}-{recs[-1]['step']} | "
                     f"{'yes' if same else 'NO'} | {diff:.3g} |")
    internal = {"worker", "out", "init", "resume"}  # one rank's flags, set by `_launch`
    config = {k: portable(str(v)) for k, v in vars(args).items() if k not in internal}
    return {"config": config, "runs": per_run,
            "digests_identical": ok, "table": "\n".join(lines)}


def _plot(runs: dict[str, list[dict]], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = ["-", "--", ":", "-.", (0, (3, 1, 1, 1)), (0, (5, 2))]
    for i, (name, recs) in enumerate(runs.items()):
        resumed = "resumed" in name
        ax.plot([r["step"] for r in recs], [r["loss"] for r in recs], label=name,
                linestyle=styles[i % len(styles)], marker="o" if resumed else None,
                markersize=4, linewidth=2.5 if not resumed else 1.2)
    ax.axvline(args.save_at - 0.5, color="grey", linewidth=0.8)
    ax.text(args.save_at - 0.4, ax.get_ylim()[1], " checkpoint", va="top", fontsize=8,
            color="grey")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (global mean)")
    ax.set_title(f"TorchTitan llama3 debug fed by zephon (text-demo, L={args.lanes}, "
                 f"G={args.global_batch}, S={args.seq_len}), CPU + gloo")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    p.add_argument("--resume", help=argparse.SUPPRESS)
    p.add_argument("--save-at", type=int, default=10)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--local-batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--fold-vocab", type=int, default=2048)
    p.add_argument("--dps", default="1,2,4")
    p.add_argument("--save-dp", type=int, default=2)
    p.add_argument("--resume-dps", default="4,1")
    p.add_argument("--out-dir", default=str(ROOT / "docs"))
    args = p.parse_args(argv)
    if args.worker:
        if "--save-at" not in sys.argv:
            args.save_at = None  # only the job launched with --save-at saves
        return _worker(args)
    return _orchestrate(args)


if __name__ == "__main__":
    raise SystemExit(main())
