"""Spawned workers do not run the parent's main module again unless their stage needs it.

Python's spawn start method runs the parent's ``__main__`` (a training script,
the ``zephon-vl`` command) in every new process before it unpickles its
target: for a trainer that imports torch, seconds and about 140 MB per worker,
paid before the first batch (issue 25: time to the first batch). A stage whose
operators come from real modules never needs it; one with an operator defined
in the main script still gets it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zephon_core.engine import shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="needs /dev/shm")

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, sys
with open(os.environ["MARK"], "a") as f:  # every process that runs this file as a module
    f.write(f"{os.getpid()} {__name__}\\n")
from tests.helpers.chaos import big, elements, stage
from zephon_core import Map
from zephon_core.engine.processes import ProcessRunner
from zephon_core.ops.contract import StageFn


def local(x):
    return x + 1


if __name__ == "__main__":
    fn = StageFn([Map(local, name="local")]) if sys.argv[1] == "local" else stage(big)
    runner = ProcessRunner(fn, workers=2, start_method="spawn", name="main-test")
    try:
        out = runner.submit(elements(0, 4)).result(timeout=120)
        print(json.dumps({"pids": runner.pids, "n": len(out)}))
    finally:
        runner.close()
"""


def _run(tmp_path: Path, which: str) -> tuple[dict, list[str]]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    mark = tmp_path / f"mark-{which}"
    env = {**os.environ, "MARK": str(mark), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script), which], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), mark.read_text().splitlines()


def test_workers_skip_the_main_script_when_their_stage_does_not_need_it(
        tmp_path: Path) -> None:
    out, runs = _run(tmp_path, "module")
    assert out["n"] == 4 and len(out["pids"]) == 2
    assert runs == [f"{runs[0].split()[0]} __main__"]  # the parent only


def test_workers_run_the_main_script_when_an_operator_lives_there(tmp_path: Path) -> None:
    out, runs = _run(tmp_path, "local")
    assert out["n"] == 4
    workers = [r for r in runs if r.endswith("__mp_main__")]
    assert len(workers) == 2 and {int(r.split()[0]) for r in workers} == set(out["pids"])
