"""Loader metrics: they count what steps delivered, warn on a data-bound loop, change nothing."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon_core import Execution, Loader, batch_digest, text_demo
from zephon_core.engine.metrics import WAIT_WARN_STEPS, LoaderMetrics, busy_seconds


def small_recipe():
    return text_demo(num_lanes=2, global_batch_size=4, seq_len=128)


def test_busy_seconds_counts_at_most_workers_groups_at_once():
    spans = [(0.0, 2.0), (0.0, 2.0), (1.0, 3.0)]
    assert busy_seconds(spans, 2, 0.0, 3.0) == pytest.approx(5.0)
    assert busy_seconds(spans, 1, 0.0, 3.0) == pytest.approx(3.0)
    assert busy_seconds(spans, 2, 1.5, 2.5) == pytest.approx(1.5)  # clipped to the window


spans_st = st.lists(st.tuples(st.floats(0, 10), st.floats(0, 5)).map(lambda p: (p[0], p[0] + p[1])),
                    max_size=12)


@given(spans_st, st.integers(1, 6))
def test_busy_seconds_bounds(spans, workers):
    busy = busy_seconds(spans, workers, 0.0, 15.0)
    assert -1e-9 <= busy <= workers * 15.0 + 1e-9
    assert busy <= busy_seconds(spans, workers + 1, 0.0, 15.0) + 1e-9  # more workers, more busy
    if workers >= len(spans):  # never more groups than workers: every span counts in full
        assert busy == pytest.approx(sum(e - s for s, e in spans), abs=1e-6)


def test_metrics_count_exactly_what_the_steps_delivered():
    got: list[LoaderMetrics] = []
    want_samples, want_tokens, want_drops, want_ds = 0, 0, Counter(), Counter()
    with Loader(small_recipe(), execution=Execution(runner="inline"), on_metrics=got.append,
                metrics_every=2) as loader:
        names = [d.name for d in loader.recipe.datasets]
        for _ in range(6):
            next(loader)
            meta = loader.last_meta
            for row in meta.rows:
                for origin, start, end in row:
                    if origin.dataset >= 0:
                        want_tokens += end - start
                        if start == 0:
                            want_samples += 1
                            want_ds[names[origin.dataset]] += 1
            want_drops.update(reason for _, reason in meta.drops)
        stages = loader.plan.stages
    assert [m.step for m in got] == [2, 4, 6] and all(m.steps == 2 for m in got)
    last = got[-1]
    assert last.samples_total == want_samples and last.tokens_total == want_tokens
    assert last.drops_total == dict(want_drops)
    assert sum(m.samples for m in got) == want_samples
    assert sum(m.rows for m in got) == 6 * 4
    assert 0 < last.fill <= 1 and last.tokens_per_s > 0
    assert sum(last.mixture_samples.values()) == pytest.approx(1.0)
    assert [s.name for s in last.stages] == [s.name for s in stages]
    assert all(0 <= s.utilisation <= 1 for s in last.stages)
    assert sum(s.groups for m in got for s in m.stages) > 0  # in whichever window they ran
    assert 0 < last.wait_share <= 1 and last.wait_s > 0
    scalars = last.scalars()
    assert scalars["zephon/samples_total"] == want_samples
    assert scalars["zephon/drops_total"] == sum(want_drops.values())


@pytest.mark.parametrize("background", [False, True])
def test_metrics_change_no_batch(background):
    def digests(**kw) -> list[str]:
        with Loader(small_recipe(), execution=Execution(runner="threads", default_workers=2),
                    background=background, **kw) as loader:
            out = []
            for _ in range(4):
                out.append(batch_digest(next(loader)))
                loader.metrics()
            return out

    plain = digests(metrics_every=0, wait_warn_share=None)
    assert digests(on_metrics=lambda m: m.scalars(), metrics_every=1) == plain


def test_a_data_bound_loop_is_warned_naming_the_slowest_stage(caplog):
    caplog.set_level(logging.WARNING, logger="zephon_core.engine.metrics")
    with Loader(small_recipe(), execution=Execution(runner="inline")) as loader:
        for _ in range(WAIT_WARN_STEPS + 2):  # a loop that does nothing but wait for data
            next(loader)
        names = [s.name for s in loader.plan.stages]
    warned = [r.getMessage() for r in caplog.records if "waited" in r.getMessage()]
    assert len(warned) == 1, caplog.text  # once, not at every step
    assert "Slowest stage: '" in warned[0]
    assert any(f"'{n}'" in warned[0] for n in names)


def test_a_loop_that_computes_is_not_warned(caplog):
    import time

    caplog.set_level(logging.WARNING, logger="zephon_core.engine.metrics")
    with Loader(small_recipe(), execution=Execution(runner="inline"),
                wait_warn_share=0.99) as loader:
        for _ in range(WAIT_WARN_STEPS + 2):
            next(loader)
            time.sleep(0.05)
    assert "waited" not in caplog.text


def test_without_stage_metrics_the_counts_stay_and_the_stages_are_unobserved():
    with Loader(small_recipe(), execution=Execution(runner="inline"),
                stage_metrics=False) as loader:
        for _ in range(2):
            next(loader)
        m = loader.metrics()
    assert m.samples > 0 and m.steps == 2
    assert all(s.groups == 0 and s.busy_s == 0 for s in m.stages)
