"""The row decode reads a planned image's bytes where the planning worker left them in
shared memory (`SharedBytes`), not from a pickled copy; where they are gone, the lane
decodes the item itself; the batches are the same either way."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.helpers.vl import demo_samples_by_kind, make_recipe
from zephon_core import Execution, run_digests
from zephon_core.extend import SharedBytes, shared_bytes
from zephon_vl import write_shards
from zephon_vl.ops.decode_rows import DecodePlanned

PROCESSES = Execution(runner="processes", workers={"read": 1, "decode": 1, "tokenize": 1,
                                                   "decode_rows": 1})


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[str]:
    caps = demo_samples_by_kind(tmp_path_factory)["caption"][:12]
    out = tmp_path_factory.mktemp("by_place")
    return [str(p) for p in write_shards([{"__key__": f"s{i:02d}", **s}
                                          for i, s in enumerate(caps)], out,
                                         samples_per_shard=6)]


class Recording(DecodePlanned):
    """`DecodePlanned` that notes, in the lane, what form each item's bytes are sent in."""

    sent: list[str] = []

    def row_part(self, row):
        part = super().row_part(row)
        Recording.sent += [type(item.data).__name__ for item in part or ()]
        return part


class Gone(DecodePlanned):
    """`DecodePlanned` whose items are sent as places in a file that does not exist: what
    the row decode meets when the planning worker that held the bytes has ended."""

    def row_part(self, row):
        part = super().row_part(row)
        return None if part is None else [
            dataclasses.replace(item, data=SharedBytes("zephon-test-gone", 0, 1 << 10))
            for item in part]


def _digests(shards, row_op=None, execution=PROCESSES) -> list[str]:
    def factory():
        recipe = make_recipe(shards, num_lanes=2, global_batch_size=2, shuffle_buffer=4,
                             pack={"decode_after_pack": True})
        if row_op is not None:
            recipe = dataclasses.replace(recipe, row_ops=[row_op])
        return recipe
    return [r.sha256 for r in run_digests(factory, 1, 4, execution)]


def test_planned_bytes_go_to_the_row_decode_by_place_and_the_batches_stay(shards):
    Recording.sent = []
    by_place = _digests(shards, Recording())
    assert Recording.sent and set(Recording.sent) == {"SharedBytes"}
    inline = _digests(shards, execution=Execution(runner="inline"))
    assert len(by_place) == 4 and by_place == inline


def test_bytes_gone_before_the_row_decode_are_decoded_by_the_lane(shards):
    """The row worker cannot read the place it is sent; the lane decodes from its own view,
    and the batches are the same."""
    assert _digests(shards, Gone()) == _digests(shards, execution=Execution(runner="inline"))


def test_only_a_view_of_a_received_answer_is_named():
    """An array this process made, or a copy, has no place in a worker's memory to send;
    a place whose file is gone reads as None (the caller then uses its own bytes)."""
    plain = np.arange(1 << 14, dtype=np.uint8)
    assert shared_bytes(plain) is None
    assert shared_bytes(plain[8:]) is None
    assert SharedBytes("zephon-test-gone", 0, 16).read() is None
