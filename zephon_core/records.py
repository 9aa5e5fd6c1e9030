"""The small records that flow through a lane: pointers, element identities, drops."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple


class Pointer(NamedTuple):
    """The address of a sample: no payload."""

    dataset: int
    shard: int
    index: int


class Origin(NamedTuple):
    """Identity of one element of a lane's stream.

    `seq` is its position in the lane's source stream (unique within the lane);
    `epoch` tells repetitions of the same pointer apart. Origins are what a
    checkpoint stores: any payload can be recomputed from its origin.
    """

    seq: int
    dataset: int
    shard: int
    index: int
    epoch: int

    @property
    def pointer(self) -> Pointer:
        return Pointer(self.dataset, self.shard, self.index)

    def where(self) -> str:
        return f"dataset {self.dataset} shard {self.shard} index {self.index} (epoch {self.epoch})"


@dataclass(frozen=True)
class Dropped:
    """Returned by a transform instead of an element: the element leaves the stream, recorded."""

    reason: str
    detail: str = ""


#: memory addresses in exception texts (``<_io.BytesIO object at 0x7f...>``): the one part
#: of a drop's detail that differs between processes and runs
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")
#: the longest drop detail kept (a ledger line stays small; the reason says the kind)
DETAIL_CHARS = 200


def drop_detail(text: str) -> str:
    """A drop's detail as the ledger records it: the same text on every rank count,
    runner and run (addresses masked, at most `DETAIL_CHARS` characters)."""
    text = _ADDRESS.sub("0x...", str(text))
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS - 3] + "..."


class Element(NamedTuple):
    """What a transform sees: a per-element key (for randomness), the payload, its origin."""

    key: int
    payload: Any
    origin: Origin | None = None
