"""The README's TorchTitan command runs as written: its batch sizes agree with its lanes.

The command once set ``num_lanes 64`` over the configs' global batch of 8,
which the loader refuses (``G % L != 0``) before the first step.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

README = Path(__file__).resolve().parents[2] / "README.md"


def torchrun_commands() -> list[dict[str, str]]:
    """Each ``torchrun`` command of the README as {flag: value}."""
    text = README.read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            if line.strip().startswith("torchrun"):
                words = [p for w in shlex.split(line) for p in w.split("=", 1)]
                out.append({w: words[i + 1] for i, w in enumerate(words[:-1])
                            if w.startswith("--")})
    return out


def test_readme_torchtitan_command_has_consistent_batch_sizes() -> None:
    import transformers  # noqa: F401  (before the torchvision stub; see titan_cpu)

    from zephon_vl.testing.titan_cpu import stub_torchvision

    stub_torchvision()
    from zephon_vl.titan.config_registry import zephon_llama3_debug, zephon_qwen35_debug

    configs = {"zephon_qwen35_debug": zephon_qwen35_debug,
               "zephon_llama3_debug": zephon_llama3_debug}
    commands = [c for c in torchrun_commands() if c.get("--config") in configs]
    assert commands, "the README shows no TorchTitan command"
    for flags in commands:
        config = configs[flags["--config"]]()
        lanes = int(flags.get("--dataloader.num_lanes", config.dataloader.num_lanes))
        g = int(flags.get("--dataloader.global_batch_size", config.dataloader.global_batch_size))
        trainer_g = int(flags.get("--training.global_batch_size",
                                  config.training.global_batch_size))
        dp = int(flags["--nproc_per_node"])
        assert g % lanes == 0, f"global_batch_size={g} is not a multiple of num_lanes={lanes}"
        assert lanes % dp == 0, f"num_lanes={lanes} is not divisible by D={dp}"
        assert g == trainer_g, f"dataloader G={g} but training.global_batch_size={trainer_g}"
