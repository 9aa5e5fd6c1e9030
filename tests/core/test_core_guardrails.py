"""Guarantee 6 and the errors a user can act on.

A checkpoint refuses a recipe that differs in any fingerprinted setting and
names the field; corrupt files and mangled states raise CheckpointError;
impossible geometries raise ConfigError naming the numbers; bad samples stop
the run naming the sample, or are dropped deterministically.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace

import pytest

from tests.helpers.core import (
    DataSpec,
    Spec,
    World,
    build_recipe,
    make_shards,
    reference_digests,
    run_digests,
)
from zephon_core import (
    BadSampleError,
    CheckpointError,
    ConfigError,
    Execution,
    Loader,
    Recipe,
    load_state,
    save_state,
)

BASE = Spec(datasets=(DataSpec((12, 7, 20), data_seed=1), DataSpec((5, 9), weight=0.5)),
            num_lanes=4, rows_per_lane=2, shuffle_pos="payloads", seq_len=32)


@pytest.fixture(scope="module")
def base_state() -> dict:
    with World(BASE, 2) as w:
        w.digests(3)
        return w.state()


def _recipe_with_doc_changed(spec: Spec, *, grow: bool) -> Recipe:
    recipe = build_recipe(spec)
    shard = recipe.datasets[0].reader.shards[1]
    if grow:
        shard.append({"id": 1999, "n": 5})
    else:
        shard[4] = {**shard[4], "n": shard[4]["n"] + 1}
    return recipe


CHANGES = [
    ("seed", lambda: build_recipe(BASE.but(seed=1)), ["seed", "0", "1"]),
    ("num_lanes", lambda: build_recipe(BASE.but(num_lanes=8, rows_per_lane=1)), ["num_lanes"]),
    ("global_batch_size", lambda: build_recipe(BASE.but(rows_per_lane=3)),
     ["global_batch_size", "8", "12"]),
    ("seq_len", lambda: build_recipe(BASE.but(seq_len=64)), ["seq_len"]),
    ("mixture", lambda: build_recipe(BASE.but(datasets=(BASE.datasets[0],
                                                        replace(BASE.datasets[1], weight=2.0)))),
     ["weight"]),
    ("shard content", lambda: _recipe_with_doc_changed(BASE, grow=False),
     ["datasets[0].shards[1]", "sha256"]),
    ("shard size", lambda: _recipe_with_doc_changed(BASE, grow=True),
     ["datasets[0].shards[1]", "samples"]),
    ("shuffle block size", lambda: build_recipe(BASE.but(block_size=16)),
     ["shuffle.block_size"]),
    ("shard shuffle", lambda: build_recipe(BASE.but(shuffle_shards=False)), ["shuffle.shards"]),
    ("shuffle buffer", lambda: build_recipe(BASE.but(shuffle_buffer=9)), ["buffer_size"]),
    ("pack mode", lambda: build_recipe(BASE.but(mode="first_fit")), ["mode"]),
    ("pack overlong", lambda: build_recipe(BASE.but(overlong="drop")), ["overlong"]),
    ("max_open_bins", lambda: build_recipe(BASE.but(max_open_bins=2)), ["max_open_bins"]),
    ("operator list", lambda: build_recipe(BASE.but(use_filter=False)), ["operators"]),
    ("epochs", lambda: build_recipe(BASE.but(epochs=3)), ["epochs"]),
]


@pytest.mark.parametrize(("make", "words"), [pytest.param(m, w, id=n) for n, m, w in CHANGES])
def test_changed_setting_is_refused_naming_the_field(base_state, make, words):
    recipe = make()
    with Loader(recipe, 0, 2, Execution(runner="inline")) as loader:
        with pytest.raises(CheckpointError) as info:
            loader.load_state_dict(copy.deepcopy(base_state))
    msg = str(info.value)
    for word in words:
        assert word in msg, f"{word!r} not named in: {msg}"


def test_execution_changes_are_not_fingerprinted(base_state):
    """The refusal is not blanket: another rank count, runner and knobs restore fine."""
    ex = Execution(runner="threads", default_workers=3, group_size=2, prefetch=1,
                   prefetch_steps=0)
    with World(BASE, 4, ex, state=copy.deepcopy(base_state)) as w:
        assert w.digests(2) == reference_digests(BASE, 5)[3:]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "not-utf8"])
def test_damaged_checkpoint_file_raises_checkpoint_error(base_state, tmp_path, damage):
    path = tmp_path / "state.json"
    save_state(base_state, path)
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        i = raw.index(b'"lanes"')
        path.write_bytes(raw[:i] + b"{" + raw[i + 1:])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(raw[:100] + b"\xff\xfe" + raw[100:])
    with pytest.raises(CheckpointError) as info:
        load_state(path)
    assert "state.json" in str(info.value)
    assert "corrupt" in str(info.value) or "truncated" in str(info.value)


def _set(path: list, value):
    def edit(state: dict) -> None:
        node = state
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return edit


def _delete(path: list):
    def edit(state: dict) -> None:
        node = state
        for k in path[:-1]:
            node = node[k]
        del node[path[-1]]
    return edit


MANGLED = [
    # (id, edit, words the message must contain)
    ("not a dict", lambda s: s.clear(), ["not a zephon checkpoint"]),
    ("version", _set(["version"], 99), ["version", "99"]),
    ("fingerprint edited", _set(["fingerprint", "seed"], 5), ["fingerprint"]),
    ("no lanes field", _delete(["lanes"]), ["lanes"]),
    ("lane deleted", _delete(["lanes", "1"]), ["lanes [1]"]),
    ("lane is a string", _set(["lanes", "2"], "garbage"), ["lane 2"]),
    ("lane is empty", _set(["lanes", "1"], {}), ["lane 1"]),
    ("lane combiner deleted", _delete(["lanes", "1", "combiner"]), ["lane 1", "combiner"]),
    ("lane rows not a number", _set(["lanes", "0", "rows"], "x"), ["lane 0"]),
    ("lane origin too short", _set(["lanes", "1", "accumulators", "2", "buffer"], [[1, 2]]),
     ["lane 1"]),
    ("lane origin outside the data", _set(["lanes", "1", "accumulators", "2", "buffer"],
                                          [[99, 0, 77, 0, 0]]), ["lane 1"]),
    ("lane drop counters not a dict", _set(["lanes", "1", "dropped"], []), ["lane 1"]),
    ("lane source counts for one dataset of two", _set(["lanes", "1", "source", "counts"], [3]),
     ["lane 1"]),
    ("step not a number", _set(["step"], "x"), ["step"]),
]


@pytest.mark.parametrize(("edit", "words"), [pytest.param(e, w, id=n) for n, e, w in MANGLED])
def test_mangled_state_raises_checkpoint_error(base_state, edit, words):
    state = json.loads(json.dumps(base_state))
    edit(state)
    with World(BASE, 2) as w:
        with pytest.raises(CheckpointError) as info:
            for loader in w.loaders:  # refused at load (or, at the latest, at the first step)
                loader.load_state_dict(state)
            w.step()
    msg = str(info.value)
    for word in words:
        assert word in msg, f"{word!r} not named in: {msg}"


def test_rank_count_must_divide_lanes():
    recipe = build_recipe(BASE.but(num_lanes=8, rows_per_lane=1))
    with pytest.raises(ConfigError) as info:
        Loader(recipe, 0, 3, Execution(runner="inline"))
    msg = str(info.value)
    assert re.search(r"\b3\b", msg) and re.search(r"\b8\b", msg), msg
    assert "[1, 2, 4, 8]" in msg, msg  # and says which rank counts work
    with pytest.raises(ConfigError, match="dp_rank 4"):
        Loader(recipe, 4, 4, Execution(runner="inline"))


@pytest.mark.parametrize("field", ["workers", "runners"])
def test_workers_for_an_operator_the_recipe_lacks_are_named(field, caplog):
    """`--workers decod=2` (a typo) used to be accepted and do nothing. A Python Execution
    may serve several recipes, so the Loader warns; the command line refuses (below)."""
    recipe = build_recipe(BASE)
    value = {"decod": 2} if field == "workers" else {"decod": "threads"}
    with caplog.at_level("WARNING"):
        Loader(recipe, 0, 1, Execution(runner="inline", **{field: value})).close()
    assert "['decod'], which this recipe does not run; its operators with workers: read, " \
        "tokens" in caplog.text


def test_cli_refuses_workers_of_an_unknown_operator(capsys):
    from zephon_vl.cli.main import main

    assert main(["digest", "--recipe", "text-demo", "--steps", "1", "--workers", "decod=2"]) == 2
    assert "['decod'], which this recipe does not run" in capsys.readouterr().err


def test_default_prefetch_gives_every_worker_two_groups():
    """Execution only: few lanes get more groups in flight, many lanes fewer (at least 2)."""
    from zephon_core.engine.plan import Plan

    ops = build_recipe(BASE).ops
    pool = Execution(runner="processes", default_workers=4)
    assert Plan(ops, pool, lanes=1).prefetch == 8
    assert Plan(ops, pool, lanes=3).prefetch == 3
    assert Plan(ops, pool, lanes=16).prefetch == 2
    assert Plan(ops, Execution(runner="inline"), lanes=1).prefetch == 2
    assert Plan(ops, replace(pool, prefetch=5), lanes=16).prefetch == 5
    with Loader(build_recipe(BASE), 0, 2, pool) as loader:
        assert "up to 4 groups in flight" in loader.explain()


def test_global_batch_must_be_a_multiple_of_lanes():
    with pytest.raises(ConfigError) as info:
        Recipe(**{**_recipe_kwargs(), "global_batch_size": 6, "num_lanes": 4})
    msg = str(info.value)
    assert "global_batch_size=6" in msg and "num_lanes=4" in msg, msg


def _recipe_kwargs() -> dict:
    r = build_recipe(BASE)
    return {"datasets": r.datasets, "ops": r.ops, "global_batch_size": r.global_batch_size,
            "num_lanes": r.num_lanes, "seed": r.seed}


BAD = BASE.but(datasets=(DataSpec((12, 7, 20), data_seed=1, bad_every=9),), shuffle_pos=None)


def _bad_docs(spec: Spec) -> dict[int, tuple[int, int]]:
    shards = make_shards(spec.datasets[0], 0)
    return {d["id"]: (s, i) for s, docs in enumerate(shards) for i, d in enumerate(docs)
            if d.get("bad")}


@pytest.mark.parametrize("runner", ["inline", "threads", pytest.param("processes",
                                                                      marks=pytest.mark.slow)])
def test_bad_sample_with_raise_stops_naming_the_sample(runner):
    bad = _bad_docs(BAD)
    assert bad
    ex = Execution(runner=runner, default_workers=2, group_size=3)
    with World(BAD, 2, ex, shared_runners=True) as w:
        with pytest.raises(BadSampleError) as info:
            w.digests(10)
        msg = str(info.value)
        m = re.search(r"doc (\d+) \[dataset 0 shard (\d+) index (\d+)", msg)
        assert m, msg
        doc, shard, index = (int(g) for g in m.groups())
        assert bad.get(doc) == (shard, index), msg  # names a bad sample, where it is
        assert info.value.reason == "corrupt_doc"
        assert "tokens" in msg and "on_error" in msg  # which operator; how to skip


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_iteration_stays_stopped_after_a_bad_sample(runner):
    """After the error, the next call must not go on with the group that held the bad
    sample silently missing (its good neighbours would never be seen: not exactly once)."""
    spec = BAD.but(datasets=(DataSpec((12, 7, 20), data_seed=1, bad_every=100_000),),
                   epochs=1)
    assert list(_bad_docs(spec)) == [1]  # one bad document in the whole run
    with World(spec, 1, Execution(runner=runner, group_size=4)) as w:
        with pytest.raises(BadSampleError, match="doc 1 "):
            w.digests(100)
        got = []
        for _ in range(3):
            try:
                rows = w.step()
            except Exception:  # noqa: BLE001 - staying failed is what is expected
                continue
            got.append(None if rows is None else len(rows))
        assert all(g is None for g in got), (
            f"after the BadSampleError the loader went on and returned batches of {got} rows")


def _run_with_drops(spec: Spec, D: int, ex: Execution, steps: int = 6, shared=False):
    digests, drops = [], []
    with World(spec, D, ex, shared_runners=shared) as w:
        for _ in range(steps):
            rows = w.step()
            digests.append(w.digest(rows))
            drops.append(sorted((tuple(o), r) for loader in w.loaders
                                for o, r in loader.last_meta.drops))
    return digests, drops


DROP_EXECUTIONS = [
    (1, Execution(runner="inline")),
    (2, Execution(runner="inline", group_size=1, prefetch=1)),
    (4, Execution(runner="threads", default_workers=3, group_size=2, prefetch_steps=2)),
]


@pytest.mark.parametrize("shuffle_pos", [None, "pointers"])
def test_bad_sample_with_drop_is_recorded_deterministically(shuffle_pos):
    spec = BAD.but(on_error="drop", shuffle_pos=shuffle_pos)
    ref_digests, ref_drops = _run_with_drops(spec, *DROP_EXECUTIONS[0])
    bad = _bad_docs(spec)
    reasons = {r for step in ref_drops for _, r in step}
    assert "corrupt_doc" in reasons and "filtered" in reasons, reasons
    corrupt = {(o[2], o[3]) for step in ref_drops for o, r in step if r == "corrupt_doc"}
    assert corrupt <= set(bad.values()) and corrupt
    for D, ex in DROP_EXECUTIONS[1:]:
        digests, drops = _run_with_drops(spec, D, ex)
        assert digests == ref_digests, (D, ex)
        assert drops == ref_drops, (D, ex)


def test_drops_before_an_accumulator_are_per_step_deterministic():
    """Drops are decisions of the lane: the step that reports a drop must not depend on
    the execution, also when the dropping transform runs before a Shuffle."""
    spec = BAD.but(on_error="drop", shuffle_pos="payloads", num_lanes=2)
    ref_digests, ref_drops = _run_with_drops(spec, *DROP_EXECUTIONS[0], steps=8)
    for D, ex in [(1, Execution(runner="inline", group_size=1, prefetch=1)),
                  (2, Execution(runner="inline", group_size=3))]:
        digests, drops = _run_with_drops(spec, D, ex, steps=8)
        assert digests == ref_digests
        diff = [t for t, (a, b) in enumerate(zip(ref_drops, drops, strict=True)) if a != b]
        assert not diff, (f"{ex}: the drops reported at steps {diff} differ from the "
                          f"reference run's: {ref_drops[diff[0]]} vs {drops[diff[0]]}")


@pytest.mark.slow
def test_bad_sample_drop_in_a_process_pool_matches_inline():
    spec = BAD.but(on_error="drop")
    ref = _run_with_drops(spec, *DROP_EXECUTIONS[0])
    ex = Execution(runner="processes", default_workers=2, group_size=4, prefetch=3)
    assert _run_with_drops(spec, 2, ex, shared=True) == ref


def test_digests_depend_on_the_data():
    """The digests compared above are not blind: other document contents, other digests."""
    assert run_digests(BASE, 1, Execution(runner="inline"), 3) != run_digests(
        BASE.but(datasets=(DataSpec((12, 7, 20), data_seed=2), BASE.datasets[1])), 1,
        Execution(runner="inline"), 3)


def test_a_recipe_that_drops_everything_raises_instead_of_spinning():
    """Infinite data where every document is dropped: a clear NoRowsError, not a hang."""
    from zephon_core import Dataset, InMemoryReader, Loader, Map, NoRowsError, Pack, Read, Recipe

    reader = InMemoryReader([[{"n": 50}] * 20])
    ops = [Read([reader]), Map(_long_doc), Pack(16, {"overlong": "drop"})]
    recipe = Recipe([Dataset("d", reader)], ops, global_batch_size=2, num_lanes=2)
    with Loader(recipe, execution=Execution(runner="inline")) as loader, \
            pytest.raises(NoRowsError, match="over_length"):
        loader.next_rows()


def _long_doc(sample: dict) -> dict:
    import numpy as np

    return {"tokens": np.arange(sample["n"], dtype=np.int32)}


def _slow_long_doc(sample: dict) -> dict:
    import time

    time.sleep(0.002)
    return _long_doc(sample)


def _all_long_recipe(fn=_long_doc):
    from zephon_core import Dataset, InMemoryReader, Map, Pack, Read, Recipe

    reader = InMemoryReader([[{"n": 50}] * 20])
    ops = [Read([reader]), Map(fn), Pack(16, {"overlong": "drop"})]
    return Recipe([Dataset("d", reader)], ops, global_batch_size=2, num_lanes=2)


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_a_lane_that_drops_k_samples_in_a_row_stops_saying_why(runner):
    """Execution.stall_drops: K consecutive drops stop the lane at the same sample, with the
    reason and the fix (seq_len), long before the draw-count backstop."""
    from zephon_core import Loader, NoRowsError

    ex = Execution(runner=runner, stall_drops=30)
    with Loader(_all_long_recipe(), execution=ex) as loader, \
            pytest.raises(NoRowsError) as err:
        loader.next_rows()
    msg = str(err.value)
    assert "dropped every one of the last 30 samples" in msg
    assert "30 over_length" in msg and "seq_len 16 is smaller" in msg
    assert "stall_drops" in msg
    assert re.search(r"last dataset 0 shard 0 index \d+", msg)


def test_drops_between_rows_do_not_trip_stall_drops():
    """Samples that reach rows reset the count: a lane drops far more than K in all."""
    from zephon_core import Dataset, InMemoryReader, Loader, Map, Pack, Read, Recipe

    reader = InMemoryReader([[{"n": 50}, {"n": 50}, {"n": 8}] for _ in range(40)])
    ops = [Read([reader]), Map(_long_doc), Pack(16, {"overlong": "drop"})]
    recipe = Recipe([Dataset("d", reader)], ops, global_batch_size=2, num_lanes=2, epochs=1)
    drops = 0
    with Loader(recipe, execution=Execution(runner="inline", stall_drops=15)) as loader:
        while (rows := loader.next_rows()) is not None:
            drops += len(loader.last_meta.drops)
            assert rows
    assert drops > 2 * 15


def test_no_row_for_stall_seconds_logs_drop_counts(caplog):
    """Execution.stall_seconds: a lane making no row logs its drops by reason (and goes on)."""
    import logging

    from zephon_core import Loader, NoRowsError

    ex = Execution(runner="inline", stall_seconds=0.05, stall_drops=None)
    with caplog.at_level(logging.WARNING, logger="zephon_core.engine.loader"), \
            Loader(_all_long_recipe(_slow_long_doc), execution=ex) as loader, \
            pytest.raises(NoRowsError):  # the draw-count backstop ends it
        loader.next_rows()
    lines = [r.getMessage() for r in caplog.records if "no new row" in r.getMessage()]
    assert lines, "the watchdog logged nothing"
    assert "'over_length':" in lines[-1] and "lane 0:" in lines[-1] and "lane 1:" in lines[-1]


def test_stall_settings_are_checked():
    with pytest.raises(ConfigError, match="stall_seconds"):
        Execution(stall_seconds=0)
    with pytest.raises(ConfigError, match="stall_drops"):
        Execution(stall_drops=0)


@pytest.mark.parametrize("field, value", [("start_method", "bogus"), ("collate_in", "gpu"),
                                          ("runner", "cluster")])
def test_execution_choices_are_checked_from_their_declaration(field, value):
    """Each choice field is refused at construction, naming the allowed values its
    declaration lists (start_method was accepted and failed later, at the first start)."""
    from zephon_core.extend import flat_settings

    allowed = next(s.info.choices for s in flat_settings(Execution) if s.name == field)
    with pytest.raises(ConfigError, match=f"{field}.*{', '.join(allowed)}"):
        Execution(**{field: value})
