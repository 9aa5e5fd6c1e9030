"""The README's TorchTitan commands, tested by running them.

Every ``torchrun`` command of the README must have batch sizes that agree
with its lanes (the command once set ``num_lanes 64`` over a global batch of
8, refused before the first step). The CPU commands (``-m
zephon_vl.testing.titan_cpu``) are run as written, with only where-to-write
flags added (dump folder, ledger, plain logs): they must train their steps at
D=2 and checkpoint; the checkpoint is then resumed at D=1, where the ledger
(SHA-256 of every global batch) and the losses of the remaining steps must
equal the D=2 run's.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

from zephon_core import compare_ledgers, read_ledger  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: where the commands are: the README (the GPU launch and the main job's CPU command) and
#: the guide's first TorchTitan page (the CPU command of every family)
README = ROOT / "README.md"
PAGES = (README, ROOT / "docs" / "start" / "torchtitan.md")
CPU_LAUNCHER = "zephon_vl.testing.titan_cpu"
#: FSDP at another D sums gradients in another order (measured: |diff| ~1e-6).
LOSS_RTOL = 1e-4
STEP_LINE = re.compile(r"step:\s+(\d+)\s+loss:\s+([0-9.]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def torchrun_commands() -> list[list[str]]:
    """Each ``torchrun`` command of the README and the first TorchTitan page, as its words
    (a command both show once)."""
    out = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line.split("#")[0]) if line.strip().startswith("torchrun") \
                    else None
                if words and words not in out:
                    out.append(words)
    return out


def flags(words: list[str]) -> dict[str, str]:
    words = [p for w in words for p in w.split("=", 1)]
    return {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}


def load_config(name: str):
    from zephon_vl.titan.check import load_titan_config

    return load_titan_config(name)


def test_readme_torchtitan_commands_have_consistent_batch_sizes() -> None:
    commands = torchrun_commands()
    assert any(CPU_LAUNCHER in c for c in commands), "the README shows no CPU command"
    for words in commands:
        f = flags(words)
        config = load_config(f["--config"])
        lanes = int(f.get("--dataloader.num_lanes", config.dataloader.num_lanes))
        g = int(f.get("--dataloader.global_batch_size", config.dataloader.global_batch_size))
        trainer_g = int(f.get("--training.global_batch_size", config.training.global_batch_size))
        dp = int(f["--nproc_per_node"])
        assert g % lanes == 0, f"global_batch_size={g} is not a multiple of num_lanes={lanes}"
        assert lanes % dp == 0, f"num_lanes={lanes} is not divisible by D={dp}"
        assert g == trainer_g, f"dataloader G={g} but training.global_batch_size={trainer_g}"


def run(words: list[str], out: Path, timeout: float) -> tuple[dict[int, float], str]:
    """`words` (a README torchrun command) with its output in `out`: (losses by step, log)."""
    assert words[0] == "torchrun"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", *words[1:],
           "--dump_folder", str(out), "--dataloader.ledger", str(out / "ledger.jsonl"),
           "--metrics.disable_color_printing"]
    # every core busy: one rank per core, or all of them for one rank (the D=1 resume)
    threads = max(1, (os.cpu_count() or 1) // int(flags(words)["--nproc_per_node"]))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    # a session of its own: on a timeout the ranks torchrun started are killed with it
    with subprocess.Popen(cmd, cwd=out.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env, start_new_session=True) as proc:
        try:
            printed, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            printed, _ = proc.communicate()
            pytest.fail(f"{shlex.join(words)} ran over {timeout:.0f} s:\n"
                        f"{ANSI.sub('', printed)[-5000:]}")
    log = ANSI.sub("", printed)
    assert proc.returncode == 0, f"{shlex.join(words)} failed:\n{log[-5000:]}"
    return {int(s): float(v) for s, v in STEP_LINE.findall(log)}, log


def divergence_report(same, a, b) -> str:
    """The comparison and, for the first divergent lane, both ledgers' rows and drops of
    that step and the next: enough to tell a lost sample from a moved one."""
    d = same.divergence
    if d is None:
        return f"steps compared {same.common}"
    out = [str(same)]
    for name, ledger in (("D=2", a), ("D=1 resume", b)):
        for t in (d.step, d.step + 1):
            entry = ledger.steps.get(t, {})
            rows = [r for r in entry.get("rows", []) if r.get("lane") == d.lane]
            drops = [x for x in entry.get("drops", []) if x.get("lane") == d.lane]
            out.append(f"{name} step {t} lane {d.lane}: rows {rows} drops {drops}")
    return "\n".join(out)


def with_flag(words: list[str], name: str, value: str) -> list[str]:
    """`words` with flag `name` set to `value` where it stands, or appended."""
    for i, w in enumerate(words):
        if w.startswith(f"{name}="):
            return [*words[:i], f"{name}={value}", *words[i + 1:]]
        if w == name:
            return [*words[:i], name, value, *words[i + 2:]]
    return [*words, name, value]


def cpu_commands() -> list:
    """The README's CPU commands; the first (the main job's) runs in CI, the other
    families' are `heavy` (minutes each: `make test-heavy`)."""
    cpu = [c for c in torchrun_commands() if CPU_LAUNCHER in c]
    return [pytest.param(c, id=flags(c)["--config"], marks=[pytest.mark.heavy] if k else [])
            for k, c in enumerate(cpu)]


@pytest.mark.slow
@pytest.mark.parametrize("words", cpu_commands())
def test_readme_cpu_command_trains_checkpoints_and_resumes_at_d1(words, tmp_path) -> None:
    f = flags(words)
    steps, every = int(f["--training.steps"]), int(f["--checkpoint.interval"])
    assert int(f["--nproc_per_node"]) == 2 and "--checkpoint.enable" in words
    # at least two steps before the checkpoint (past the first step's state) and two after
    # it (the resume goes on, not only its first batch)
    assert every >= 2 and steps - every >= 2
    losses, _ = run(words, tmp_path / "d2", timeout=1500)
    assert sorted(losses) == list(range(1, steps + 1))
    saved = tmp_path / "d2" / "checkpoint" / f"step-{every}"
    assert saved.is_dir(), f"no checkpoint after step {every}"
    shutil.copytree(saved, tmp_path / "d1" / "checkpoint" / f"step-{every}")
    resume = with_flag(with_flag(words, "--nproc_per_node", "1"), "--checkpoint.load_step",
                       str(every))
    resumed, _ = run(resume, tmp_path / "d1", timeout=1500)
    assert sorted(resumed) == list(range(every + 1, steps + 1))
    a, b = (read_ledger(tmp_path / d / "ledger.jsonl") for d in ("d2", "d1"))
    same = compare_ledgers(a, b)
    assert same.ok and same.common == list(range(every, steps)), divergence_report(same, a, b)
    for step in resumed:
        assert resumed[step] == pytest.approx(losses[step], rel=LOSS_RTOL), step
