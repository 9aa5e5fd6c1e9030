"""`workers="auto"` never changes a batch: vlm-demo and text-demo at D=1 and 2 on process
workers, sized while they run, give the digests of a fixed split."""

from __future__ import annotations

import pytest

from zephon_core import Execution, Loader, batch_digest, load_recipe
from zephon_core.engine import autoscale, shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="needs /dev/shm")

STEPS = 6


def run(name: str, dp: int, ex: Execution) -> tuple[list[str], list[list]]:
    """Digests of `STEPS` global batches on `dp` in-process ranks, each with its own
    runners (so each rank sizes its own stages), and every rank's changes of split."""
    recipe = load_recipe(name)
    loaders = [Loader(recipe, d, dp, ex, gather=False) for d in range(dp)]
    try:
        out = []
        for _ in range(STEPS):
            rows = [row for ld in loaders for row in ld.next_rows()]
            out.append(batch_digest(recipe.collate(rows)))
        return out, [ld.sizer.changes if ld.sizer else [] for ld in loaders]
    finally:
        for ld in loaders:
            ld.close()


@pytest.mark.parametrize("name", [
    pytest.param("vlm-demo", marks=pytest.mark.heavy(
        reason="about 50 s on 2 quiet cores; text-demo covers the same decision path")),
    "text-demo"])
def test_auto_workers_give_the_batches_of_fixed_workers(name, monkeypatch):
    monkeypatch.setattr(autoscale, "AUTO_WINDOW_S", 0.0)  # a window per step: decide at once
    monkeypatch.setattr(autoscale, "AUTO_MIN_GROUPS", 1)
    # groups of 8: the sizer decides per window of answered groups, and text-demo's
    # small documents would otherwise go 64 a call, too few groups to move a split
    fixed = Execution(runner="processes", default_workers=1, group_size=8)
    auto = Execution(runner="processes", workers="auto", fuse=False, default_workers=4,
                     group_size=8)
    want, _ = run(name, 1, fixed)  # the same at every D: the loader's promise, tested elsewhere
    moved = 0
    for dp in (1, 2):
        got, changes = run(name, dp, auto)
        assert got == want, (dp, changes)
        moved += sum(len(c) - 1 for c in changes)
    assert moved > 0  # the splits did change while those batches were made
