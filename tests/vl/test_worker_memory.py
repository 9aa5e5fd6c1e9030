"""Memory the VLM pipeline's processes hold for nothing (issue 12, item 4): read, decode
and tokenize need no torch in a worker (about 140 MB each), and a driver whose
tokenizing runs in workers needs no tokenizer once the recipe is built (about 265 MB)."""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path

import pytest

from tests.helpers.vl import demo_shards, make_recipe, tokenizer_dir
from zephon_core import Execution, Loader, load_tokenizer


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return demo_shards(tmp_path_factory)


def _mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_vlm_workers_do_not_load_torch(shards):
    loader = Loader(make_recipe(shards), 0, 1,
                    Execution(runner="processes", default_workers=2, group_size=2))
    try:
        batch = next(iter(loader))
        assert batch["pixel_values"].numel() > 0
        pids = [pid for runner in loader.runners.values() for pid in getattr(runner, "pids", [])]
        assert len(pids) == 2
        for pid in pids:
            assert "libtorch" not in _mapped(pid), f"worker {pid} loaded torch"
        assert "libtorch" in _mapped(os.getpid())  # the check can see it
    finally:
        loader.close()


@pytest.mark.parametrize(("runner", "kept"), [("processes", False), ("inline", True)])
def test_driver_lets_go_of_the_tokenizer_when_workers_tokenize(shards, runner, kept):
    recipe = make_recipe(shards)  # reads the special ids with the tokenizer
    tokenizer = weakref.ref(load_tokenizer(tokenizer_dir()))  # the object the build used
    ex = Execution(runner=runner, default_workers=1, group_size=2)
    loader = Loader(recipe, 0, 1, ex)
    try:
        gc.collect()
        assert (tokenizer() is not None) == kept
        assert next(iter(loader))["input"].shape[0] > 0
        state = loader.state_dict()
    finally:
        loader.close()
    if kept:
        return
    kind = type(load_tokenizer(tokenizer_dir()))
    with Loader(recipe, 0, 1, ex) as resumed:
        resumed.load_state_dict(state)  # recomputes held payloads here, with a tokenizer
        gc.collect()
        assert not [o for o in gc.get_objects() if type(o) is kind]
        assert next(iter(resumed))["input"].shape[0] > 0
