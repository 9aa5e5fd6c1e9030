"""The first batch waits for the work it needs, not for every lane's prefetch.

A worker serves groups in the order the lanes sent them. When every lane sent
whole groups at the start, asking for two steps' rows, the first lanes' work for
later steps came before the last lanes' first documents.
"""

from __future__ import annotations

import numpy as np

from tests.helpers.core import (
    PROCESSED,
    Spec,
    build_recipe,
    recording_tokens,
    run_digests,
    to_tokens,
)
from zephon_core import Execution, Loader
from zephon_core.engine.lane import GROUP_CPU_S
from zephon_core.engine.plan import GROUP_SIZE, SMALL_GROUP_SIZE, SMALL_OUTPUT_BYTES
from zephon_core.records import Pointer

LANES = 8
SPEC = Spec(num_lanes=LANES, rows_per_lane=1, shuffle_pos=None, use_filter=False,
            max_open_bins=1, map_fn=recording_tokens)


def doc_id(p: Pointer) -> int:
    return p.dataset * 100_000 + p.shard * 1000 + p.index


def test_first_batch_needs_only_its_own_work() -> None:
    PROCESSED.clear()
    ex = Execution(runner="threads", default_workers=1, group_size=16)
    with Loader(build_recipe(SPEC), 0, 1, ex) as loader:
        rows = loader.next_rows()
        assert rows is not None and len(rows) == LANES
        needed = {doc_id(s.origin.pointer) for row in rows for s in row.segments}
        order = list(PROCESSED)
        last_needed = max(order.index(d) for d in needed)
        # Each lane needs one to three documents for its row. In groups of one the lanes
        # take turns and the last needed is served 23rd (five per lane bounds it); with
        # whole groups of 16 it was served 79th.
        assert last_needed < 5 * LANES, (last_needed, len(order))


def test_first_groups_change_no_batch() -> None:
    spec = SPEC.but(map_fn=None)
    ref = run_digests(spec, 1, Execution(runner="inline"), steps=8)
    for ex in (Execution(runner="threads", default_workers=1, group_size=8),
               Execution(runner="threads", default_workers=2, group_size=3, prefetch=1)):
        assert run_digests(spec, 2, ex, steps=8) == ref


def submitted_sizes(map_fn: object, group_size: int | None, steps: int) -> tuple[list, list]:
    """Sizes of the groups the lanes sent before the first batch came back, and after."""
    from zephon_core.engine.plan import Plan

    recipe = build_recipe(SPEC.but(map_fn=map_fn))
    ex = Execution(runner="threads", default_workers=1, group_size=group_size)
    runners = Plan(recipe.ops, ex).make_runners()
    sizes: list[int] = []
    for runner in runners.values():
        submit = runner.submit
        runner.submit = lambda elements, submit=submit: (sizes.append(len(elements)),
                                                         submit(elements))[1]
    try:
        with Loader(recipe, 0, 1, ex, runners=runners) as loader:
            assert loader.next_rows() is not None
            first = list(sizes)
            for _ in range(steps):
                assert loader.next_rows() is not None
            return first, sizes[len(first):]
    finally:
        for runner in runners.values():
            runner.close()


def test_cheap_samples_keep_whole_groups_costly_ones_go_in_small_ones() -> None:
    first, later = submitted_sizes(recording_tokens, 16, 6)
    assert set(first) == {1}
    # 30 ms of CPU a sample: about GROUP_CPU_S (0.1 s) a group, never 16. Whole groups kept
    # 8 lanes x 2 groups x 16 costly samples in flight (decoded clips: 550 MB).
    assert later and max(later) <= int(GROUP_CPU_S / 0.03), later
    first, later = submitted_sizes(None, 16, 6)
    assert first[0] == 1 and max(first) == 16, first  # whole once measured cheap


def with_pixels(payload: dict) -> dict:
    """A cheap document that carries more than a small output's bytes (like a photo)."""
    out = to_tokens(payload)
    out["pixels"] = np.zeros(SMALL_OUTPUT_BYTES + 1, dtype=np.uint8)
    return out


def test_cheap_small_documents_go_in_larger_groups_without_changing_a_batch() -> None:
    # by default, token ids alone (small outputs) go up to SMALL_GROUP_SIZE a call: the
    # sample cap guards memory against decoded media, and every call costs the driver
    # about the same (issue 39); documents with pixels keep the cap of GROUP_SIZE
    first, later = submitted_sizes(None, None, 8)
    assert first[0] == 1, first
    assert GROUP_SIZE < max(first + later) <= SMALL_GROUP_SIZE, (first, later)
    first, later = submitted_sizes(with_pixels, None, 8)
    assert max(first + later) == GROUP_SIZE, (first, later)
    first, later = submitted_sizes(None, 4, 8)  # a group size the user set is kept
    assert max(first + later) == 4, (first, later)
    spec = SPEC.but(map_fn=None)
    ref = run_digests(spec, 1, Execution(runner="inline"), steps=8)
    assert run_digests(spec, 1, Execution(runner="threads", default_workers=1),
                       steps=8) == ref
