"""The ray runner against a real two-node Ray cluster on 127.0.0.1.

The cluster (a head, and a worker node offering the custom resource
``zephon_cpu``) is started and stopped by the module's fixture; every test
compares digests with the inline runner's. Faults never change data: a node
killed mid-run, slow groups, a cluster that goes away (a clear error, then a
resume from the last checkpoint gives the uninterrupted batches).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.core import Spec, build_recipe
from tests.helpers.remote import crash_always, slow_tokens
from zephon_core import Execution, load_recipe, run_digests
from zephon_core.engine import ray_runner
from zephon_core.engine.plan import Plan
from zephon_core.engine.simulate import ElasticRun

ray = pytest.importorskip("ray")

from zephon_vl.testing.ray_cluster import LOOPBACK_ENV, LocalRayCluster  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 2
LABEL = {"zephon_cpu": 1}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    """A head (1 CPU) and a worker node (1 CPU, ``zephon_cpu``), loopback only; this
    process connected to it (so runners share one Ray job and its warm workers)."""
    root = tempfile.mkdtemp(prefix="zr", dir="/tmp")  # short: Unix socket paths live there
    with pytest.MonkeyPatch.context() as mp:
        for k, v in LOOPBACK_ENV.items():
            mp.setenv(k, v)
        mp.setenv("PYTHONPATH", os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        # ray reads the loopback switch when it is first imported
        mp.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
        c = LocalRayCluster(root, object_store_mb=100)
        try:
            c.start()
            connect(c)
            yield c
        finally:
            if ray.is_initialized():
                ray.shutdown()
            c.stop()
            shutil.rmtree(root, ignore_errors=True)


def connect(c: LocalRayCluster) -> None:
    ray.init(address=c.address, configure_logging=False, log_to_driver=False)


_INLINE: dict[str, list[str]] = {}
LONGEST = 6  # steps of the inline reference, made once per recipe


def inline_digests(recipe: str, steps: int = STEPS) -> list[str]:
    if recipe not in _INLINE:
        _INLINE[recipe] = [r.sha256 for r in run_digests(lambda: load_recipe(recipe), 1,
                                                         LONGEST, Execution(runner="inline"))]
    assert steps <= len(_INLINE[recipe])
    return _INLINE[recipe][:steps]


def labelled_node() -> str:
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "zephon_cpu" in n["Resources"])


def ray_runners(run: ElasticRun) -> list:
    return [r for r in run.runners.values() if r.kind == "ray"]


@pytest.mark.parametrize("recipe", ["vlm-demo", "text-demo"])
@pytest.mark.parametrize("dp", [1, 2])
def test_ray_digests_equal_inline(cluster, recipe, dp):
    """Every stateless stage on Ray: the batches of the inline runner, at D = 1 and 2."""
    ex = Execution(runner="ray", default_workers=2)
    with ElasticRun(lambda: load_recipe(recipe), ex) as run:
        got = [r.sha256 for r in run.run(dp, STEPS)]
        used = ray_runners(run)
        assert used and all(sum(r.nodes.values()) > 0 for r in used)
    assert got == inline_digests(recipe)


def test_decode_on_labelled_nodes_only(cluster):
    """``runners={"decode_rows": "ray"}`` with a resource label: the pixel decode (after
    the packer, the row stage) runs on the nodes that offer the label (only), the planning
    stage locally; same batches."""
    ex = Execution(runners={"decode_rows": "ray"}, ray_resources=LABEL, default_workers=1)
    with ElasticRun(lambda: load_recipe("vlm-demo"), ex) as run:
        plan = Plan(run.recipe.ops, ex, row_ops=run.recipe.row_ops)
        kinds = [s.runner_kind for s in plan.stages if s.kind == "transform"]
        got = [r.sha256 for r in run.run(2, STEPS)]
        (decode,) = ray_runners(run)
        assert decode.name == "decode_rows"
        assert set(decode.nodes) == {labelled_node()}
    assert kinds == ["threads"]
    assert [s.runner_kind for s in plan.row_stages] == ["ray"]
    assert got == inline_digests("vlm-demo")


@pytest.mark.heavy  # a node or the cluster stopped and restarted: 20-80 s on 2 cores
def test_worker_node_killed_mid_run(cluster, tmp_path):
    """The labelled node dies with a group running on it; a replacement joins (as an
    autoscaler would start one): the lost groups run again there, the batches do not
    change."""
    ref = _spec_digests(Spec(num_lanes=2), Execution(runner="inline"), steps=5)
    (tmp_path / "ray").mkdir()
    slow = functools.partial(slow_tokens, every=4, seconds=0.3, marker_dir=str(tmp_path / "ray"))
    spec = Spec(map_fn=slow, num_lanes=2)
    ex = Execution(runner="ray", ray_resources=LABEL, default_workers=1, group_size=2)
    with ElasticRun(lambda: build_recipe(spec), ex) as run:
        sim = run.ranks(2)
        got = [r.sha256 for r in run.steps(sim, 2, "run")]
        (stage,) = ray_runners(run)
        killer = threading.Thread(target=_kill_when_busy, args=(cluster, tmp_path / "ray"))
        killer.start()
        try:
            got += [r.sha256 for r in run.steps(sim, 5, "run")]
        finally:
            killer.join()
        assert stage.resubmitted > 0
    assert got == ref


def _kill_when_busy(cluster: LocalRayCluster, markers: Path) -> None:
    """Kill the worker node once a slow document has started on it, then start a new one."""
    seen = set(markers.iterdir())
    deadline = time.monotonic() + 30
    while set(markers.iterdir()) == seen and time.monotonic() < deadline:
        time.sleep(0.005)
    cluster.kill_worker(tasks=True)
    cluster.add_worker()


@pytest.mark.heavy  # a node or the cluster stopped and restarted: 20-80 s on 2 cores
def test_cli_digest_after_killing_the_second_node(cluster, tmp_path):
    """``zephon-vl digest --runner ray`` on the two-node cluster, the second node's raylet
    killed mid-run (its tasks go to the head): the digests of ``--runner inline``."""
    env = {**os.environ, **cluster.env()}
    out = tmp_path / "digests.jsonl"
    cmd = [sys.executable, "-m", "zephon_vl.cli.main", "digest", "--recipe", "vlm-demo",
           "--dp", "2", "--steps", "6", "--runner", "ray"]
    with open(out, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while '"step": 0' not in out.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, "digest ended before its first step"
            time.sleep(0.2)
        cluster.kill_worker()
        assert proc.wait(timeout=240) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.add_worker()
    # Ray prints cluster events (the node that died) to a driver's stdout: skip those lines
    got = [json.loads(line)["sha256"] for line in out.read_text().splitlines()
           if line.startswith("{")]
    assert got == inline_digests("vlm-demo", 6)


def test_slow_groups_never_reorder(cluster):
    """Groups that finish out of order (one document in five sleeps) give the batches of
    the inline runner: answers are consumed in submission order."""
    spec = Spec(map_fn=functools.partial(slow_tokens, every=5, seconds=0.3), num_lanes=2)
    ref = _spec_digests(spec.but(map_fn=None), Execution(runner="inline"))  # no sleeps
    got = _spec_digests(spec, Execution(runner="ray", default_workers=2, group_size=2))
    assert got == ref


def test_group_lost_every_time_names_stage_and_group(cluster):
    """A group whose worker dies on every attempt: resubmitted a bounded number of times,
    then an error that names the stage and the group's samples."""
    spec = Spec(map_fn=functools.partial(crash_always, crash_ids=(2,)), num_lanes=1,
                shuffle_pos=None, shuffle_shards=False, shuffle_within=False)
    with pytest.raises(RuntimeError, match=r"stage read\+tokens\+keep: the group of samples "
                       r".*shard 0 index 2.* was lost 3 times"):
        _spec_digests(spec, Execution(runner="ray", default_workers=1, group_size=2))


