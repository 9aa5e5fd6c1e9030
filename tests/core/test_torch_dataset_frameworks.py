"""docs/frameworks.md, run: a Hugging Face Trainer and an Accelerate loop fed by
`Loader.as_torch_dataset()` on 2 CPU ranks (gloo), checkpointed with the framework's own
save after step 2 and resumed on 1 rank, train on the batches of the uninterrupted run.

Needs ``accelerate`` (the Trainer needs it too); skipped where it is not installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.frameworks import MICRO, SAVE_AT, SPEC, STEPS
from zephon_core import Execution, Loader

pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def run(nproc: int, mode: str, out: Path, *resume: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", "tests.helpers.frameworks", mode, str(out),
           *resume]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def steps_seen(out: Path, nproc: int, micro: int) -> list[torch.Tensor]:
    """The global batches trained on: per step, each rank's micro-batches in rank order."""
    seen = [torch.load(out / f"seen-rank{r}.pt") for r in range(nproc)]
    return [torch.cat([seen[r][t * micro + m] for r in range(nproc) for m in range(micro)])
            for t in range(len(seen[0]) // micro)]


def reference() -> list[torch.Tensor]:
    from tests.helpers.core import build_recipe

    with Loader(build_recipe(SPEC), 0, 1, Execution(runner="inline")) as loader:
        return [next(loader)["input"] for _ in range(STEPS)]


@pytest.mark.parametrize(("mode", "micro"), [("trainer", MICRO), ("accelerate", 1)])
def test_framework_saves_on_2_ranks_and_resumes_on_1(tmp_path: Path, mode: str,
                                                     micro: int) -> None:
    pytest.importorskip("transformers")
    ref = reference()
    first, resumed = tmp_path / "d2", tmp_path / "d1"
    first.mkdir()
    resumed.mkdir()
    run(2, mode, first)
    got = steps_seen(first, 2, micro)
    assert len(got) == STEPS and all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))
    run(1, mode, resumed, str(first / f"checkpoint-{SAVE_AT}"))
    got = steps_seen(resumed, 1, micro)
    assert len(got) == STEPS - SAVE_AT
    assert all(torch.equal(a, b) for a, b in zip(got, ref[SAVE_AT:], strict=True))
