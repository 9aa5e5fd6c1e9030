"""The connection to a Ray cluster: one ``ray.init`` per process, within a deadline.

Ray is imported here only (`_ray`), and this module only when a stage asks
for the ray runner, so `zephon_core` works without Ray installed. See
`ray_runner` for the runner itself.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from zephon_core.engine.kinds import RAY_CONNECT_TIMEOUT
from zephon_core.errors import ConfigError

log = logging.getLogger(__name__)

#: a local Ray instance (no cluster found) gets this much object store: it only holds the
#: groups in flight
LOCAL_OBJECT_STORE_BYTES = 512 << 20

_INSTALL = ("the ray runner needs Ray: pip install 'zephon-vl[ray]' (or choose the inline, "
            "threads or processes runner)")


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(_INSTALL) from None
    return ray


class _Connection:
    """One `ray.init` per process, shared by its Ray runners; shut down with the last one
    (unless the user connected first: then the connection is theirs)."""

    lock = threading.Lock()
    users = 0
    ours = False

    @classmethod
    def acquire(cls, address: str | None, timeout: float = RAY_CONNECT_TIMEOUT) -> Any:
        ray = _ray()
        with cls.lock:
            if cls.users == 0 and not ray.is_initialized():
                where = address or os.environ.get("RAY_ADDRESS") or None
                source = ("Execution.ray_address (--ray-address)" if address
                          else "RAY_ADDRESS")
                try:
                    # workers' output stays in the cluster's logs (`ray logs`): forwarded,
                    # it would land in the trainer's stdout (zephon-vl digest's JSON lines)
                    quiet = {"configure_logging": False, "log_to_driver": False}
                    if where is None:
                        # the latest cluster started on this machine, else a local instance
                        ray.init(object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                                 include_dashboard=False, **quiet)
                    else:
                        connect(ray, where, source, timeout, quiet)
                except (ConnectionError, RuntimeError, ValueError) as exc:
                    raise ConfigError(
                        f"the ray runner could not connect to the Ray cluster at {where}: "
                        f"{exc}. Start it (ray start --head) or point RAY_ADDRESS / "
                        "Execution.ray_address at its head (host:port)") from exc
                cls.ours = True
            cls.users += 1
        return ray

    @classmethod
    def release(cls) -> None:
        ray = _ray()
        with cls.lock:
            cls.users -= 1
            if cls.users == 0 and cls.ours:
                cls.ours = False
                try:
                    ray.shutdown()
                except Exception as exc:  # noqa: BLE001 - a dead cluster cannot be left cleanly
                    log.warning("zephon: ray.shutdown() failed (%s); continuing", exc)


def head_of(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a cluster address (``host:port``, ``ray://host:port``,
    ``[::1]:port``); None for ``auto``, ``local`` and what names no port."""
    host, _, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _unreachable(where: str, source: str, timeout: float, why: str) -> ConfigError:
    return ConfigError(
        f"the ray runner could not connect to the Ray cluster at {where} (from {source}) "
        f"within ray_connect_timeout = {timeout:g} s: {why}. Start the cluster (ray start "
        f"--head), point {source} at its head's host:port, or wait longer with "
        "Execution.ray_connect_timeout (--ray-connect-timeout)")


#: hosts Ray dials at the machine's own address instead (so the head may listen there only)
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Ray's switch that keeps it on loopback ("0"): then a loopback head is dialled there only
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def wait_for_head(ray: Any, where: str, source: str, timeout: float,
                  deadline: float) -> None:
    """Return once something accepts TCP connections at the address's host and port; a
    `ConfigError` at `deadline`. Plain sockets and short sleeps: a signal (SIGTERM, ^C)
    ends the wait, where Ray's own connect retries in C++ for minutes and ignores it."""
    head = head_of(where)
    if head is None:
        return
    hosts = [head[0]]
    if head[0] in _LOOPBACK and os.environ.get(LOOPBACK_ONLY) != "0":
        hosts.append(ray.util.get_node_ip_address())
    why = "no answer"
    while True:
        for host in hosts:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _unreachable(where, source, timeout, f"nothing answers at {head[0]}:"
                                   f"{head[1]} ({why})")
            try:
                with socket.create_connection((host, head[1]), timeout=min(1.0, left)):
                    return
            except OSError as exc:
                why = exc.strerror or type(exc).__name__
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))


class _QuietSigterm(logging.Filter):
    """Drops Ray's warning that it set no SIGTERM handler (`connect` means it not to)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("SIGTERM handler is not set")


def connect(ray: Any, where: str, source: str, timeout: float, quiet: dict) -> None:
    """``ray.init(address=where)`` within `timeout` seconds, or a one-line `ConfigError`.

    First the head must accept connections (`wait_for_head`); then ``ray.init`` runs in a
    thread of its own while this one waits: called from the main thread, Ray installs a
    SIGTERM handler that only runs between Python bytecodes, so a connect stuck in its
    C++ retries could not be stopped but by SIGKILL. A connect that does not finish by the
    deadline is given up (its thread is a daemon: it does not hold the process).
    """
    deadline = time.monotonic() + timeout
    wait_for_head(ray, where, source, timeout, deadline)
    outcome: dict[str, Any] = {}

    def init() -> None:
        try:
            ray.init(address=where, **quiet)
            outcome["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = exc

    worker_log = logging.getLogger("ray._private.worker")
    hush = _QuietSigterm()
    worker_log.addFilter(hush)
    try:
        thread = threading.Thread(target=init, name="zephon-ray-connect", daemon=True)
        thread.start()
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.1)
    finally:
        worker_log.removeFilter(hush)
    if "error" in outcome:
        raise outcome["error"]
    if "ok" not in outcome:
        raise _unreachable(where, source, timeout, "its head accepts connections but Ray's "
                           "connect did not finish (is it a Ray head, of this Ray version?)")


