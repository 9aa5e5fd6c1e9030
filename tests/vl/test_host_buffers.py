"""The collate's recycled pixel memory: a batch still referenced is never written again."""

from __future__ import annotations

import dataclasses
import gc
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.vl import IMAGE, demo_shards, make_recipe
from zephon_core import Execution, Loader
from zephon_vl.ops.host_buffers import MIN_BYTES, HostBuffers


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5), st.integers(0, 7)), max_size=30))
def test_live_arrays_never_share_memory(ops) -> None:
    """Any interleaving of takes and releases: every live array has memory of its own, and
    keeps the bytes written into it."""
    pool = HostBuffers(keep=2)
    live: list[tuple[np.ndarray, int]] = []
    for take, mib, pick in ops:
        if take or not live:
            a = pool.empty((mib * MIN_BYTES // 4,), np.float32)
            a[:] = len(live) + mib
            live.append((a, len(live) + mib))
        else:
            live.pop(pick % len(live))
            gc.collect()
        for i, (x, _) in enumerate(live):
            assert all(not np.shares_memory(x, y) for y, _ in live[i + 1:])
        assert all(float(x[0]) == v and float(x[-1]) == v for x, v in live)
    assert len(pool._free) <= pool.keep  # noqa: SLF001


def test_a_freed_buffer_is_reused_and_a_held_one_is_not() -> None:
    pool = HostBuffers()
    a = torch.from_numpy(pool.empty((3 * MIN_BYTES,), np.uint8))
    b = torch.from_numpy(pool.empty((3 * MIN_BYTES,), np.uint8))
    assert pool.allocated == 2 and pool.reused == 0
    view = a[10:20]  # a slice keeps the whole buffer
    del a
    gc.collect()
    c = pool.empty((3 * MIN_BYTES,), np.uint8)
    assert pool.reused == 0 and not np.shares_memory(c, view.numpy())
    del view, b
    gc.collect()
    d = pool.empty((3 * MIN_BYTES,), np.uint8)
    assert pool.reused == 1 and pool.allocated == 3 and d.nbytes == 3 * MIN_BYTES
    small = pool.empty((16,), np.uint8)
    assert pool.allocated == 3 and small.nbytes == 16


@pytest.mark.parametrize("normalize", ["collate", "device"])
def test_batches_from_recycled_memory_equal_fresh_ones(tmp_path_factory, normalize) -> None:
    """Consume a few batches, dropping each (buffers recycled), and again keeping every one:
    the same tensors; the collate still pickles (process workers, other loaders)."""
    shards = demo_shards(tmp_path_factory)

    def run(keep: bool) -> list[dict]:
        recipe = make_recipe(shards, image=dataclasses.replace(IMAGE, normalize=normalize))
        kept = []
        with Loader(recipe, 0, 1, Execution(runner="inline")) as loader:
            for _ in range(4):
                batch = next(loader)
                kept.append({k: v.clone() for k, v in batch.items()} if not keep else batch)
                del batch
                gc.collect()
        pickle.loads(pickle.dumps(recipe.collate))
        return kept

    for fresh, recycled in zip(run(keep=True), run(keep=False), strict=True):
        assert fresh["pixel_values"].nbytes >= MIN_BYTES
        assert set(fresh) == set(recycled)
        assert all(torch.equal(fresh[k], recycled[k]) for k in fresh)
