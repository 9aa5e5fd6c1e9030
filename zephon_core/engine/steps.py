"""What a step is (its rows, snapshots and `StepMeta`) and how its rows become a batch."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zephon_core.ops.contract import Row
from zephon_core.records import Origin

#: the loader's logger: its warnings were written there before steps had their own module
log = logging.getLogger("zephon_core.engine.loader")


@dataclass
class StepMeta:
    """What a step's local batch is made of: its rows' segments and the drops decided with them."""

    step: int
    lanes: list[int]
    rows: list[list[tuple[Origin, int, int]]]
    drops: list[tuple[Origin, str]] = field(default_factory=list)
    #: with sample digests on: this rank's lanes' ledger entries (`ledger.lane_entries`)
    ledger: dict[int, dict] | None = None
    #: seconds spent collating this step (0 until it is collated; never part of equality)
    collate_s: float = field(default=0.0, compare=False)

    @property
    def tokens(self) -> int:
        return sum(e - s for row in self.rows for _, s, e in row)


@dataclass
class Step:
    """A step the lanes made: its rows, the lanes' snapshots after it, what it holds."""

    rows: list[Row]
    snapshots: dict[int, dict]
    meta: StepMeta


@dataclass
class Drained:
    """What `Loader.drain` took out of this rank's lanes; none of it was delivered before.

    ``rows``: every row the lanes made and no step delivered, lane by lane in
    lane order, each lane's rows in its order; ``lanes[i]`` is the lane of
    ``rows[i]``. ``drops``: every drop no `StepMeta` reported, lane by lane:
    those each row carries (``row.drops``, decided before it) and then those
    decided after the lane's last row.
    """

    rows: list[Row]
    lanes: list[int]
    drops: list[tuple[Origin, str]]
    #: the lane of each drop, and its detail (`zephon_core.records.drop_detail`; "" if none)
    drop_lanes: list[int] = field(default_factory=list)
    drop_details: list[str] = field(default_factory=list)


def lane_drops(rows: list[Row], after: Any, details: dict[Origin, str]
               ) -> list[tuple[tuple[Origin, str], str]]:
    """A lane's drops no step reported, each with its detail: those `rows` carry (their
    ``drop_details``), then those decided `after` its last row (`details` from the
    lane's snapshot)."""
    out = [(d, row.drop_details[k] if k < len(row.drop_details) else "")
           for row in rows for k, d in enumerate(row.drops)]
    return out + [(d, details.get(d[0], "")) for d in after]


_pin_warned = False


def collate_rows(collate: Callable[..., Any], rows: list[Row], pin: bool) -> Any:
    """`collate(rows)`; with `pin`, its tensors in page-locked memory: written there
    directly by a collate that takes ``pin_memory`` (``collate.pins``), else copied."""
    if not pin:
        return collate(rows)
    import torch

    if not torch.cuda.is_available():
        global _pin_warned
        if not _pin_warned:
            _pin_warned = True
            log.warning("zephon: Execution(pin_memory=True) but torch sees no CUDA device; "
                        "batches stay in pageable memory")
        return collate(rows)
    if getattr(collate, "pins", False):
        return collate(rows, pin_memory=True)
    batch = collate(rows)
    if isinstance(batch, dict):
        return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v
                for k, v in batch.items()}
    return batch.pin_memory() if isinstance(batch, torch.Tensor) else batch
