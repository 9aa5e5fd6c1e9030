"""Row transforms (`RowTransform`): stateless work on finished rows after the combiner, in
any runner, the rows the same at every D, runner and resume."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from tests.helpers.core import Spec, World, build_recipe
from zephon_core import ConfigError, Execution, Map
from zephon_core.extend import Row, RowTransform


class MaskOdd(RowTransform):
    """No labels from samples of odd index; a sample of index divisible by 5 dropped."""

    name = "mask_odd"

    def process_rows(self, rows: list[Row]) -> list[Row]:
        out = []
        for row in rows:
            segments, drops = [], list(row.drops)
            for s in row.segments:
                if s.origin.index % 2:
                    n = len(s.payload["tokens"])
                    s = dataclasses.replace(s, payload={**s.payload,
                                                        "targets": np.zeros(n, dtype=bool)})
                if s.origin.index % 5 == 0 and s.start == 0:
                    drops.append((s.origin, "late"))
                segments.append(s)
            out.append(dataclasses.replace(row, segments=segments, drops=drops))
        return out


class Reorders(RowTransform):
    name = "reorders"

    def process_rows(self, rows: list[Row]) -> list[Row]:
        return [dataclasses.replace(r, segments=r.segments[::-1]) for r in rows]


SPEC = Spec(seq_len=48)


def _world(spec: Spec, D: int, ex: Execution, row_ops: list, shared: bool = False,
           state: dict | None = None) -> World:
    return World(spec.but(row_ops=tuple(row_ops)), D, ex, shared_runners=shared, state=state)


def _digests_and_drops(world: World, steps: int) -> list[tuple[str, list]]:
    out = []
    for _ in range(steps):
        rows = world.step()
        assert rows is not None
        out.append((world.digest(rows), [d for r in rows for d in r.drops]))
    return out


def test_a_row_transform_changes_rows_the_same_way_everywhere():
    inline = Execution(runner="inline")
    with _world(SPEC, 1, inline, [MaskOdd()]) as w:
        ref = _digests_and_drops(w, 6)
    with _world(SPEC, 1, inline, []) as w:
        plain = _digests_and_drops(w, 6)
    assert [d for d, _ in ref] != [d for d, _ in plain]  # it ran
    late = [d for _, drops in ref for d in drops if d[1] == "late"]
    assert late and all(o.index % 5 == 0 for o, _ in late)
    threads = Execution(runner="threads", workers={"mask_odd": 2, "tokens": 2})
    with _world(SPEC, 2, threads, [MaskOdd()]) as w:
        assert _digests_and_drops(w, 6) == ref
    # runners built from a plan without row_ops: the row stage runs inline
    with _world(SPEC, 2, threads, [MaskOdd()], shared=True) as w:
        assert _digests_and_drops(w, 6) == ref
    # resumed at step 3 on another D
    with _world(SPEC, 4, inline, [MaskOdd()]) as w:
        _digests_and_drops(w, 3)
        state = w.state()
    with _world(SPEC, 2, threads, [MaskOdd()], state=state) as w:
        assert _digests_and_drops(w, 3) == ref[3:]


@pytest.mark.slow
def test_a_row_transform_in_a_process_pool():
    ex = Execution(runner="processes", workers={"mask_odd": 2, "tokens": 1})
    with _world(SPEC, 1, Execution(runner="inline"), [MaskOdd()]) as w:
        ref = _digests_and_drops(w, 4)
    with _world(SPEC, 2, ex, [MaskOdd()]) as w:
        assert _digests_and_drops(w, 4) == ref


def test_a_row_transform_must_keep_the_segments():
    with _world(SPEC, 1, Execution(runner="inline"), [Reorders()]) as w, \
            pytest.raises(RuntimeError, match="segments and drops unchanged"):
        for _ in range(3):
            w.step()


def test_row_ops_are_checked_and_fingerprinted():
    recipe = build_recipe(SPEC)
    with pytest.raises(ConfigError, match="not RowTransforms"):
        dataclasses.replace(recipe, row_ops=[Map(lambda p: p, name="m")])
    with_op = dataclasses.replace(recipe, row_ops=[MaskOdd()])
    assert "row_ops" not in recipe.fingerprint()
    assert with_op.fingerprint()["row_ops"] == [{"name": "mask_odd", "type": "MaskOdd"}]
    quiet = MaskOdd()
    quiet.fingerprinted = False
    assert dataclasses.replace(recipe, row_ops=[quiet]).fingerprint() == recipe.fingerprint()


class CountRows(RowTransform):
    """Counts the rows it is given (inline: in this process), changes nothing."""

    name = "count_rows"

    def __init__(self) -> None:
        self.seen = 0

    def process_rows(self, rows: list[Row]) -> list[Row]:
        self.seen += len(rows)
        return rows


def test_rows_past_those_asked_for_wait_unsent():
    """The combiner makes rows as the samples already drawn arrive, past the first step's;
    sent at once they would queue the first step's row work behind the lanes' spare rows."""
    count = CountRows()
    spec = SPEC.but(seq_len=24, max_open_bins=8)  # short rows, many open bins: spare rows
    ex = Execution(runner="inline", prefetch_steps=0)
    with _world(spec, 1, ex, [count]) as w:
        loader = w.loaders[0]
        it = iter(loader)
        next(it)
        made = sum(run.rows_made for run in loader._runs)  # noqa: SLF001 - the lanes' count
        asked = spec.global_batch_size * 2  # after a step the loader asks for the next one
        assert made > asked, "the test needs spare rows"
        assert count.seen <= asked
    with _world(spec, 1, ex, [count]) as w, _world(spec, 1, ex, []) as plain:
        assert w.digests(5) == plain.digests(5)  # held rows come out in their turn


class MarkTargets(RowTransform):
    """Sends the runner only each segment's token count; puts the answer in the lane."""

    name = "mark_targets"

    def row_part(self, row: Row) -> list[int] | None:
        lengths = [len(s.payload["tokens"]) for s in row.segments]
        return None if row.segments[0].origin.index % 3 == 0 else lengths

    def process_rows(self, rows: list[list[int]]) -> list[list[np.ndarray]]:
        assert all(isinstance(n, int) for part in rows for n in part)  # only the part came
        return [[np.arange(n) % 2 == 0 for n in part] for part in rows]

    def row_from(self, row: Row, result: list[np.ndarray]) -> Row:
        return dataclasses.replace(row, segments=[
            dataclasses.replace(s, payload={**s.payload, "targets": t})
            for s, t in zip(row.segments, result, strict=True)])