def test_group_past_its_deadline_is_abandoned_then_named(cluster, monkeypatch):
    """A group that runs past `group_timeout` is submitted again; after three deadlines in
    a row the run stops naming the group. Overdue and closed-over tasks are abandoned,
    never `ray.cancel`-ed: a cancel that met the task's completion ended the driver
    process in CI (Ray's ``Tried to complete task that was not pending``)."""
    cancelled = []
    monkeypatch.setattr(ray, "cancel", lambda ref, **kw: cancelled.append(ref))
    spec = Spec(map_fn=functools.partial(slow_tokens, every=1000, seconds=30.0), num_lanes=1,
                shuffle_pos=None, shuffle_shards=False, shuffle_within=False)
    ex = Execution(runner="ray", default_workers=1, group_size=2, group_timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"3 Ray tasks in a row ran past group_timeout "
                       r"\(1 s\) on the group of samples dataset 0 shard \d index 0 "
                       r".*\{'CPU': 1\}"):
        _spec_digests(spec, ex)
    assert time.monotonic() - t0 < 30
    assert cancelled == []


def _spec_digests(spec: Spec, ex: Execution, steps: int = 4) -> list[str]:
    with ElasticRun(lambda: build_recipe(spec), ex) as run:
        return [r.sha256 for r in run.run(1, steps)]


@pytest.mark.heavy  # a node or the cluster stopped and restarted: 20-80 s on 2 cores
def test_cluster_gone_then_resume(cluster, monkeypatch):
    """The whole cluster stops mid-run: the run stops with an error that says so (not a
    hang); a resume from the checkpoint taken before, on a cluster that is up again,
    gives the batches of the uninterrupted run. Runs last: it restarts the cluster."""
    monkeypatch.setattr(ray_runner, "CLUSTER_GRACE_S", 3.0)  # the default is 10 s
    want = inline_digests("text-demo", 5)
    # groups of 8: with text's default of 64 the first steps' calls already fetched the
    # documents of steps 3-5, and the run would not need the cluster again
    ex = Execution(runner="ray", default_workers=2, group_size=8)
    with ElasticRun(lambda: load_recipe("text-demo"), ex) as run:
        sim = run.ranks(2)
        got = [r.sha256 for r in run.steps(sim, 2, "run")]
        state = sim.state_json()
        cluster.stop(abrupt=True)  # a graceful stop would end this process (Ray's way)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="the Ray cluster went away.*resume from the "
                           "last checkpoint"):
            list(run.steps(sim, 5, "run"))
        assert time.monotonic() - t0 < 60
    assert got == want[:2]
    ray.shutdown()
    cluster.start()
    connect(cluster)
    with ElasticRun(lambda: load_recipe("text-demo"), ex) as run:
        resumed = [r.sha256 for r in run.resume(state, 2, 5)]
    assert resumed == want[2:]
