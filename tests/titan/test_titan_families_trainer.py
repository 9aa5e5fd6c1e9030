"""TorchTitan's own Trainer on the kimi_k2_5 and muse_glimmer debug VLMs fed by zephon.

For each family: ``zephon_kimi_debug`` / ``zephon_muse_debug`` (tiny: 2 decoder
layers, 1 vision block, 2,048 folded ids) train 3 steps at D=2 over
``vlm-mix-demo`` on the CPU launcher (torchrun + gloo + FSDP) and checkpoint
after step 2; the checkpoint resumes at D=1 and D=4, side by side, and the
ledgers (per-step SHA-256 of the global batch) must equal D=2's.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

from zephon_core import compare_ledgers, read_ledger  # noqa: E402
from zephon_vl.testing.titan_trainer import TrainerJob  # noqa: E402

STEPS, SAVE_AT = 3, 2
TINY = {"fold_vocab": 2048, "layers": 2, "vision_layers": 1}
#: L=4 lanes, G=4 rows of 256 tokens, 1 row per micro-batch: D in {1, 2, 4}
COMMON = ["--module", "zephon_vl.titan", "--training.seq_len", "256",
          "--training.local_batch_size", "1", "--training.global_batch_size", "4",
          "--dataloader.num_lanes", "4", "--dataloader.global_batch_size", "4",
          "--dataloader.runner", "inline"]
#: kimi: at most 256 patches an image (64 tokens); muse: its own 784..3136 pixels
CONFIGS = {"kimi_k2_5": ["--config", "zephon_kimi_debug", "--dataloader.max_patches", "256"],
           "muse_glimmer": ["--config", "zephon_muse_debug"]}


def _args(family: str) -> list[str]:
    return [*COMMON, *CONFIGS[family], "--training.steps", str(STEPS), "--checkpoint.enable"]


@pytest.mark.slow
@pytest.mark.heavy  # 2 minutes a family on 2 cores; qwen3_5 Trainer in CI: test_titan_trainer
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_checkpoint_at_d2_resumes_at_d1_and_d4_with_identical_data(family, tmp_path):
    d2 = TrainerJob(tmp_path / "d2", 2, [*_args(family), "--checkpoint.interval",
                                         str(SAVE_AT)], **TINY).start().wait(400)
    assert d2.ok, d2.output[-4000:]
    assert sorted(d2.losses) == list(range(1, STEPS + 1))
    reference = read_ledger(d2.ledger)
    assert sorted(reference.steps) == list(range(STEPS))
    jobs = {}
    for dp in (1, 4):
        out = tmp_path / f"d{dp}"
        shutil.copytree(tmp_path / "d2" / "ckpt" / f"step-{SAVE_AT}",
                        out / "ckpt" / f"step-{SAVE_AT}")
        jobs[dp] = TrainerJob(out, dp, [*_args(family), "--checkpoint.load_step",
                                        str(SAVE_AT)], **TINY).start()
    for dp, job in jobs.items():
        resumed = job.wait(400)
        assert resumed.ok, f"D={dp}\n" + resumed.output[-4000:]
        assert sorted(resumed.losses) == [STEPS], f"D={dp} did not start after the checkpoint"
        same = compare_ledgers(reference, read_ledger(resumed.ledger))
        assert same.ok and same.common == list(range(SAVE_AT, STEPS)), f"D={dp}: {same}"
