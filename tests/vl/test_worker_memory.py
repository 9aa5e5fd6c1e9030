"""What a worker process of the VLM pipeline loads: read, decode and tokenize need no
torch, and each worker that imported it would hold about 140 MB more (issue 12, item 4)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.vl import demo_shards, make_recipe
from zephon_core import Execution, Loader


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
