#!/usr/bin/env python
"""GPU smoke test: TorchTitan's Trainer, elastic digests and device normalization on one device.

    python scripts/gpu_smoke.py --json smoke.json    # one CUDA GPU (the default when present)
    python scripts/gpu_smoke.py --device cpu --runner inline --steps 3 --save-at 2 \\
        --fold-vocab 2048 --layers 4 --vision-layers 1 --max-pixels 16384 \\
        --min-pixels 4096                             # anywhere, slowly

For each model (``--models``: TorchTitan's ``llama3`` debug model on
``text-demo``, and its ``qwen3_5``, ``kimi_k2_5`` and ``muse_glimmer`` debug
VLMs on ``--vlm-recipe``, each with its family's preset) it checks:

1. **trainer**: TorchTitan's own Trainer (``python -m zephon_vl.testing.titan_trainer``
   under ``torchrun``, one process on the device) trains ``--steps`` steps and
   checkpoints after ``--save-at`` (DCP: model, optimizer, LR schedule and the
   dataloader); a second Trainer resumes from that checkpoint. Passes when the
   dataloader ledgers (SHA-256 of every global batch) are equal and every
   resumed loss is within ``--loss-rtol`` of the uninterrupted run's (default
   1e-6 on CPU, where it is deterministic; 1e-4 on CUDA, whose backward
   kernels may add in another order).
2. **elastic**: ``--dp`` data-parallel ranks simulated in one process
   (``ZephonDataLoader`` instances built like the Trainer builds them), the
   model trained on each global batch rank by rank, checkpointed after
   ``--save-at`` steps and resumed at ``--resume-dp`` ranks. Passes when every
   resumed global batch hashes like the uninterrupted one (the losses are
   reported; with a fixed micro-batch size the rows run in the same order at
   every D, so they agree too). tests/titan/test_titan_families_trainer.py
   resumes kimi_k2_5 and muse_glimmer at other D with real ranks, too.

And once, for the VLM recipe: **h2d_normalize**, the time per step to move a
step's micro-batches to the device, uint8 pixels normalized there
(``ImageSettings(normalize="device")``, ``zephon_vl.to_device``), beside the same
step collated to float32 on the host and copied; and the largest difference
between the two pixel tensors, which must be at most ``--normalize-atol``
(default 0: the same table lookup, so the same floats). On CUDA the uint8 path runs
under ``torch.cuda.set_sync_debug_mode("error")``: it must never make the host wait for
the device (the copy and the normalization overlap the host's next work).

Prints one line per check and exits 1 if any fails. ``--json`` records
everything (per-step digests, losses, times).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

TRAINER_CONFIGS = {"llama3": "zephon_llama3_debug", "qwen3_5": "zephon_qwen35_debug",
                   "kimi_k2_5": "zephon_kimi_debug", "muse_glimmer": "zephon_muse_debug"}
#: The models the elastic check can build (``zephon_vl.testing.tiny_model.build_model``).
ELASTIC_MODELS = tuple(TRAINER_CONFIGS)


def _recipe(args: argparse.Namespace, model: str) -> str:
    return "text-demo" if model == "llama3" else args.vlm_recipe


def _image_flags(args: argparse.Namespace, model: str) -> list[str]:
    """The image budget flags of a VLM's Trainer run: qwen3_5 takes ``--max-pixels``,
    kimi_k2_5 ``--max-patches`` (0: its preset's), muse_glimmer its preset's pixels."""
    if model == "qwen3_5":
        return ["--dataloader.max_pixels", str(args.max_pixels),
                "--dataloader.min_pixels", str(args.min_pixels)]
    if model == "kimi_k2_5" and args.max_patches:
        return ["--dataloader.max_patches", str(args.max_patches)]
    return []


def _loader_config(args: argparse.Namespace, model: str, **extra: Any):
    """The dataloader of `model`'s ready config (zephon_vl.titan.config_registry), with this
    run's recipe, geometry and image budget: what its Trainer run builds."""
    import dataclasses

    import transformers  # noqa: F401  (before the torchvision stub; see zephon_vl.testing.titan_cpu)

    from zephon_vl.testing.titan_cpu import stub_torchvision

    stub_torchvision()  # the VLM config registries import torchvision; a no-op where it is
    from zephon_vl.titan import config_registry

    cfg = getattr(config_registry, TRAINER_CONFIGS[model])().dataloader
    fields: dict[str, Any] = {"recipe": _recipe(args, model), "num_lanes": args.lanes,
                              "global_batch_size": args.global_batch, "runner": args.runner}
    if model == "qwen3_5":
        fields.update(max_pixels=args.max_pixels, min_pixels=args.min_pixels)
    if model == "kimi_k2_5" and args.max_patches:
        fields["max_patches"] = args.max_patches
    return dataclasses.replace(cfg, trainer_global_batch_size=0, **fields, **extra)


def _qwen_loader_config(args: argparse.Namespace, **extra: Any):
    """qwen3_5's dataloader as `_loader_config` gives it, built without TorchTitan's model
    registry: the h2d check needs only the loader, so it also runs where the installed torch
    is too old for TorchTitan's models (0.3.0 needs a torch whose FSDP has
    ``DataParallelMeshDims``) but its dataloader module imports."""
    from zephon_vl.titan.dataloader import ZephonDataLoader

    return ZephonDataLoader.Config(
        recipe=args.vlm_recipe, num_lanes=args.lanes, global_batch_size=args.global_batch,
        runner=args.runner, model_format="qwen3_5", image_preset="qwen3_5",
        max_pixels=args.max_pixels, min_pixels=args.min_pixels, **extra)


def _build(cfg, args: argparse.Namespace, dp: int, rank: int):
    return cfg.build(dp_world_size=dp, dp_rank=rank, tokenizer=None, seq_len=args.seq_len,
                     local_batch_size=args.local_batch, snapshot_every_n_steps=None)


# --- 1. TorchTitan's Trainer: train, checkpoint, resume -------------------------------------
def _trainer_job(args: argparse.Namespace, model: str, out: Path, resume: bool):
    from zephon_vl.testing.titan_trainer import TrainerJob

    titan = ["--module", "zephon_vl.titan", "--config", TRAINER_CONFIGS[model],
             "--training.steps", str(args.steps), "--training.seq_len", str(args.seq_len),
             "--training.local_batch_size", str(args.local_batch),
             "--training.global_batch_size", str(args.global_batch),
             "--dataloader.recipe", _recipe(args, model),
             "--dataloader.num_lanes", str(args.lanes),
             "--dataloader.global_batch_size", str(args.global_batch),
             "--dataloader.runner", args.runner, "--checkpoint.enable",
             "--checkpoint.interval", str(args.save_at)]
    titan += _image_flags(args, model)
    if resume:
        titan += ["--checkpoint.load_step", str(args.save_at)]
    env = {"CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else {}
    return TrainerJob(out, 1, titan, fold_vocab=args.fold_vocab, layers=args.layers,
                      vision_layers=args.vision_layers if model != "llama3" else 0, env=env)


def trainer_checks(args: argparse.Namespace, tmp: Path) -> dict[str, dict]:
    """Every model's uninterrupted Trainer runs at once, then every resumed one."""
    import shutil

    from zephon_core import compare_ledgers, read_ledger

    rtol = args.loss_rtol if args.loss_rtol is not None else (
        1e-6 if args.device == "cpu" else 1e-4)
    first = {m: _trainer_job(args, m, tmp / f"trainer-{m}", False).start() for m in args.models}
    ref = {m: job.wait(args.timeout) for m, job in first.items()}
    second = {}
    for m, r in ref.items():
        if r.ok:
            src = tmp / f"trainer-{m}" / "ckpt" / f"step-{args.save_at}"
            shutil.copytree(src, tmp / f"trainer-{m}-resumed" / "ckpt" / src.name)
            second[m] = _trainer_job(args, m, tmp / f"trainer-{m}-resumed", True).start()
    out = {}
    for m, r in ref.items():
        if not r.ok:
            out[m] = {"ok": False, "error": "uninterrupted run failed", "tail": r.output[-3000:]}
            continue
        res = second[m].wait(args.timeout)
        if not res.ok:
            out[m] = {"ok": False, "error": "resumed run failed", "tail": res.output[-3000:]}
            continue
        a, b = read_ledger(r.ledger), read_ledger(res.ledger)
        same = compare_ledgers(a, b)
        resumed_steps = list(range(args.save_at + 1, args.steps + 1))
        diffs = {t: abs(res.losses[t] - r.losses[t]) for t in resumed_steps
                 if t in res.losses and t in r.losses}
        losses_ok = len(diffs) == len(resumed_steps) and all(
            d <= rtol * abs(r.losses[t]) for t, d in diffs.items())
        digests_ok = same.ok and same.common == list(range(args.save_at, args.steps))
        out[m] = {"ok": digests_ok and losses_ok, "digests_identical": digests_ok,
                  "losses_within_tolerance": losses_ok, "loss_rtol": rtol,
                  "max_abs_loss_diff": max(diffs.values(), default=None),
                  "uninterrupted_losses": r.losses, "resumed_losses": res.losses,
                  "digests": {t: a.steps[t]["digest"] for t in sorted(a.steps)},
                  "resumed_digests": {t: b.steps[t]["digest"] for t in sorted(b.steps)}}
    return out


# --- 2. simulated ranks: D vs resumed on another D ------------------------------------------
def _global_step(loaders: list, iters: list) -> tuple[list, str]:
    from zephon_core import batch_digest
    from zephon_vl.titan.dataloader import next_global_step, step_rows

    micro = next_global_step(loaders, iters)
    return micro, batch_digest(step_rows(micro))


def _simulated_run(args: argparse.Namespace, model_name: str, dp: int, steps: range,
                   device, ckpt: Path, save: bool, resume: bool) -> list[dict]:
    import torch

    from zephon_vl.testing.tiny_model import build_model, fold_vocab, make_optimizer, train_step
    from zephon_vl.titan.dataloader import merged_state

    extra = {"vocab_size": args.fold_vocab} if args.fold_vocab else {}
    model = build_model(model_name, device=device, seed=0, layers=args.layers,
                        vision_layers=args.vision_layers if model_name != "llama3" else 0,
                        **extra)
    opt = make_optimizer(model, lr=args.lr)
    cfg = _loader_config(args, model_name, device=str(device))
    loaders = [_build(cfg, args, dp, d) for d in range(dp)]
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
        print(f"  {model_name} D={dp} step {t}: {digest[:16]} loss {loss:.6f} "
              f"({out[-1]['seconds']:.2f}s)", flush=True)
        if save and t + 1 == args.save_at:
            ckpt.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), ckpt / "model.pt")
            torch.save(opt.state_dict(), ckpt / "optim.pt")
            (ckpt / "dataloader.json").write_text(json.dumps(merged_state(loaders)))
    for dl in loaders:
        dl.close()
    return out


