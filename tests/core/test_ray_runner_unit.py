"""The ray runner's parts that need no cluster: zephon_core without Ray, the settings, and
the copy that takes answers out of Ray's object store."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pytest

from zephon_core import ConfigError, Execution
from zephon_core.engine.ray_runner import float_bytes, own_copy
from zephon_core.internals import parse_resources

NO_RAY = """
import sys
sys.modules["ray"] = None  # an environment without Ray: `import ray` fails
from zephon_core import ConfigError, Execution, load_recipe
from zephon_core.engine.plan import Plan
plan = Plan(load_recipe("text-demo").ops, Execution(runner="ray"))
assert {s.runner_kind for s in plan.stages if s.kind == "transform"} == {"ray"}
print(plan.explain().splitlines()[3])
try:
    plan.make_runners()
except ConfigError as exc:
    print("refused:", exc)
"""


def test_zephon_core_works_without_ray():
    """Without Ray, zephon_core imports and plans a ray stage; making its runner is refused
    with the install hint (Ray is imported only inside the runner)."""
    out = subprocess.run([sys.executable, "-c", NO_RAY], capture_output=True, text=True,
                         check=True).stdout
    assert "Ray task" in out
    assert "refused: the ray runner needs Ray: pip install 'zephon-vl[ray]'" in out


def test_ray_settings():
    assert parse_resources("zephon_cpu=1, big=0.5") == {"zephon_cpu": 1.0, "big": 0.5}
    ex = Execution(runners={"decode": "ray"}, ray_resources={"zephon_cpu": 1})
    assert ex.runners == {"decode": "ray"}
    for bad in ({"zephon_cpu": 0}, {"zephon_cpu": True}, {"x": "1"}):
        with pytest.raises(ConfigError, match="ray_resources"):
            Execution(runner="ray", ray_resources=bad)
    with pytest.raises(ConfigError, match="OP=N"):
        parse_resources("zephon_cpu")


@dataclass(frozen=True)
class Patches:
    pixels: np.ndarray
    grid: np.ndarray


class Out(NamedTuple):
    payload: dict
    digest: dict


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False  # what Ray's zero-copy get hands back
    return a


def test_own_copy_takes_every_array_out_of_the_store():
    """Read-only arrays anywhere in an answer (dicts, lists, dataclasses, named tuples)
    come back as writable copies that share no memory; everything else is unchanged."""
    px = _frozen(np.arange(48, dtype=np.uint8).reshape(4, 12))
    grid = _frozen(np.array([1, 2, 2]))
    toks = _frozen(np.arange(5, dtype=np.int32))
    answer = [Out({"tokens": toks, "vision": [Patches(px, grid)], "kind": "caption"},
                  {"tokens": "ab"}), None]
    got = own_copy(answer)
    doc = got[0].payload
    assert isinstance(got[0], Out) and got[1] is None and doc["kind"] == "caption"
    for new, old in ((doc["tokens"], toks), (doc["vision"][0].pixels, px),
                     (doc["vision"][0].grid, grid)):
        assert new.flags.writeable and not np.shares_memory(new, old)
        assert new.dtype == old.dtype and np.array_equal(new, old)
    assert float_bytes(got) == 0
    assert float_bytes({"v": [Patches(np.zeros((4, 4), np.float32), grid)]}) == 64


def test_command_line_spells_the_ray_settings():
    import argparse

    from zephon_vl.cli.common import add_execution_args, execution_from

    p = argparse.ArgumentParser()
    add_execution_args(p)
    args = p.parse_args(["--runner", "ray", "--runners", "read=processes",
                         "--ray-address", "127.0.0.1:6379", "--ray-resources", "zephon_cpu=1"])
    ex = execution_from(args)
    assert (ex.runner, ex.runners) == ("ray", {"read": "processes"})
    assert (ex.ray_address, ex.ray_resources) == ("127.0.0.1:6379", {"zephon_cpu": 1.0})
    assert execution_from(p.parse_args([])).ray_address is None
