"""Run TorchTitan's own Trainer with zephon's loader and record what it did.

    torchrun --nproc_per_node=2 -m zephon_vl.testing.titan_trainer \\
        --record run.json --fold-vocab 2048 --layers 4 --vision-layers 1 -- \\
        --module zephon_vl.titan --config zephon_qwen35_debug --training.steps 3 ...

Everything after ``--`` is TorchTitan's command line (``torchtitan.train``);
the Trainer, its FSDP wrapping, DCP checkpointing and loss are TorchTitan's
own. This launcher adds only what tests and ``scripts/gpu_smoke.py`` need:

* ``--record PATH``: rank 0 writes the loss and grad norm of every step as JSON
  (``metrics.log_freq`` is set to 1), rewritten after each step, so a run that
  dies still leaves the steps it finished;
* ``--fold-vocab N``: the model's vocabulary becomes ``N`` ids and every
  micro-batch is folded into it (``tiny_model.fold_vocab``, special ids kept
  apart) *after* the loader, so digests and ledgers see the real ids. The
  output layer over 248,320 ids dominates a debug model's cost on a CPU;
* ``--layers N`` / ``--vision-layers N``: keep the first ``N`` decoder layers
  (vision-encoder blocks) of the model, for a tiny model on CPU.

Without CUDA it applies ``zephon_vl.testing.titan_cpu`` first (gloo, CPU patches).

From Python, `TrainerJob` starts such a run in the background and `TrainerJob.wait`
gives a `TrainerResult` (losses by step, the ledger file, whether it timed out).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split this launcher's options from TorchTitan's (after ``--``)."""
    if "--" in argv:
        cut = argv.index("--")
        ours, titan = argv[:cut], argv[cut + 1:]
    else:
        ours, titan = [], argv
    p = argparse.ArgumentParser(prog="python -m zephon_vl.testing.titan_trainer",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--record", default=None, help="rank 0 writes per-step losses here (JSON)")
    p.add_argument("--fold-vocab", type=int, default=0,
                   help="shrink the model's vocabulary to N ids and fold the batches into it")
    p.add_argument("--layers", type=int, default=0, help="keep the first N decoder layers")
    p.add_argument("--vision-layers", type=int, default=0,
                   help="keep the first N vision-encoder blocks")
    return p.parse_args(ours), titan


def shrink(config: Any, args: argparse.Namespace) -> None:
    """Apply ``--fold-vocab``, ``--layers`` and ``--vision-layers`` to a Trainer config."""
    from zephon_vl.testing.tiny_model import shrink_model_config
    from zephon_vl.titan.config_registry import set_vocab_size

    if args.fold_vocab:
        set_vocab_size(config, args.fold_vocab)
    try:
        shrink_model_config(config.model_spec.model, args.layers, args.vision_layers)
    except ValueError as exc:
        raise SystemExit(f"zephon_vl.testing.titan_trainer: {exc}") from None
    config.metrics.log_freq = 1


def instrument(trainer: Any, args: argparse.Namespace, rank: int) -> None:
    """Fold the Trainer's batches (``--fold-vocab``) and record its logged losses."""
    if args.fold_vocab:
        from zephon_vl.testing.tiny_model import fold_vocab

        batches = trainer.batch_generator

        def folded(data: Any):
            for x, y in batches(data):
                yield fold_vocab([(x, y)], args.fold_vocab)[0]

        trainer.batch_generator = folded
    if args.record and rank == 0:
        log = trainer.metrics_processor.log
        path = Path(args.record)
        steps: dict[str, dict[str, float]] = {}

        def record(step: int, global_avg_loss: float, global_max_loss: float,
                   grad_norm: float, extra_metrics: dict[str, Any] | None = None) -> None:
            steps[str(step)] = {"loss": float(global_avg_loss), "grad_norm": float(grad_norm)}
            path.write_text(json.dumps({"world_size": int(os.environ.get("WORLD_SIZE", 1)),
                                        "steps": steps}, indent=1))
            log(step, global_avg_loss, global_max_loss, grad_norm,
                extra_metrics=extra_metrics)

        trainer.metrics_processor.log = record


@dataclass
class TrainerResult:
    """What a finished (or killed) Trainer run left behind."""

    returncode: int | None
    """None when it was killed at the timeout."""
    output: str
    """stdout and stderr of torchrun and every rank."""
    losses: dict[int, float]
    """Trainer step (from 1) -> global mean loss, as the Trainer logged it."""
    ledger: Path

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass
class TrainerJob:
    """``torchrun --nproc_per_node=<nproc> -m zephon_vl.testing.titan_trainer ...`` in `out`.

    `titan_args` is TorchTitan's command line; the job adds its dump folder
    (`out`), the dataloader's ledger (``out/ledger.jsonl``) and plain logs.
    Checkpoints go to ``out/ckpt/step-<n>``. Several jobs may run at once
    (each torchrun picks a free port).
    """

    out: Path
    nproc: int
    titan_args: list[str]
    fold_vocab: int = 0
    layers: int = 0
    vision_layers: int = 0
    env: dict[str, str] = field(default_factory=dict)
    _proc: subprocess.Popen | None = None

    @property
    def ledger(self) -> Path:
        return self.out / "ledger.jsonl"

    @property
    def record(self) -> Path:
        return self.out / "losses.json"

    def command(self) -> list[str]:
        ours = ["--record", str(self.record), "--fold-vocab", str(self.fold_vocab),
                "--layers", str(self.layers), "--vision-layers", str(self.vision_layers)]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={self.nproc}", "-m", "zephon_vl.testing.titan_trainer",
                *ours, "--", *self.titan_args, "--dump_folder", str(self.out),
                "--checkpoint.folder", "ckpt", "--dataloader.ledger", str(self.ledger),
                "--metrics.disable_color_printing"]

    def start(self) -> TrainerJob:
        self.out.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", **self.env}
        self._proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=env,
                                      start_new_session=True)
        return self

    def wait(self, timeout: float) -> TrainerResult:
        """Wait up to `timeout` seconds; past it the whole process group is killed."""
        import signal

        assert self._proc is not None, "start() the job first"
        try:
            output, _ = self._proc.communicate(timeout=timeout)
            code: int | None = self._proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            output, _ = self._proc.communicate()
            code = None
        losses = {}
        if self.record.is_file():
            losses = {int(k): v["loss"]
                      for k, v in json.loads(self.record.read_text())["steps"].items()}
        return TrainerResult(code, output, losses, self.ledger)


def main(argv: list[str] | None = None) -> None:
    """``torchtitan.train.main`` with the options above."""
    import torch

    args, titan_args = parse(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        from zephon_vl.testing.titan_cpu import apply

        apply()
    from torchtitan.config import ConfigManager
    from torchtitan.tools.logging import init_logger

    init_logger()
    config = ConfigManager().parse_args(titan_args)
    shrink(config, args)
    trainer = config.build()
    try:
        instrument(trainer, args, int(os.environ.get("RANK", 0)))
        trainer.train()
    finally:
        trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
