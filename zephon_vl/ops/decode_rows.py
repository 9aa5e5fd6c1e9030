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
reason and place in its detail. With the recipe's ``on_error="raise"`` the run stops
instead, naming the sample and the decode's reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from zephon_core import BadSampleError
from zephon_core.extend import Row, RowTransform, Segment, check_on_error
from zephon_vl.media.planned import PlannedItem

#: the drop reason of a sample whose planned item failed to decode after its row closed
DECODE_FAILED = "decode_failed_after_plan"


class DecodePlanned(RowTransform):
    """Each segment's planned items in ``payload["pixel_values"]`` -> their patch rows.

    Not in the fingerprint (`fingerprinted`): its rows are the ones the collate's own
    decode of a planned item would make, so a checkpoint written without it restores.
    `on_error` is the recipe's bad-input policy: ``drop`` keeps the sample's place (a
    black image, no labels, a recorded drop), ``raise`` stops the run naming it.
    """

    default_runner = "processes"
    fingerprinted = False

    def __init__(self, name: str = "decode_rows", on_error: str = "drop") -> None:
        self.name = name
        self.on_error = check_on_error(on_error)

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
            if failure is not None and self.on_error == "raise":
                raise BadSampleError(
                    failure.reason, f"{failure.where} [{seg.origin.where()}]",
                    (failure.detail + "; " if failure.detail else "") + f"raised in operator "
                    f"{self.name!r} after the packer; set on_error='drop' to record such "
                    "samples (their row keeps a black image and no labels)")
            new = {**payload, "pixel_values": pixels}
            if failure is not None:
                new["targets"] = np.zeros(len(payload["tokens"]), dtype=bool)
                if seg.start == 0:  # a document cut over rows is dropped once
                    drops.append((seg.origin, DECODE_FAILED))
                    details.append(f"{failure.reason} at {failure.where}"
                                   + (f": {failure.detail}" if failure.detail else ""))
            segments.append(dataclasses.replace(seg, payload=new))
            changed = True
        if not changed:
            return row
        return dataclasses.replace(row, segments=segments, drops=drops, drop_details=details)


def decode_items(items: list[Any]) -> tuple[list[np.ndarray], BadSampleError | None]:
    """A payload's ``pixel_values`` with the planned items decoded, and the first failure
    (None: none): an item that fails is its black blank, the sample's other items decode."""
    out: list[np.ndarray] = []
    failure: BadSampleError | None = None
    for v in items:
        if not isinstance(v, PlannedItem):
            out.append(v)
            continue
        try:
            out.append(v.decode().pixel_values)
        except BadSampleError as exc:
            out.append(v.blank().pixel_values)
            if failure is None:
                failure = exc
    return out, failure
