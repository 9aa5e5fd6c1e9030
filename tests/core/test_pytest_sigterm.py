"""pytest stopped with SIGTERM takes the tests' subprocesses with it (tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]

INNER = '''
import pathlib, subprocess, sys, time
def test_starts_a_long_subprocess():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    pathlib.Path({pid_file!r}).write_text(str(child.pid))
    time.sleep(300)
'''


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_terminated_pytest_ends_the_subprocesses_its_tests_started(tmp_path):
    """Fails on the old conftest: the test's subprocess outlived pytest."""
    pid_file = tmp_path / "child.pid"
    (tmp_path / "test_inner.py").write_text(INNER.format(pid_file=str(pid_file)))
    pytest_run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = None
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and pytest_run.poll() is None, "inner test never ran"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert _running(child)
        pytest_run.send_signal(signal.SIGTERM)
        assert pytest_run.wait(timeout=30) == -signal.SIGTERM
        deadline = time.monotonic() + 10
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(child), "the test's subprocess outlived pytest"
    finally:
        pytest_run.kill()
        if child is not None and _running(child):
            os.kill(child, signal.SIGKILL)
