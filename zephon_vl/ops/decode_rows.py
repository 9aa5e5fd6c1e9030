"""Decode the images and clips a finished row holds: a row transform after the packer.

With planning on (`DecodeVision(plan=True)`, the built-in VLM recipes), a
document reaches the packer with its items planned from their headers
(`PlannedItem`: encoded bytes and the patch grid), so the packer decides rows
from exact token counts while no pixel is decoded. `DecodePlanned` decodes
them once a row is made, in the worker pool, for the rows the loader asked for
only: nothing is decoded for a sample the packer refuses, and an open bin holds
encoded bytes, not pixels.

A planned item that fails to decode here (its header read, its pixels do not:
a truncated or scrambled JPEG body, a grid unlike the header's) cannot leave
its row without moving every later sample. The policy, the same at every `D`,
runner and resume: the item becomes a black image of the planned size
(`PlannedItem.blank`: every pixel 0 before normalization), the sample's targets
are masked (its tokens stay in the row, none is a label), and the sample is
recorded as a drop with reason ``decode_failed_after_plan``, the decode's own
reason and place in its detail.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from zephon_core import BadSampleError
from zephon_core.extend import Row, RowTransform, Segment
from zephon_vl.media.planned import PlannedItem

#: the drop reason of a sample whose planned item failed to decode after its row closed
DECODE_FAILED = "decode_failed_after_plan"


class DecodePlanned(RowTransform):
    """Each segment's planned items in ``payload["pixel_values"]`` -> their patch rows.

    Not in the fingerprint (`fingerprinted`): its rows are the ones the collate's own
    decode of a planned item would make, so a checkpoint written without it restores.
    """

    default_runner = "processes"
    fingerprinted = False

    def __init__(self, name: str = "decode_rows") -> None:
        self.name = name

    def process_rows(self, rows: list[Row]) -> list[Row]:
        return [self.decode_row(r) for r in rows]

    def decode_row(self, row: Row) -> Row:
        """`row` with its planned items decoded (a new row; `row` is left as it was)."""
        segments: list[Segment] = []
        drops, details = list(row.drops), list(row.drop_details)
        details += [""] * (len(drops) - len(details))
        changed = False
        for seg in row.segments:
            payload = seg.payload
            items = payload.get("pixel_values") if isinstance(payload, dict) else None
            if not items or not any(isinstance(v, PlannedItem) for v in items):
                segments.append(seg)
                continue
            pixels, failure = decode_items(items)
            new = {**payload, "pixel_values": pixels}
            if failure is not None:
                new["targets"] = np.zeros(len(payload["tokens"]), dtype=bool)
                if seg.start == 0:  # a document cut over rows is dropped once
                    drops.append((seg.origin, DECODE_FAILED))
                    details.append(failure)
            segments.append(dataclasses.replace(seg, payload=new))
            changed = True
        if not changed:
            return row
        return dataclasses.replace(row, segments=segments, drops=drops, drop_details=details)


def decode_items(items: list[Any]) -> tuple[list[np.ndarray], str | None]:
    """A payload's ``pixel_values`` with the planned items decoded, and what failed (None:
    nothing): an item that fails is its black blank, the sample's other items decode."""
    out: list[np.ndarray] = []
    failure: str | None = None
    for v in items:
        if not isinstance(v, PlannedItem):
            out.append(v)
            continue
        try:
            out.append(v.decode().pixel_values)
        except BadSampleError as exc:
            out.append(v.blank().pixel_values)
            if failure is None:
                failure = f"{exc.reason} at {exc.where}" + (f": {exc.detail}"
                                                            if exc.detail else "")
    return out, failure
