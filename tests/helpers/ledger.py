"""Where every element of a finite run ended up (guarantee 5), checked against its content.

`lane_streams` recomputes each lane's origin stream from the work source
alone; a `Ledger` collects the rows, drops and undelivered remainder a run
reported; `check_ledger` asserts that each origin is in row segments that tile
its tokens, or in exactly one drop with the reason its content calls for, or
in the remainder.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tests.helpers.core import Spec, build_recipe, keep, make_shards
from zephon_core import Origin
from zephon_core.data.sources import DatasetOrder, LaneSource

if TYPE_CHECKING:
    from zephon_core import Drained


def lane_streams(spec: Spec, limit: int | None = None) -> dict[int, list[Origin]]:
    """Each lane's origin stream, recomputed from the work source alone (at most `limit`
    origins per lane: endless data has no end)."""
    recipe = build_recipe(spec)
    orders = [DatasetOrder([d.reader.shard_len(s) for s in range(d.reader.num_shards)],
                           recipe.seed, j, recipe.shuffle)
              for j, d in enumerate(recipe.datasets)]
    out = {}
    for lane in range(spec.num_lanes):
        src = LaneSource(orders, [d.weight for d in recipe.datasets], lane, spec.num_lanes,
                         spec.epochs)
        stream = []
        while (limit is None or len(stream) < limit) and (o := src.next()) is not None:
            stream.append(o)
        out[lane] = stream
    return out


@dataclass
class Ledger:
    """Where each origin of each lane ended up."""

    segments: dict[tuple[int, Origin], list[tuple[int, int]]] = field(
        default_factory=lambda: defaultdict(list))
    drops: dict[tuple[int, Origin], list[str]] = field(default_factory=lambda: defaultdict(list))
    remainder: set[tuple[int, Origin]] = field(default_factory=set)
    row_tokens: list[int] = field(default_factory=list)

    def add_rows(self, lanes: list[int], rows: list, r: int) -> None:
        for i, row in enumerate(rows):
            lane = lanes[i // r]
            self.row_tokens.append(sum(e - s for _, s, e in row))
            for origin, s, e in row:
                self.segments[(lane, Origin(*origin))].append((s, e))

    def add_drops(self, lane_of_seq: dict[Origin, int], drops: list) -> None:
        for origin, reason in drops:
            self.drops[(lane_of_seq[Origin(*origin)], Origin(*origin))].append(reason)

    def add_drained(self, drained: Drained, lane_of_seq: dict[Origin, int]) -> None:
        """What `Loader.drain` returned: rows (with their lanes) and drops."""
        for lane, row in zip(drained.lanes, drained.rows, strict=True):
            self.row_tokens.append(row.num_tokens)
            for seg in row.segments:
                self.segments[(lane, seg.origin)].append((seg.start, seg.end))
        self.add_drops(lane_of_seq, drained.drops)


def expected_fate(spec: Spec, o: Origin) -> tuple[str, int]:
    """('drop:<reason>' or 'rows', tokens expected in rows) from the document itself."""
    doc = make_shards(spec.datasets[o.dataset], o.dataset)[o.shard][o.index]
    n = doc["n"]
    if doc.get("bad"):
        return "drop:corrupt_doc", 0
    if spec.use_filter and not keep(doc):
        return "drop:filtered", 0
    if n == 0:
        return "drop:empty", 0
    if n > spec.seq_len:
        if spec.overlong == "drop":
            return "drop:over_length", 0
        if spec.overlong == "truncate":
            return "rows", spec.seq_len
    return "rows", n


def check_ledger(spec: Spec, streams: dict[int, list[Origin]], ledger: Ledger) -> None:
    assert all(0 < t <= spec.seq_len for t in ledger.row_tokens), "a row exceeds seq_len"
    everything = {(lane, o) for lane, s in streams.items() for o in s}
    seen = set(ledger.segments) | set(ledger.drops) | ledger.remainder
    assert not seen - everything, f"not in any lane stream: {sorted(seen - everything)[:5]}"
    lost = everything - seen
    assert not lost, f"{len(lost)} origins neither in a row nor dropped, e.g. {sorted(lost)[:5]}"
    for key in everything:
        lane, o = key
        if key in ledger.remainder:
            continue  # not delivered: the end of the data
        fate, tokens = expected_fate(spec, o)
        if fate == "rows":
            assert key not in ledger.drops, (key, ledger.drops[key])
            spans = sorted(ledger.segments[key])
            assert spans[0][0] == 0 and spans[-1][1] == tokens, (key, spans, tokens)
            for (_, e), (s, _) in zip(spans, spans[1:], strict=False):
                assert e == s, f"segments of {key} do not tile [0, {tokens}): {spans}"
        else:
            assert key not in ledger.segments, (key, fate, ledger.segments[key])
            assert ledger.drops[key] == [fate.removeprefix("drop:")], (key, ledger.drops[key])


def owners(streams: dict[int, list[Origin]]) -> dict[Origin, int]:
    owner = {o: lane for lane, s in streams.items() for o in s}
    assert len(owner) == sum(len(s) for s in streams.values()), "origin in two lanes"
    return owner
