"""`Packer`'s open-row choice (issue 39): a document that costs only tokens, in a packer
without a row filler, is placed by integer arithmetic (`_pick_by_tokens`) instead of the
general cost check. Both must choose the same row, so every row is the same."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import Pack
from zephon_core.ops.pack import Packer, _Bin
from zephon_core.records import Origin


class GeneralPacker(Packer):
    """The reference: every choice through the general cost check."""

    def _pick(self, costs: dict[str, int]) -> int | None:
        return self._pick_by_costs(costs)


def _doc(n: int, costs: dict[str, int] | None = None) -> dict:
    out: dict = {"tokens": np.arange(n, dtype=np.int32)}
    if costs:
        out["costs"] = costs
    return out


def _rows(packer: Packer, docs: list[dict]) -> list[list[tuple[int, int, int]]]:
    rows = []
    for i, d in enumerate(docs):
        packer.push(Origin(i, 0, 0, i, 0), d)
        while (row := packer.pop_row()) is not None:
            rows.append([(s.origin.seq, s.start, s.end) for s in row.segments])
    packer.flush()
    while (row := packer.pop_row()) is not None:
        rows.append([(s.origin.seq, s.start, s.end) for s in row.segments])
    return rows


@settings(max_examples=150, deadline=None)
@given(seq_len=st.integers(2, 64), bins=st.integers(1, 6),
       mode=st.sampled_from(["best_fit", "first_fit"]),
       overlong=st.sampled_from(["split", "truncate", "drop"]),
       lengths=st.lists(st.integers(0, 80), max_size=60),
       costly=st.sets(st.integers(0, 59), max_size=10))
def test_rows_equal_the_general_choice(seq_len, bins, mode, overlong, lengths, costly):
    op = Pack(seq_len, {"pack_mode": mode, "max_open_bins": bins, "overlong": overlong},
              limits={"images": 2})
    # some documents carry another cost: open rows then hold more than tokens, and the
    # documents after them that cost only tokens still take the fast choice
    docs = [_doc(n, {"images": 1} if i in costly else None) for i, n in enumerate(lengths)]
    assert _rows(Packer(op), docs) == _rows(GeneralPacker(op), docs)


@settings(max_examples=150, deadline=None)
@given(seq_len=st.integers(2, 64), mode=st.sampled_from(["best_fit", "first_fit"]),
       used=st.lists(st.integers(0, 63), max_size=6), n=st.integers(1, 64))
def test_the_chosen_open_row_is_the_general_choice(seq_len, mode, used, n):
    packer = Packer(Pack(seq_len, {"pack_mode": mode, "max_open_bins": 8}))
    packer.bins = [_Bin([], {"tokens": min(u, seq_len - 1)}) for u in used]
    assert packer._pick_by_tokens(n) == packer._pick_by_costs({"tokens": n})  # noqa: SLF001
