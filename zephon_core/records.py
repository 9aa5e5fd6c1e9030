"""The small records that flow through a lane: pointers, element identities, drops."""

from __future__ import annotations

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


class Element(NamedTuple):
    """What a transform sees: a per-element key (for randomness), the payload, its origin."""

    key: int
    payload: Any
    origin: Origin | None = None
