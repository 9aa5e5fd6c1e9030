"""Long commands show one progress line on a terminal and nothing when piped (issue 24.5)."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from zephon_vl.cli.progress import Progress


def folder(tmp_path: Path, n: int = 6) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)).save(src / f"{i}.png")
        (src / f"{i}.txt").write_text(f"photo {i}")
    return src


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "zephon_vl.cli.main", *args]


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k != "ZEPHON_PROGRESS"}
    path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    return {**base, "PYTHONPATH": path, **extra}


def run_on_a_terminal(cmd: list[str]) -> tuple[int, str, str]:
    """Run `cmd` with stderr on a pseudo-terminal; its stdout piped."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env=env())
    os.close(slave)
    err = b""
    deadline = time.monotonic() + 300
    # read until the child has exited and the terminal is drained: a slow start (a busy
    # machine) is not the end of the output
    poller = select.poll()  # not select.select: the suite's process may hold fds >= 1024
    poller.register(master, select.POLLIN)
    while time.monotonic() < deadline:
        ready = poller.poll(1000)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    out = proc.stdout.read().decode()
    os.close(master)
    return proc.wait(60), out, err.decode(errors="replace")


def test_progress_is_silent_unless_a_terminal_or_forced(monkeypatch):
    monkeypatch.delenv("ZEPHON_PROGRESS", raising=False)
    quiet = io.StringIO()
    with Progress("job", 3, "shards", stream=quiet) as p:
        for _ in range(3):
            p.advance()
    assert quiet.getvalue() == ""
    monkeypatch.setenv("ZEPHON_PROGRESS", "1")
    shown = io.StringIO()
    with Progress("job", 3, "shards", stream=shown) as p:
        for _ in range(3):
            p.advance()
    assert shown.getvalue().startswith("\rjob: ") and shown.getvalue().endswith("\n")
    assert "job: 3/3 shards (100%)" in shown.getvalue()


def test_shards_and_index_show_progress_on_a_terminal_only(tmp_path):
    src = folder(tmp_path)
    code, out, err = run_on_a_terminal(command("shards", str(src), str(tmp_path / "tty"),
                                               "--samples-per-shard", "2"))
    assert code == 0, err
    assert "zephon-vl shards: 6 samples" in err
    assert "zephon-vl shards" not in out and out.count(".tar") == 3
    piped = subprocess.run(command("shards", str(src), str(tmp_path / "pipe"),
                                   "--samples-per-shard", "2"),
                           capture_output=True, text=True, env=env(), check=True)
    assert piped.stderr == "" and piped.stdout.count(".tar") == 3
    shards = sorted(str(p) for p in (tmp_path / "pipe").glob("*.tar"))
    index = command("index", *shards, "--out", str(tmp_path / "m.json"), "--no-content-hash")
    code, out, err = run_on_a_terminal(index)
    assert code == 0, err
    assert "zephon-vl index: 3/3 shards (100%)" in err and "3 shards, 6 samples" in out
    piped = subprocess.run(index, capture_output=True, text=True, env=env(), check=True)
    assert piped.stderr == ""


BENCH_RUN = ("from zephon_bench.vlm_bench import report_run\n"
             "from zephon_vl.cli.progress import Progress\n"
             "m = {'samples_per_s': 123.4, 'ttfb_s': 0.5, 'cpu_s_per_sample': 0.004, "
             "'outside_load': 0.1}\n"
             "with Progress('zephon-vl bench', 2, 'runs') as p:\n"
             "    report_run(p, 'rep 0 zephon default', m, False, 3.0)\n"
             "    report_run(p, 'rep 0 grain', m, True, 5.0)\n"
             "print('results')\n")


def test_bench_run_lines_show_on_a_terminal_and_on_stderr_in_a_pipe():
    code, out, err = run_on_a_terminal([sys.executable, "-c", BENCH_RUN])
    assert code == 0, err
    assert out == "results\n"
    lines = [ln.strip() for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    run_lines = [ln for ln in lines if "samples/s" in ln]
    assert len(run_lines) == 2 and "rep 0 zephon default" in run_lines[0]
    assert "123.4 samples/s" in run_lines[0] and "DISTURBED" in run_lines[1]
    assert "zephon-vl bench: 2/2 runs (100%)" in err
    piped = subprocess.run([sys.executable, "-c", BENCH_RUN], capture_output=True, text=True,
                           env=env(), check=True)
    # a run of hours in nohup shows how far it got; stdout keeps only the results and
    # stderr no progress line (no carriage returns)
    assert piped.stdout == "results\n" and "\r" not in piped.stderr
    piped_lines = piped.stderr.splitlines()
    assert len(piped_lines) == 2 and "123.4 samples/s" in piped_lines[0]
    assert "DISTURBED" in piped_lines[1]