def elastic_check(args: argparse.Namespace, model: str, device, tmp: Path) -> dict:
    ckpt = tmp / f"elastic-{model}"
    ref = _simulated_run(args, model, args.dp, range(args.steps), device, ckpt, True, False)
    res = _simulated_run(args, model, args.resume_dp, range(args.save_at, args.steps), device,
                         ckpt, False, True)
    by_step = {r["step"]: r for r in ref}
    same = all(r["sha256"] == by_step[r["step"]]["sha256"] for r in res)
    diff = max(abs(r["loss"] - by_step[r["step"]]["loss"]) for r in res)
    return {"ok": same, "digests_identical": same, "max_abs_loss_diff": diff,
            "uninterrupted": ref, "resumed": res}


# --- 3. host-to-device + normalize per step -------------------------------------------------
def h2d_check(args: argparse.Namespace, device) -> dict:
    """uint8 to the device + normalize there, vs float32 collated on the host + copied."""
    import torch

    from zephon_vl import to_device

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    wire = _build(_qwen_loader_config(args, normalize_on_device=True), args, 1, 0)
    host = _build(_qwen_loader_config(args, normalize_on_device=False), args, 1, 0)
    wire_s, host_s, wire_bytes, host_bytes, worst = [], [], [], [], 0.0
    host_sync = ""
    for _ in range(args.h2d_steps):
        w, h = next(wire.loader), next(host.loader)
        w, h = (w if isinstance(w, list) else [w]), (h if isinstance(h, list) else [h])
        sync()
        t0 = time.perf_counter()
        if device.type == "cuda":  # the uint8 path must never make the host wait
            torch.cuda.set_sync_debug_mode("error")
        try:
            moved = [to_device(mb, device) for mb in w]
        except RuntimeError as exc:
            host_sync = host_sync or str(exc).splitlines()[0]
            moved = [to_device(mb, device) for mb in w]
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
        sync()
        t1 = time.perf_counter()
        copied = [to_device(mb, device) for mb in h]
        sync()
        t2 = time.perf_counter()
        wire_s.append(t1 - t0)
        host_s.append(t2 - t1)
        wire_bytes.append(sum(t.nbytes for mb in w for t in mb.values()
                              if isinstance(t, torch.Tensor)))
        host_bytes.append(sum(t.nbytes for mb in h for t in mb.values()
                              if isinstance(t, torch.Tensor)))
        for a, b in zip(moved, copied, strict=True):
            pa, pb = a.get("pixel_values"), b.get("pixel_values")
            if pa is None and pb is None:
                continue
            if pa is None or pb is None or pa.shape != pb.shape or pa.dtype != pb.dtype:
                worst = float("inf")
                continue
            if pa.numel():
                worst = max(worst, float((pa.float().cpu() - pb.float().cpu()).abs().max()))
    wire.close()
    host.close()
    med_w, med_h = statistics.median(wire_s), statistics.median(host_s)
    return {"ok": worst <= args.normalize_atol and not host_sync,
            "host_sync_in_uint8_path": host_sync or None,
            "max_abs_diff_vs_cpu_float32_collate": worst,
            "atol": args.normalize_atol, "steps": args.h2d_steps,
            "median_ms_uint8_to_device_and_normalize": round(med_w * 1e3, 3),
            "median_ms_float32_host_collate_to_device": round(med_h * 1e3, 3),
            "ratio_float32_over_uint8": round(med_h / med_w, 3) if med_w else None,
            "median_bytes_uint8": int(statistics.median(wire_bytes)),
            "median_bytes_float32": int(statistics.median(host_bytes)),
            "ms_per_step_uint8": [round(s * 1e3, 3) for s in wire_s],
            "ms_per_step_float32": [round(s * 1e3, 3) for s in host_s]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default=",".join(TRAINER_CONFIGS),
                   help="comma-separated: llama3 (text-demo), qwen3_5, kimi_k2_5, "
                        "muse_glimmer (--vlm-recipe)")
    p.add_argument("--checks", default="trainer,elastic,h2d",
                   help="comma-separated subset of trainer, elastic, h2d")
    p.add_argument("--elastic-models", default=None,
                   help="models of the elastic check (default: --models that it can "
                        f"build, of {ELASTIC_MODELS}); on a CPU the qwen3_5 one is slow (a "
                        "Python loop over tokens)")
    p.add_argument("--vlm-recipe", default="vlm-mix-demo")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--resume-dp", type=int, default=4)
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--local-batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--max-pixels", type=int, default=64 * 32 * 32)
    p.add_argument("--min-pixels", type=int, default=0, help="0: the preset's")
    p.add_argument("--max-patches", type=int, default=0,
                   help="kimi_k2_5's patch budget an image; 0: the preset's (16384)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-at", type=int, default=4)
    p.add_argument("--lr", type=float, default=8e-4)
    p.add_argument("--runner", default="auto", help="zephon's runner (never changes a batch)")
    p.add_argument("--fold-vocab", type=int, default=0,
                   help="fold token ids into N model ids after hashing (fast on CPU; 0 = the "
                        "full 248,320-id vocabulary)")
    p.add_argument("--layers", type=int, default=0, help="keep the first N decoder layers")
    p.add_argument("--vision-layers", type=int, default=0,
                   help="keep the first N vision-encoder blocks (qwen3_5)")
    p.add_argument("--loss-rtol", type=float, default=None,
                   help="resumed Trainer losses vs uninterrupted (default 1e-6 CPU, 1e-4 CUDA)")
    p.add_argument("--normalize-atol", type=float, default=0.0)
    p.add_argument("--h2d-steps", type=int, default=8)
    p.add_argument("--timeout", type=float, default=900, help="seconds per Trainer run")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.checks = [c for c in args.checks.split(",") if c]
    args.elastic_models = ([m for m in args.models if m in ELASTIC_MODELS]
                           if args.elastic_models is None
                           else [m for m in args.elastic_models.split(",") if m])
    if unknown := set(args.models) - set(TRAINER_CONFIGS):
        p.error(f"--models: unknown {sorted(unknown)}; choose from {sorted(TRAINER_CONFIGS)}")
    if unknown := set(args.elastic_models) - set(ELASTIC_MODELS):
        p.error(f"--elastic-models: unknown {sorted(unknown)}; choose from {ELASTIC_MODELS}")
    if unknown := set(args.checks) - {"trainer", "elastic", "h2d"}:
        p.error(f"--checks: unknown {sorted(unknown)}")
    if not 0 < args.save_at < args.steps:
        p.error("--save-at must be between 0 and --steps (exclusive)")
    return args


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}", flush=True)
    result: dict[str, Any] = {"device": str(device), "device_name": name, "args": vars(args),
                              "trainer": {}, "elastic": {}}
    with tempfile.TemporaryDirectory(prefix="zephon-gpu-smoke-") as tmp:
        if "trainer" in args.checks:
            result["trainer"] = trainer_checks(args, Path(tmp))
            for m, r in result["trainer"].items():
                print(f"trainer {m}: {'ok' if r['ok'] else 'FAIL'} "
                      f"(digests {'identical' if r.get('digests_identical') else 'DIFFER'}, "
                      f"max |loss diff| after resume {r.get('max_abs_loss_diff')}, "
                      f"rtol {r.get('loss_rtol')})" + (f" {r['error']}" if 'error' in r else ""),
                      flush=True)
                if "tail" in r:
                    print(r["tail"], flush=True)
        if "elastic" in args.checks:
            for m in args.elastic_models:
                r = result["elastic"][m] = elastic_check(args, m, device, Path(tmp))
                print(f"elastic {m}: D={args.dp} -> D={args.resume_dp} after step "
                      f"{args.save_at - 1}: {'ok' if r['ok'] else 'FAIL'} (digests "
                      f"{'identical' if r['digests_identical'] else 'DIFFER'}, max |loss diff| "
                      f"{r['max_abs_loss_diff']:.3g})", flush=True)
    if "h2d" in args.checks and "qwen3_5" in args.models:
        r = result["h2d_normalize"] = h2d_check(args, device)
        print(f"h2d+normalize: {'ok' if r['ok'] else 'FAIL'}: uint8 + normalize on "
              f"{device.type} {r['median_ms_uint8_to_device_and_normalize']} ms/step "
              f"({r['median_bytes_uint8']} B) vs float32 copy "
              f"{r['median_ms_float32_host_collate_to_device']} ms/step "
              f"({r['median_bytes_float32']} B); max |diff| vs CPU float32 collate "
              f"{r['max_abs_diff_vs_cpu_float32_collate']} (atol {r['atol']}); host waits "
              f"for the device in the uint8 path: {r['host_sync_in_uint8_path'] or 'none'}",
              flush=True)
    checks = [*result["trainer"].values(), *result["elastic"].values()]
    if "h2d_normalize" in result:
        checks.append(result["h2d_normalize"])
    result["ok"] = bool(checks) and all(c["ok"] for c in checks)
    print("PASS" if result["ok"] else "FAIL", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
