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
