"""The driver's short cuts (issue 39) give what the long way gives: element keys with the
seed hashed once, and groups of pointers sent without a walk for arrays."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core.common.hashing import derive, derive_from
from zephon_core.engine import shm
from zephon_core.engine.lane_queues import element_key, element_keys
from zephon_core.records import Element, Origin, Pointer

ints = st.integers(0, 2**63)


@settings(max_examples=100, deadline=None)
@given(a=st.lists(ints, max_size=4), b=st.lists(ints, max_size=4))
def test_derive_from_continues_a_key(a, b):
    assert derive_from(derive(*a), *b) == derive(*a, *b)


@settings(max_examples=100, deadline=None)
@given(seed=ints, o=st.tuples(ints, st.integers(0, 9), ints, ints, st.integers(0, 9)))
def test_element_keys_are_element_key(seed, o):
    origin = Origin(*o)
    assert element_keys(seed)(origin) == element_key(seed, origin)


def test_a_group_of_pointers_is_sent_as_it_is_and_one_with_arrays_is_not():
    pointers = [Element(i, Pointer(0, 1, i), Origin(i, 0, 1, i, 0)) for i in range(8)]
    packed = shm.pack(pointers, "zephon-test-")
    assert packed.segment is None and packed.body is pointers
    big = np.arange(1 << 16, dtype=np.int64)
    mixed = [*pointers, Element(9, {"tokens": big}, Origin(9, 0, 1, 9, 0))]
    packed = shm.pack(mixed, "zephon-test-")
    try:
        assert packed.segment is not None or not shm.available()
        back = shm.unpack(packed)
        assert back[:8] == pointers and (back[8].payload["tokens"] == big).all()
    finally:
        shm.discard(packed)


def test_pipe_watch_reports_data_hang_ups_and_ended_processes():
    import multiprocessing as mp

    from zephon_core.engine.pipe_sender import PipeWatch

    watch = PipeWatch()
    a_r, a_w = mp.Pipe(duplex=False)
    b_r, b_w = mp.Pipe(duplex=False)
    assert watch.wait([a_r, b_r], 0.01) == []
    b_w.send_bytes(b"x")
    assert watch.wait([a_r, b_r], 1.0) == [b_r]
    b_r.recv_bytes()
    a_w.close()  # a hang-up is ready too, as for multiprocessing's wait
    assert watch.wait([a_r, b_r], 1.0) == [a_r]
    p = mp.get_context("fork").Process(target=int)
    p.start()
    p.join()
    assert watch.wait([b_r, p.sentinel], 1.0) == [p.sentinel]  # a new set: built again
    for c in (a_r, b_r, b_w):
        c.close()


def _nesting(obj) -> int:
    if isinstance(obj, dict):
        return 1 + max((_nesting(v) for v in obj.values()), default=0)
    if isinstance(obj, list):
        return 1 + max((_nesting(v) for v in obj), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(obj=json_values)
def test_json_depth_with_its_flat_record_short_cut(obj):
    from zephon_core.common.jsontext import depth

    assert depth(obj) == _nesting(obj)
