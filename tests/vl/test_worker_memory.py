"""Memory the VLM pipeline's processes hold for nothing (issue 12, item 4): read, decode
and tokenize need no torch in a worker (about 140 MB each), and a driver whose
tokenizing runs in workers needs no tokenizer once the recipe is built (about 265 MB)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.vl import demo_shards, make_recipe
from zephon_core import Execution, Loader
from zephon_core.ops.text import FastTokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return demo_shards(tmp_path_factory)


def _mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_vlm_workers_do_not_load_torch(shards):
    """Spawned workers import only what their stage needs (forked ones share the driver's
    pages, torch's included, without loading anything)."""
    loader = Loader(make_recipe(shards), 0, 1,
                    Execution(runner="processes", default_workers=2, group_size=2,
                              start_method="spawn"))
    try:
        batch = next(iter(loader))
        assert batch["pixel_values"].numel() > 0
        pids = [pid for runner in loader.runners.values() for pid in getattr(runner, "pids", [])]
        assert len(pids) == 4  # the planning stage's and the row decode's, 2 each
        for pid in pids:
            assert "libtorch" not in _mapped(pid), f"worker {pid} loaded torch"
        assert "libtorch" in _mapped(os.getpid())  # the check can see it
    finally:
        loader.close()


#: run in a fresh interpreter: other tests of a session hold tokenizers of their own
_RESUME_CHECK = """
import gc, sys
from tests.helpers.vl import make_recipe
from zephon_core import Execution, Loader
from zephon_core.ops.text import FastTokenizer

def live():
    gc.collect()
    return sum(type(o) is FastTokenizer for o in gc.get_objects())

method, shards = sys.argv[1], sys.argv[2:]
kept = 1 if method == "fork" else 0  # forked workers share the driver's tokenizer
recipe = make_recipe(shards)  # reads the special ids with the tokenizer
assert live() == 1
ex = Execution(runner="processes", default_workers=1, group_size=2, start_method=method)
with Loader(recipe, 0, 1, ex) as loader:
    assert live() == kept, "kept after the build"
    next(iter(loader))
    state = loader.state_dict()
firsts = []
for _ in range(2):  # a second restore in the same process loads the tokenizer again
    with Loader(recipe, 0, 1, ex) as resumed:
        resumed.load_state_dict(state)  # recomputes the lanes' held payloads here
        assert live() == kept, "kept after load_state_dict"
        firsts.append(next(iter(resumed)))
        assert not resumed.last_meta.drops, resumed.last_meta.drops
assert all((firsts[0][k] == firsts[1][k]).all() for k in ("input", "pixel_values"))
print("ok")
"""


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_driver_releases_the_tokenizer_for_spawned_workers_only(shards, method):
    """Spawned workers load their own, so the driver lets go of its copy; forked ones
    share the driver's, so it stays (releasing it would free nothing)."""
    done = subprocess.run([sys.executable, "-c", _RESUME_CHECK, method, *shards], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_driver_keeps_the_tokenizer_when_it_tokenizes(shards):
    recipe = make_recipe(shards)
    with Loader(recipe, 0, 1, Execution(runner="inline", group_size=2)) as loader:
        next(iter(loader))
        gc.collect()
        assert any(type(o) is FastTokenizer for o in gc.get_objects())
