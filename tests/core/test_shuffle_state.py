"""The shuffle buffer's state (issue 39): kept as the lane's snapshots read it, not rebuilt
at every step, and still exactly the buffer's origins, in the buffer's order; a restored
buffer continues as the original does; a state a loader hands out is the caller's own."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import Execution, Loader, text_demo
from zephon_core.ops.shuffle import Shuffle
from zephon_core.records import Origin


def _origin(i: int) -> Origin:
    return Origin(i, i % 3, i % 5, i * 7, i // 11)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 12), seed=st.integers(0, 2**32), lane=st.integers(0, 7),
       pushes=st.integers(0, 60), cut=st.integers(0, 60))
def test_state_lists_the_buffer_and_a_restore_continues_alike(size, seed, lane, pushes, cut):
    op = Shuffle(size)
    buf = op.make(lane, seed)
    out, restored = [], None
    for i in range(pushes):
        if i == min(cut, pushes):
            state = buf.state()
            assert state == {"emitted": buf.emitted,
                             "buffer": [list(o) for o, _ in buf.buffer]}
            restored = op.make(lane, seed)
            restored.restore(state, lambda origins: [("p", o.seq) for o in origins])
            assert restored.buffer == buf.buffer
        out += buf.push((_origin(i), ("p", i)))
        if restored is not None:
            restored.push((_origin(i), ("p", i)))
            assert restored.state() == buf.state()
    out += buf.flush()
    assert buf.state() == {"emitted": pushes, "buffer": []}
    assert sorted(o.seq for o, _ in out) == list(range(pushes))


def test_a_state_handed_out_is_the_callers_own():
    loader = Loader(text_demo(num_lanes=2, global_batch_size=2, seq_len=128), 0, 1,
                    Execution(runner="inline"))
    try:
        next(loader)
        first = loader.state_dict()
        buffer = first["lanes"]["0"]["accumulators"]["0"]["buffer"]
        assert buffer, "the demo's shuffle holds origins after a step"
        kept = [list(o) for o in buffer]
        for o in buffer:  # a caller editing its state in place ...
            o[0] = 10**9
        buffer.clear()
        again = loader.state_dict()  # ... changes neither the loader's next state
        assert again["lanes"]["0"]["accumulators"]["0"]["buffer"] == kept
        next(loader)  # nor what the lane holds
        assert all(o[0] < 10**9 for o in
                   loader.state_dict()["lanes"]["0"]["accumulators"]["0"]["buffer"])
    finally:
        loader.close()