def test_a_row_transform_may_send_only_a_part_of_each_row():
    inline = Execution(runner="inline")
    with _world(SPEC, 1, inline, [MarkTargets()]) as w:
        ref = w.digests(5)
        rows = w.step()
    with _world(SPEC, 1, inline, []) as w:
        assert w.digests(5) != ref
    untouched = [r for r in rows if r.segments[0].origin.index % 3 == 0]
    marked = [r for r in rows if r.segments[0].origin.index % 3]
    assert untouched and marked  # a None part: the row passes as it is
    assert all(s.payload["targets"][1::2].sum() == 0 for r in marked for s in r.segments)
    procs = Execution(runner="processes", workers={"mark_targets": 2, "tokens": 1})
    with _world(SPEC, 2, procs, [MarkTargets()]) as w:
        assert w.digests(5) == ref


def test_fused_row_transforms_take_their_parts_where_they_run():
    both = [MarkTargets(), MaskOdd()]
    with _world(SPEC, 1, Execution(runner="inline", fuse=False), both) as w:
        ref = w.digests(5)
    procs = Execution(runner="processes", workers={"mark_targets": 2, "mask_odd": 2,
                                                   "tokens": 1})
    with _world(SPEC, 2, procs, both) as w:
        assert len(w.loaders[0].plan.row_stages) == 1  # fused: one stage
        assert w.digests(5) == ref


class SleepRows(RowTransform):
    """Each part is a number of seconds to sleep: rows of uneven cost."""

    name = "sleep_rows"

    def process_rows(self, rows: list[float]) -> list[float]:
        for seconds in rows:
            time.sleep(seconds)
        return rows


def test_a_row_goes_to_an_idle_worker_not_behind_a_long_one():
    """Rows come one at a time and differ in cost (one image or eight); queued on a busy
    worker behind a long one, a row waits while another worker idles."""
    from zephon_core import Element, RunnerKind
    from zephon_core.extend import RowStageFn
    from zephon_core.internals import RunnerSpec, make_runner

    runner = make_runner(RunnerSpec(RunnerKind.PROCESSES, 2, "sleep_rows"),
                         RowStageFn([SleepRows()]))
    try:
        for f in [runner.submit([Element(i, 0.0, None)]) for i in range(4)]:
            f.result(timeout=60)  # both workers up
        slow = runner.submit([Element(0, 6.0, None)])
        quick = runner.submit([Element(1, 0.0, None)])
        assert quick.result(timeout=4.0) == [0.0]
        assert not slow.done()
    finally:
        runner.close()
