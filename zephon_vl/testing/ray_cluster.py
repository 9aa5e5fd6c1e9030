"""A Ray cluster of a head and worker nodes on 127.0.0.1, for tests, checks and benchmarks.

The head comes from ``ray start --head``; every node listens on 127.0.0.1
only. A worker node is started the way ``ray start --address`` starts one
(Ray's `Node`), because that command refuses to join a head on 127.0.0.1
when Ray may bind only to loopback (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
the setting that keeps it off every other address), and rewrites 127.0.0.1
into the machine's network address otherwise.

`stop` ends exactly the processes of this cluster (those that name its
temporary folder, and their children), never another Ray on the machine,
which ``ray stop`` would. Drivers connect with `env`.

From a shell (the cluster outlives the command; its folder holds its state)::

    python -m zephon_vl.testing.ray_cluster up /tmp/zr     # prints the env to export
    python -m zephon_vl.testing.ray_cluster kill-worker /tmp/zr
    python -m zephon_vl.testing.ray_cluster down /tmp/zr
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

#: Ray binds to 127.0.0.1 only, and drivers may connect to a head there
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class LocalRayCluster:
    """A head (`head_cpus`, no custom resources) and `workers` worker nodes (each
    `worker_cpus` and `worker_resources`), `object_store_mb` of object store each.

    `root` is Ray's temporary folder (short: Unix socket paths live there);
    worker processes inherit this process's environment, PYTHONPATH included.
    """

    root: str | os.PathLike
    head_cpus: int = 1
    worker_cpus: int = 1
    worker_resources: dict[str, float] = field(default_factory=lambda: {"zephon_cpu": 1})
    workers: int = 1
    object_store_mb: int = 100
    start_timeout: float = 60.0
    port: int = 0
    #: raylet PID of each worker node started, in order
    worker_raylets: list[int] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        """What a driver process needs in its environment to use this cluster."""
        return {"RAY_ADDRESS": self.address, **LOOPBACK_ENV}

    def _env(self) -> dict[str, str]:
        return {**os.environ, **LOOPBACK_ENV}

    def start(self) -> LocalRayCluster:
        root = Path(self.root)
        root.mkdir(parents=True, exist_ok=True)
        self.root = root = root.resolve()
        self.port = self.port or _free_port()
        cmd = ["ray", "start", "--head", "--node-ip-address", HOST, "--port", str(self.port),
               "--num-cpus", str(self.head_cpus), "--num-gpus", "0",
               "--object-store-memory", str(self.object_store_mb << 20),
               "--ray-client-server-port", str(_free_port()),
               "--include-dashboard", "false", "--disable-usage-stats",
               "--temp-dir", str(root)]
        try:
            subprocess.run(cmd, env=self._env(), check=True, capture_output=True, text=True,
                           timeout=self.start_timeout)
            for _ in range(self.workers):
                self.add_worker()
        except BaseException as exc:
            self.stop()
            detail = getattr(exc, "stderr", "") or ""
            raise RuntimeError(f"could not start a local Ray cluster in {root}: {exc}\n"
                               f"{detail[-2000:]}") from exc
        self._save()
        return self

    def add_worker(self) -> int:
        """Start a worker node; returns its raylet's PID."""
        cmd = [sys.executable, "-m", "zephon_vl.testing.ray_cluster", "node", str(self.root),
               "--address", self.address, "--num-cpus", str(self.worker_cpus),
               "--resources", json.dumps(self.worker_resources),
               "--object-store-mb", str(self.object_store_mb)]
        out = subprocess.run(cmd, env=self._env(), check=True, capture_output=True, text=True,
                             timeout=self.start_timeout)
        raylet = int(json.loads(out.stdout.strip().splitlines()[-1])["raylet"])
        self.worker_raylets.append(raylet)
        self._save()
        return raylet

    def kill_worker(self, i: int = -1, tasks: bool = False) -> int:
        """SIGKILL worker node `i`'s raylet: a node lost mid-run. A task running there may
        still finish and answer (Ray's workers outlive their raylet a moment); with `tasks`,
        its worker processes die with it, as when the machine goes. Returns the raylet PID."""
        pid = self.worker_raylets.pop(i)
        victims = [pid, *(_family({pid}) - {pid})] if tasks else [pid]
        for p in victims:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._save()
        return pid

    def pids(self) -> list[int]:
        """Every live process of this cluster: those naming its folder, and their children."""
        root = str(Path(self.root).resolve())
        return sorted(_family({pid for pid, cmdline in _processes() if root in cmdline}))

    def stop(self, grace: float = 5.0, abrupt: bool = False) -> None:
        """End this cluster's processes: SIGTERM, then SIGKILL after `grace` seconds; with
        `abrupt`, SIGKILL at once, as when the machines go. (On SIGTERM a raylet ends the
        drivers connected to it too, with SIGTERM: Ray's own way to stop a job.)"""
        for sig in ((signal.SIGKILL,) if abrupt else (signal.SIGTERM, signal.SIGKILL)):
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while pids and time.monotonic() < deadline:
                time.sleep(0.1)
                pids = self.pids()
            if not pids:
                break
        self.worker_raylets.clear()

    def _save(self) -> None:
        state = {"port": self.port, "worker_raylets": self.worker_raylets,
                 "worker_cpus": self.worker_cpus, "worker_resources": self.worker_resources,
                 "object_store_mb": self.object_store_mb}
        (Path(self.root) / "zephon-cluster.json").write_text(json.dumps(state))

    @classmethod
    def load(cls, root: str | os.PathLike) -> LocalRayCluster:
        state = json.loads((Path(root) / "zephon-cluster.json").read_text())
        return cls(root, **state)

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _processes() -> list[tuple[int, str]]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                out.append((int(proc.name),
                            (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
            except OSError:
                continue
    return out


def _family(pids: set[int]) -> set[int]:
    """`pids` and all their descendants."""
    parents: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            parents[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    family = set(pids)
    while kids := {p for p, pp in parents.items() if pp in family and p not in family}:
        family |= kids
    return family


def _start_node(root: str, address: str, num_cpus: int, resources: dict,
                object_store_mb: int) -> int:
    """What ``ray start --address`` does, on 127.0.0.1 (see the module docstring)."""
    from ray._private import services
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    params = RayParams(gcs_address=address, node_ip_address=HOST, num_cpus=num_cpus,
                       num_gpus=0, resources=resources,
                       object_store_memory=object_store_mb << 20, temp_dir=root)
    node = Node(params, head=False, shutdown_at_exit=False, spawn_reaper=False)
    services.wait_for_node(address, node.plasma_store_socket_name, 30)
    return node.all_processes["raylet"][0].process.pid


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zephon_vl.testing.ray_cluster")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a head and worker nodes; print the driver's env")
    up.add_argument("root")
    up.add_argument("--workers", type=int, default=1)
    up.add_argument("--head-cpus", type=int, default=1)
    up.add_argument("--worker-cpus", type=int, default=1)
    up.add_argument("--resources", default='{"zephon_cpu": 1}',
                    help="JSON: each worker node's custom resources")
    up.add_argument("--object-store-mb", type=int, default=100)
    for name, text in (("down", "end the cluster's processes"),
                       ("kill-worker", "SIGKILL the last worker node's raylet"),
                       ("kill-worker-node", "SIGKILL the last worker node's raylet and "
                        "its workers"),
                       ("add-worker", "start one more worker node")):
        sub.add_parser(name, help=text).add_argument("root")
    node = sub.add_parser("node", help=argparse.SUPPRESS)
    node.add_argument("root")
    node.add_argument("--address", required=True)
    node.add_argument("--num-cpus", type=int, default=1)
    node.add_argument("--resources", default="{}")
    node.add_argument("--object-store-mb", type=int, default=100)
    args = p.parse_args(argv)
    if args.cmd == "node":
        pid = _start_node(str(Path(args.root).resolve()), args.address, args.num_cpus,
                          json.loads(args.resources), args.object_store_mb)
        print(json.dumps({"raylet": pid}))
        return 0
    if args.cmd == "up":
        cluster = LocalRayCluster(args.root, args.head_cpus, args.worker_cpus,
                                  json.loads(args.resources), args.workers,
                                  args.object_store_mb).start()
        for k, v in cluster.env().items():
            print(f"export {k}={v}")
        return 0
    cluster = LocalRayCluster.load(args.root)
    if args.cmd == "down":
        cluster.stop()
    elif args.cmd in ("kill-worker", "kill-worker-node"):
        tasks = args.cmd == "kill-worker-node"
        print(json.dumps({"killed_raylet": cluster.kill_worker(tasks=tasks)}))
    else:
        print(json.dumps({"raylet": cluster.add_worker()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
