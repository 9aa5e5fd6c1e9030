"""The ray runner fails fast on an address with no cluster behind it (issue 34, item 4).

Before, ``--runner ray --ray-address 127.0.0.1:PORT`` (or ``RAY_ADDRESS``) with no head
listening never ended (Ray retries its connect in C++ for many minutes), and SIGTERM did
not stop it: ``ray.init`` installs a Python SIGTERM handler in the main thread, which
cannot run while that thread is inside the C++ connect. Now the connect ends within
`Execution.ray_connect_timeout` with one error line naming the address and the setting,
and SIGTERM ends the process at any point. Each test runs the command line in a child
process and checks that it leaves no process behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from zephon_core import ConfigError
from zephon_core.engine.ray_runner import connect, head_of
from zephon_vl.testing.ray_cluster import LOOPBACK_ENV

ray = pytest.importorskip("ray")

#: seconds the child may take to start (imports of torch and ray, the text recipe): the
#: command-line tests guard against a hang (before, the connect never ended); the bound of
#: the connect itself is timed in process (`test_the_connect_gives_up_within_its_timeout`),
#: where start-up on a loaded machine (20 s and more at a load of 15 on 2 cores) is not in it
START_MARGIN = 90.0
DIGEST = ("import sys; from zephon_vl.cli.main import main; "
          "sys.exit(main(sys.argv[1:]))")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """``zephon-vl digest --recipe text-demo --runner ray ...`` in a child process, tagged
    through its environment so that any process it leaves is found."""
    tag = uuid.uuid4().hex
    full = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # Ray kept on loopback (as the test cluster is): nothing dials the machine's address
    full.update({"ZEPHON_TEST_TAG": tag, **LOOPBACK_ENV, **(env or {})})
    proc = subprocess.Popen(
        [sys.executable, "-c", DIGEST, "digest", "--recipe", "text-demo", "--steps", "1",
         "--runner", "ray", *args], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    return proc, tag


def left_behind(tag: str) -> list[str]:
    """Processes still running with the child's tag in their environment."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if f"ZEPHON_TEST_TAG={tag}".encode() in environ:
            found.append(f"{pid}: {cmd.decode(errors='replace')[:120]}")
    return found


def finish(proc: subprocess.Popen, tag: str, within: float) -> tuple[str, float]:
    """Wait for the child at most `within` seconds (then kill it: the test fails); its
    stderr and how long it ran. Fails if a process with its tag is left."""
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"still running after {within:g} s")
    elapsed = time.monotonic() - t0
    time.sleep(0.5)
    assert not left_behind(tag), left_behind(tag)
    return err, elapsed


def test_the_connect_gives_up_within_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: the port check ends at the deadline (Ray's connect is never reached)."""
    monkeypatch.setenv(*next(iter(LOOPBACK_ENV.items())))  # dial loopback only
    address = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"within ray_connect_timeout = 1\.5 s: nothing "
                                          r"answers at 127\.0\.0\.1:\d+ \(Connection refused"):
        connect(ray, address, "RAY_ADDRESS", 1.5, {})
    assert 1.5 <= time.monotonic() - t0 < 3.0
    assert not ray.is_initialized()


def test_cluster_addresses_name_their_head() -> None:
    assert head_of("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert head_of("ray://head.example:10001") == ("head.example", 10001)
    assert head_of("[::1]:6379") == ("::1", 6379)
    assert head_of("auto") is None and head_of("local") is None


@pytest.mark.slow
@pytest.mark.parametrize("via", ["flag", "env"])
def test_an_address_with_nothing_behind_it_ends_with_one_error_line(via) -> None:
    address = f"127.0.0.1:{free_port()}"
    timeout = 3
    args = ["--ray-connect-timeout", str(timeout)]
    if via == "flag":
        proc, tag = start([*args, "--ray-address", address])
    else:
        proc, tag = start(args, {"RAY_ADDRESS": address})
    err, _ = finish(proc, tag, timeout + START_MARGIN)
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    source = "--ray-address" if via == "flag" else "RAY_ADDRESS"
    assert lines[0].startswith("zephon-vl digest: error: the ray runner could not connect")
    for part in (address, source, f"ray_connect_timeout = {timeout} s"):
        assert part in lines[0], lines[0]


@pytest.mark.slow
def test_sigterm_ends_a_connect_that_hangs() -> None:
    """Something accepts connections but never answers as a Ray head: Ray's own connect
    would hang there. SIGTERM, sent once the child connects, ends the child at once."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.settimeout(START_MARGIN + 10)
        address = f"127.0.0.1:{server.getsockname()[1]}"
        proc, tag = start(["--ray-connect-timeout", "300", "--ray-address", address])
        try:
            conn, _ = server.accept()  # the child is connecting
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        with conn:
            time.sleep(1.0)  # inside the connect (past the port check)
            proc.send_signal(signal.SIGTERM)
            err, elapsed = finish(proc, tag, 5.0)
    assert proc.returncode == -signal.SIGTERM, err
    assert elapsed < 5.0


@pytest.mark.slow
def test_a_head_that_never_answers_ends_within_the_timeout() -> None:
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))
        server.listen(8)
        address = f"127.0.0.1:{server.getsockname()[1]}"
        proc, tag = start(["--ray-connect-timeout", "3", "--ray-address", address])
        err, _ = finish(proc, tag, 3 + START_MARGIN)
    assert proc.returncode == 2, err
    (line,) = [ln for ln in err.splitlines() if "error:" in ln]
    assert address in line and "ray_connect_timeout = 3 s" in line, err
    assert "did not finish" in line and "Traceback" not in err
