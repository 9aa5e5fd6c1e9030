"""`Execution.start_method="auto"`: workers fork where it is safe, else spawn.

A forked worker shares what the driver loaded (a sooner first batch, less memory:
issue 25); beside a thread zephon did not start (a trainer's) or once torch has
initialized CUDA, fork could copy a held lock into the child, so auto spawns. Each
case runs in a fresh interpreter: a pytest process may hold other tests' threads.
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

pytestmark = pytest.mark.skipif(not (shm.available() and sys.platform.startswith("linux")),
                                reason="needs Linux and /dev/shm")

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import json, sys, threading
import tests.helpers.chaos as chaos
from tests.helpers.chaos import elements, seen_in_worker, stage
from zephon_core.engine.processes import ProcessRunner

chaos.DRIVER_MARK = 7  # a forked worker inherits it, a spawned one imports the module anew
if sys.argv[1] == "thread":
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="trainer-logger", daemon=True).start()
runner = ProcessRunner(stage(seen_in_worker), workers=2, start_method=sys.argv[2],
                       name="auto-test")
try:
    out = runner.submit(elements(0, 4)).result(timeout=120)
    print(json.dumps(sorted(set(out))))
finally:
    runner.close()
"""


def _python(tmp_path: Path, *args: str) -> str:
    """stdout of a fresh interpreter run with `args`, the repository importable."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _marks_seen(tmp_path: Path, threads: str, method: str) -> list[int]:
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER))
    return json.loads(_python(tmp_path, str(script), threads, method).strip().splitlines()[-1])


def test_auto_forks_a_driver_with_no_thread_of_its_own(tmp_path: Path) -> None:
    assert _marks_seen(tmp_path, "none", "auto") == [7]


def test_auto_spawns_beside_a_thread_zephon_did_not_start(tmp_path: Path) -> None:
    assert _marks_seen(tmp_path, "thread", "auto") == [0]


def test_an_explicit_start_method_is_kept(tmp_path: Path) -> None:
    assert _marks_seen(tmp_path, "none", "spawn") == [0]
    assert _marks_seen(tmp_path, "thread", "fork") == [7]


def test_auto_spawns_once_torch_has_initialized_cuda(tmp_path: Path) -> None:
    check = textwrap.dedent("""
        import torch
        from zephon_core.engine.workers import start_method_now
        before = start_method_now("auto")
        torch.cuda.is_initialized = lambda: True  # what a trainer on a GPU has done
        print(before, start_method_now("auto"), start_method_now("fork"))
    """)
    assert _python(tmp_path, "-c", check).split() == ["fork", "spawn", "fork"]
