"""Work sources: datasets + seed + mixture -> a deterministic stream of origins per lane.

No I/O happens here. Each dataset has an *order*: for every epoch, its shards
are permuted, each shard's samples are permuted, and the concatenation is cut
into blocks whose order is permuted too (so a stream mixes shards at a coarse
grain while staying cheap to address). Position `p` of a dataset's order is
computed directly, so a lane's whole source state is a few counters.

Lane `l` takes positions `l, l + L, l + 2L, ...` of every dataset's order and
chooses which dataset to draw from next by a deficit rule over the mixture
weights: after `n` draws, dataset `j` has been drawn as close to `n * w_j` as
integers allow. The stream therefore depends on the data, the seed, the
weights and `L`, and on nothing else.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon_core.common.hashing import rng
from zephon_core.data.readers import ShardReader
from zephon_core.errors import ConfigError
from zephon_core.records import Origin


@dataclass
class Dataset:
    """A named dataset: a reader over its shards and a mixture weight."""

    name: str
    reader: ShardReader
    weight: float = 1.0

    def describe(self) -> dict:
        return {
            "name": self.name,
            "weight": self.weight,
            "shards": [self.reader.describe_shard(s) for s in range(self.reader.num_shards)],
        }


@dataclass(frozen=True)
class ShuffleSettings:
    """How a dataset's order is randomized each epoch."""

    shards: bool = True
    within_shard: bool = True
    block_size: int = 256

    def settings_dict(self) -> dict:
        return {"shards": self.shards, "within_shard": self.within_shard,
                "block_size": self.block_size}


class DatasetOrder:
    """Random access to the deterministic sample order of one dataset, over epochs."""

    def __init__(self, sizes: list[int], seed: int, dataset: int, shuffle: ShuffleSettings):
        if not sizes or sum(sizes) == 0:
            raise ConfigError(f"dataset {dataset} has no samples; check its shard paths")
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.total = int(self.sizes.sum())
        self.seed = seed
        self.dataset = dataset
        self.shuffle = shuffle
        self._cache: OrderedDict[tuple, Any] = OrderedDict()

    def _cached(self, key: tuple, make):
        found = self._cache.get(key)
        if found is None:
            found = make()
            self._cache[key] = found
            if len(self._cache) > 64:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return found

    def _shard_layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        def make():
            n = len(self.sizes)
            order = (rng(self.seed, self.dataset, epoch, 1).permutation(n)
                     if self.shuffle.shards else np.arange(n))
            ends = np.cumsum(self.sizes[order])
            return order, ends
        return self._cached(("layout", epoch), make)

    def _block_perm(self, epoch: int) -> np.ndarray | None:
        bs = self.shuffle.block_size
        if bs <= 0 or self.total // bs < 2:
            return None
        return self._cached(
            ("blocks", epoch),
            lambda: rng(self.seed, self.dataset, epoch, 2).permutation(self.total // bs),
        )

    def _within(self, epoch: int, shard: int) -> np.ndarray:
        return self._cached(
            ("within", epoch, shard),
            lambda: rng(self.seed, self.dataset, epoch, 3, shard).permutation(
                int(self.sizes[shard])),
        )

    def locate(self, position: int) -> tuple[int, int, int]:
        """`(shard, index, epoch)` of the `position`-th sample of this dataset's order."""
        epoch, offset = divmod(position, self.total)
        blocks = self._block_perm(epoch)
        if blocks is not None:
            bs = self.shuffle.block_size
            b, r = divmod(offset, bs)
            if b < len(blocks):
                offset = int(blocks[b]) * bs + r
        order, ends = self._shard_layout(epoch)
        slot = int(np.searchsorted(ends, offset, side="right"))
        shard = int(order[slot])
        local = offset - (int(ends[slot - 1]) if slot else 0)
        if self.shuffle.within_shard:
            local = int(self._within(epoch, shard)[local])
        return shard, local, epoch


@dataclass
class SourceState:
    """Everything a lane's source needs to resume: draws so far, per dataset."""

    draws: int = 0
    counts: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"draws": self.draws, "counts": list(self.counts)}

    @classmethod
    def from_json(cls, d: dict) -> SourceState:
        return cls(int(d["draws"]), [int(c) for c in d["counts"]])


class LaneSource:
    """The origin stream of one lane."""

    def __init__(self, orders: list[DatasetOrder], weights: list[float], lane: int,
                 num_lanes: int, epochs: int | None, state: SourceState | None = None):
        total = float(sum(weights))
        if total <= 0 or any(w < 0 for w in weights):
            raise ConfigError(f"mixture weights must be >= 0 with a positive sum, got {weights}")
        self.orders = orders
        self.weights = [w / total for w in weights]
        self.lane = lane
        self.num_lanes = num_lanes
        self.epochs = epochs
        self.state = state or SourceState(0, [0] * len(orders))
        self.exhausted = False

    def _choose(self) -> int:
        n = self.state.draws + 1
        deficits = [n * w - c for w, c in zip(self.weights, self.state.counts, strict=True)]
        return int(np.argmax(deficits))

    def next(self) -> Origin | None:
        """The next origin of this lane, or None at the end of the data."""
        if self.exhausted:
            return None
        j = self._choose()
        order = self.orders[j]
        position = self.state.counts[j] * self.num_lanes + self.lane
        if self.epochs is not None and position >= self.epochs * order.total:
            self.exhausted = True
            return None
        shard, index, epoch = order.locate(position)
        origin = Origin(self.state.draws, j, shard, index, epoch)
        self.state.counts[j] += 1
        self.state.draws += 1
        return origin
