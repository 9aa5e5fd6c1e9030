"""Real multi-process runs with torchrun and gloo: global state and elastic resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.torchrun_job import make_recipe
from zephon_core import Execution, Loader, batch_digest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run_job(nproc: int, out: Path, *extra: str) -> list[list[str]]:
    """Run the job; each rank's gloo threads left after destroy_process_group."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", "tests.helpers.torchrun_job", "--out", str(out),
           *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((out / f"threads-rank{r}.json").read_text()) for r in range(nproc)]


def _torchrun(nproc: int, out: Path, *extra: str) -> None:
    for r, left in enumerate(_run_job(nproc, out, *extra)):
        assert left == [], f"rank {r}: gloo threads outlived destroy_process_group: {left}"


def test_the_thread_check_sees_a_group_held_past_destroy(tmp_path: Path) -> None:
    """The check of `_torchrun` can fail: a reference to the group keeps its threads."""
    assert _run_job(1, tmp_path, "--steps", "1", "--hold-group")[0] != []


def _global_digests(out: Path, nproc: int) -> dict[int, str]:
    per_rank = [torch.load(out / f"batches-rank{r}.pt") for r in range(nproc)]
    return {t: batch_digest({k: torch.cat([b[t][k] for b in per_rank]) for k in per_rank[0][t]})
            for t in per_rank[0]}


def _reference(steps: int) -> dict[int, str]:
    with Loader(make_recipe(), execution=Execution(runner="inline")) as loader:
        return {t: batch_digest(next(loader)) for t in range(steps)}


def test_torchrun_global_state_and_elastic_resume(tmp_path: Path) -> None:
    ref = _reference(6)
    first = tmp_path / "d2"
    first.mkdir()
    _torchrun(2, first, "--steps", "6", "--save-at", "3")
    assert _global_digests(first, 2) == ref
    states = [(first / f"state-rank{r}.json").read_text() for r in range(2)]
    assert states[0] == states[1], "ranks returned different global states"
    assert sorted(json.loads(states[0])["lanes"]) == ["0", "1", "2", "3"], "state is not global"

    for nproc in (4, 1):
        resumed = tmp_path / f"resume-d{nproc}"
        resumed.mkdir()
        _torchrun(nproc, resumed, "--steps", "6", "--resume", str(first / "state-rank0.json"))
        assert _global_digests(resumed, nproc) == {t: ref[t] for t in (3, 4, 5)}


def test_torchrun_stateful_dataloader_state_is_global_and_resumes(tmp_path: Path) -> None:
    """`Loader.as_torch_dataset()` under StatefulDataLoader: its own ``state_dict()`` holds
    zephon's global state on every rank (gathered over gloo), and it resumes on one rank."""
    ref = _reference(6)
    first = tmp_path / "d2"
    first.mkdir()
    _torchrun(2, first, "--steps", "6", "--save-at", "3", "--torch-dataset")
    assert _global_digests(first, 2) == ref
    states = [(first / f"state-rank{r}.json").read_text() for r in range(2)]
    assert states[0] == states[1], "ranks returned different global states"
    zephon = json.loads(json.loads(states[0])["dataset_state"]["zephon_state"])
    assert (zephon["step"], sorted(zephon["lanes"])) == (3, ["0", "1", "2", "3"])
    resumed = tmp_path / "resume-d1"
    resumed.mkdir()
    _torchrun(1, resumed, "--steps", "6", "--resume", str(first / "state-rank0.json"),
              "--torch-dataset")
    assert _global_digests(resumed, 1) == {t: ref[t] for t in (3, 4, 5)}
