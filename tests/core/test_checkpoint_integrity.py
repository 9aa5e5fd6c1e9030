"""Guarantee 9: a damaged checkpoint is refused at load, never accepted with other batches.

Random bit flips and digit edits of the saved file, and plausible field edits
of the state (counters off by one, lanes swapped or copied, `source_done`
set), must all raise `CheckpointError` when the state is read or restored:
never another exception, never a restore that goes on with different data.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.core import DataSpec, Spec, World, build_recipe
from zephon_core import CheckpointError, Loader, load_state, save_state
from zephon_core.engine.state_check import MAX_DEPTH, parse_state

SPEC = Spec(datasets=(DataSpec((12, 7, 20), data_seed=1), DataSpec((5, 9), weight=0.5)),
            num_lanes=4, rows_per_lane=2, shuffle_pos="payloads", seq_len=32)


@pytest.fixture(scope="module")
def state() -> dict:
    with World(SPEC, 2) as w:
        w.digests(3)
        return w.state()


@pytest.fixture(scope="module")
def loader():
    with Loader(build_recipe(SPEC), 0, 1) as one:
        yield one


def _refused(loader: Loader, load) -> None:
    """`load()` gives a state (or raises); restoring it must raise CheckpointError only."""
    with pytest.raises(CheckpointError):
        loader.load_state_dict(load())


def test_intact_state_restores(state, loader) -> None:
    loader.load_state_dict(json.loads(json.dumps(state)))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_bit_flips_are_refused(tmp_path_factory, state, loader, data) -> None:
    path = tmp_path_factory.mktemp("flip") / "state.json"
    save_state(state, path)
    raw = bytearray(path.read_bytes())
    flips = data.draw(st.sets(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 7)),
                              min_size=1, max_size=3))
    for i, bit in flips:
        raw[i] ^= 1 << bit
    path.write_bytes(bytes(raw))
    _refused(loader, lambda: load_state(path))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_digit_edits_are_refused(tmp_path_factory, state, loader, data) -> None:
    path = tmp_path_factory.mktemp("digit") / "state.json"
    save_state(state, path)
    text = path.read_text()
    digits = [m.start() for m in re.finditer(r"\d", text)]
    i = data.draw(st.sampled_from(digits))
    new = data.draw(st.sampled_from([d for d in "0123456789" if d != text[i]]))
    path.write_text(text[:i] + new + text[i + 1:])
    _refused(loader, lambda: load_state(path))


def _edit(state: dict, fn) -> dict:
    copy = json.loads(json.dumps(state))
    fn(copy)
    return copy


def _bump(path: list, delta: int):
    def fn(s: dict) -> None:
        node = s
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] += delta
    return fn


def _swap(s: dict) -> None:
    s["lanes"]["0"], s["lanes"]["1"] = s["lanes"]["1"], s["lanes"]["0"]


def _copy(s: dict) -> None:
    s["lanes"]["2"] = json.loads(json.dumps(s["lanes"]["1"]))


def _relabelled_swap(s: dict) -> None:
    _swap(s)
    s["lanes"]["0"]["lane"], s["lanes"]["1"]["lane"] = 0, 1


EDITS = {
    "draws +1": _bump(["lanes", "1", "source", "draws"], 1),
    "draws -1 and a count -1": lambda s: (_bump(["lanes", "1", "source", "draws"], -1)(s),
                                          _bump(["lanes", "1", "source", "counts", 0], -1)(s)),
    "a count +1 and draws +1": lambda s: (_bump(["lanes", "0", "source", "draws"], 1)(s),
                                          _bump(["lanes", "0", "source", "counts", 1], 1)(s)),
    "rows +1": _bump(["lanes", "3", "rows"], 1),
    "step +1": _bump(["step"], 1),
    "source_done set": lambda s: s["lanes"]["2"].__setitem__("source_done", True),
    "lanes swapped": _swap,
    "lanes swapped and relabelled": _relabelled_swap,
    "lane copied": _copy,
    "a drop counter": lambda s: s["lanes"]["0"]["dropped"].__setitem__("filtered", 99),
}


@pytest.mark.parametrize("edit", list(EDITS), ids=list(EDITS))
def test_plausible_field_edits_are_refused(state, loader, edit) -> None:
    _refused(loader, lambda: _edit(state, EDITS[edit]))


def test_deep_nesting_and_huge_files_are_refused(tmp_path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(CheckpointError, match="deep"):
        load_state(deep)
    with pytest.raises(CheckpointError, match="deep"):
        parse_state("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "inline")
    with pytest.raises(CheckpointError, match="not a zephon checkpoint"):
        parse_state(b" " * (300 << 20), "huge.json")


def test_merging_refuses_a_damaged_rank_state(state) -> None:
    from zephon_core import merge_states

    damaged = _edit(state, _bump(["lanes", "1", "source", "draws"], 1))
    with pytest.raises(CheckpointError, match="SHA-256"):
        merge_states([state, damaged])
