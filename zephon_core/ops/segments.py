"""The checkpoint form of a combiner's segments, written, read and checked in one place.

A segment is saved as ``[seq, dataset, shard, index, epoch, start, end]``:
its element's origin and the token slice it places in a row, never its
payload (payloads are recomputed from origins on restore). Every combiner
saves its open and ready rows this way, so a lane-count change
(`engine.relane`) can deal rows between lanes without knowing the combiner.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from zephon_core.ops.contract import Recompute, Segment, StateChecks
from zephon_core.records import Origin

#: a saved segment: five origin fields, then start and end
WIDTH = 7


def encode_segments(segments: Iterable[Segment]) -> list[list[int]]:
    """Segments as JSON rows (origin and slice; the payload is left out)."""
    return [[*s.origin, s.start, s.end] for s in segments]


def decode_segments(groups: list[list[list[int]]], recompute: Recompute) -> list[list[Segment]]:
    """Saved groups of segments back as segments, in the same groups and order.

    Each element's payload is recomputed once (`recompute`, in order of first
    appearance), even when several segments (a split document) share it.
    """
    origins: dict[int, Origin] = {}
    for group in groups:
        for r in group:
            origins.setdefault(int(r[0]), Origin(*r[:5]))
    payloads = dict(zip(origins, recompute(list(origins.values())), strict=True))
    return [[Segment(Origin(*r[:5]), payloads[int(r[0])], int(r[5]), int(r[6])) for r in group]
            for group in groups]


def segment_origins(groups: Iterable[Iterable[Segment]]) -> list[Origin]:
    """The elements that segments in `groups` hold, each once, in order of first appearance."""
    seen: dict[int, Origin] = {}
    for segments in groups:
        for seg in segments:
            seen.setdefault(seg.origin.seq, seg.origin)
    return list(seen.values())


def check_segment(key: str, seg: Any, checks: StateChecks) -> int:
    """Refuse a saved segment that is not ``[origin..., start, end]``; returns its tokens."""
    if not (isinstance(seg, list) and len(seg) == WIDTH):
        raise checks.fail(key, "holds a segment that is not [origin..., start, end]")
    checks.origin(key, seg[:5])
    start, end = seg[5], seg[6]
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end):
        raise checks.fail(key, f"holds a segment [{start}, {end})")
    return end - start


def check_segment_row(key: str, row: Any, checks: StateChecks, seq_len: int,
              allow_empty: bool = True) -> None:
    """Refuse a saved row that is not a list of segments or holds more than `seq_len` tokens."""
    if not isinstance(row, list) or not (allow_empty or row):
        raise checks.fail(key, "holds a row that is not a list of segments")
    used = sum(check_segment(key, seg, checks) for seg in row)
    if used > seq_len:
        raise checks.fail(key, f"holds a row of {used} tokens, more than seq_len={seq_len}")
