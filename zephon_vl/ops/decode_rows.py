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
from collections.abc import Iterator

import numpy as np

from zephon_core import BadSampleError
from zephon_core.extend import Row, RowTransform, Segment, check_on_error
from zephon_vl.media.planned import BytesGone, PlannedItem

#: the drop reason of a sample whose planned item failed to decode after its row closed
DECODE_FAILED = "decode_failed_after_plan"


#: where a planned item sits in its row: (segment, place in the segment's items)
Place = tuple[int, int]


class DecodePlanned(RowTransform):
    """Each segment's planned items in ``payload["pixel_values"]`` -> their patch rows.

    The runner is sent a row's planned items only (`row_part`), each with where its bytes
    lie in the planning worker's shared memory (`PlannedItem.to_send`: one copy where
    pickling the bytes made four), and answers each item's patch rows; the lane puts them
    in the row (`row_from`), decoding itself an item whose bytes were gone (the worker
    that held them had ended). Not in the fingerprint (`fingerprinted`): its rows are the ones the
    collate's own decode of a planned item would make, so a checkpoint written without
    it restores. `on_error` is the recipe's bad-input policy: ``drop`` keeps the
    sample's place (a black image, no labels, a recorded drop), ``raise`` stops the run
    naming it.
    """

    default_runner = "processes"
    fingerprinted = False

    def __init__(self, name: str = "decode_rows", on_error: str = "drop") -> None:
        self.name = name
        self.on_error = check_on_error(on_error)

    def row_part(self, row: Row) -> list[PlannedItem] | None:
        """The row's planned items (None: it holds none, so it needs no trip)."""
        return [item.to_send() for _, item in planned_places(row)] or None

    def process_rows(self, rows: list[list[PlannedItem]]) -> list[list[Decoded | None]]:
        return [[decode_item(item) for item in items] for items in rows]

    def row_from(self, row: Row, result: list[Decoded | None]) -> Row:
        """`row` with its planned items replaced by their patch rows (a new row; `row` is
        left as it was), the failures handled by `on_error`; an item the runner could not
        read (None) is decoded here, from the lane's own view of its bytes."""
        decoded: dict[int, dict[int, Decoded]] = {}
        for ((i, j), item), got in zip(planned_places(row), result, strict=True):
            decoded.setdefault(i, {})[j] = decode_item(item) if got is None else got
        if not decoded:
            return row
        segments: list[Segment] = []
        drops, details = list(row.drops), list(row.drop_details)
        details += [""] * (len(drops) - len(details))
        for i, seg in enumerate(row.segments):
            if i not in decoded:
                segments.append(seg)
                continue
            items = seg.payload["pixel_values"]
            got = decoded[i]
            pixels = [got[j][0] if j in got else v for j, v in enumerate(items)]
            failure = next((f for j in sorted(got) if (f := got[j][1]) is not None), None)
            new = {**seg.payload, "pixel_values": pixels}
            if failure is not None:
                if self.on_error == "raise":
                    raise BadSampleError(
                        failure.reason, f"{failure.where} [{seg.origin.where()}]",
                        (failure.detail + "; " if failure.detail else "") + "raised in "
                        f"operator {self.name!r} after the packer; set on_error='drop' to "
                        "record such samples (their row keeps a black image and no labels)")
                new["targets"] = np.zeros(len(seg.payload["tokens"]), dtype=bool)
                if seg.start == 0:  # a document cut over rows is dropped once
                    drops.append((seg.origin, DECODE_FAILED))
                    details.append(f"{failure.reason} at {failure.where}"
                                   + (f": {failure.detail}" if failure.detail else ""))
            segments.append(dataclasses.replace(seg, payload=new))
        return dataclasses.replace(row, segments=segments, drops=drops, drop_details=details)


#: an item's patch rows, and the decode's failure (None: none; the rows are then the blank)
Decoded = tuple[np.ndarray, BadSampleError | None]


def planned_places(row: Row) -> Iterator[tuple[Place, PlannedItem]]:
    """The planned items of `row`'s segments, in order, with their places."""
    for i, seg in enumerate(row.segments):
        payload = seg.payload
        items = payload.get("pixel_values") if isinstance(payload, dict) else None
        for j, v in enumerate(items or ()):
            if isinstance(v, PlannedItem):
                yield (i, j), v


def decode_item(item: PlannedItem) -> Decoded | None:
    """The item's patch rows, or its black blank and the failure where the decode fails;
    None where its bytes were sent by place and are gone (`BytesGone`)."""
    try:
        return item.decode().pixel_values, None
    except BadSampleError as exc:
        return item.blank().pixel_values, exc
    except BytesGone:
        return None
