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

After a lane-count change on resume (`engine.relane`), a lane's stream of each
dataset is an explicit list of positions (the old lanes' leftovers dealt to
it) followed by an arithmetic progression of stride `L2`, and the lane first
draws the samples the old lanes held (`Relaned`). See docs/elastic-changes.md.

With a mixture schedule (`Phase`s), the lane's draws are cut into phases at
draw counts the lane decides deterministically (`engine.phases`); within a
phase the deficit rule runs over that phase's weights and draws only, so each
phase's mixture is exact from its first draw. See docs/elastic-changes.md.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon_core.common.hashing import rng
from zephon_core.common.settings import setting
from zephon_core.data.readers import ShardReader
from zephon_core.errors import ConfigError
from zephon_core.records import Origin


@dataclass
class Dataset:
    """A named dataset: a reader over its shards and a mixture weight."""

    name: str
    reader: ShardReader
    weight: float = 1.0
    #: the format its records are read as (``llava``, ``webdataset``...; "" when built
    #: from a reader alone); not part of `identity`, so no fingerprint depends on it
    format: str = ""

    def identity(self) -> dict:
        """What a checkpoint fingerprint records about this dataset: name, weight and
        every shard's `ShardReader.shard_identity`."""
        return {
            "name": self.name,
            "weight": self.weight,
            "shards": [self.reader.shard_identity(s) for s in range(self.reader.num_shards)],
        }


@dataclass(frozen=True)
class ShuffleSettings:
    """How a dataset's order is randomized each epoch (a recipe's ``[shuffle]``)."""

    shards: bool = setting(True, help="visit the shards in a new random order each epoch")
    within_shard: bool = setting(True, help="permute the samples inside each shard each "
                                 "epoch")
    block_size: int = setting(
        256, unit="samples", help="cut the epoch's sequence into blocks of this many samples "
        "and permute the blocks, so a lane's stream mixes shards at a coarse grain (0: off)")

    def settings(self) -> dict:
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

    def _shard_layout(self, epoch: int) -> tuple[list[int], list[int]]:
        def make():
            n = len(self.sizes)
            order = (rng(self.seed, self.dataset, epoch, 1).permutation(n)
                     if self.shuffle.shards else np.arange(n))
            # Python lists: one sample's lookup is a bisect and two items, and numpy's
            # per-call cost on arrays this small is most of a draw's time in the driver
            ends = np.cumsum(self.sizes[order])
            return order.tolist(), ends.tolist()
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
        slot = bisect.bisect_right(ends, offset)
        shard = order[slot]
        local = offset - (ends[slot - 1] if slot else 0)
        if self.shuffle.within_shard:
            local = int(self._within(epoch, shard)[local])
        return shard, local, epoch


@dataclass(frozen=True)
class Phase:
    """From global step `start_step` on, the mixture is `weights` (by dataset name) and,
    if set, the global batch size is `global_batch_size` rows.

    A dataset the phase does not name weighs 0 in it: it is not drawn (a
    dataset added later weighs 0 before its phase; a removed one, 0 after).
    `weights=None` keeps the mixture (and its phase) going: only `G` changes.
    """

    start_step: int
    weights: Mapping[str, float] | None = None
    global_batch_size: int | None = None

    def __hash__(self) -> int:
        return hash((self.start_step, tuple(sorted((self.weights or {}).items())),
                     self.global_batch_size))

    def settings(self) -> dict:
        out: dict[str, Any] = {"start_step": self.start_step}
        if self.weights is not None:
            out["weights"] = {k: float(v) for k, v in sorted(self.weights.items())}
        if self.global_batch_size is not None:
            out["global_batch_size"] = self.global_batch_size
        return out


def phase_weights(phases: Sequence[Phase], names: list[str],
                  base: list[float]) -> tuple[list[int], list[list[float]]]:
    """Start steps and weight vectors of a schedule: phase 0 is the datasets' own weights
    (`base`) from step 0 unless a phase starts at step 0. Refuses what is not a schedule."""
    starts, vectors = [0], [list(base)]
    last = -1
    for k, ph in enumerate(phases):
        where = f"phase {k} (start_step {ph.start_step})"
        if not isinstance(ph.start_step, int) or ph.start_step < 0 or ph.start_step <= last:
            raise ConfigError(f"{where}: start_step must be an int >= 0, and phases must be in "
                              f"increasing start_step order (the previous one starts at {last})")
        last = ph.start_step
        if ph.weights is None:
            if ph.global_batch_size is None:
                raise ConfigError(f"{where}: a phase sets weights, global_batch_size or both")
            continue
        unknown = sorted(set(ph.weights) - set(names))
        if unknown:
            raise ConfigError(f"{where}: weights name unknown datasets {unknown}; the recipe's "
                              f"datasets are {names}")
        w = [float(ph.weights.get(n, 0.0)) for n in names]
        if any(x < 0 for x in w) or sum(w) <= 0:
            raise ConfigError(f"{where}: weights must be >= 0 with a positive sum, got "
                              f"{dict(ph.weights)}")
        if ph.start_step == 0:
            vectors[0] = w
        else:
            starts.append(ph.start_step)
            vectors.append(w)
    return starts, vectors


@dataclass
class Relaned:
    """A lane's streams after a lane-count change (`engine.relane`).

    Draws ``base .. base + len(carry) - 1`` are `carry` (samples the old
    lanes held, as ``(dataset, shard, index, epoch)``); draws ``0 .. base - 1``
    are the documents of the rows the lane was given (not drawn again). After
    the carry, the `c`-th draw of dataset `j` is position ``explicit[j][c]`` of
    its order, or ``start[j] + (c - len(explicit[j])) * stride`` past the list.
    """

    base: int
    carry: list[tuple[int, int, int, int]]
    explicit: list[list[int]]
    start: list[int]
    stride: int

    def position(self, j: int, c: int) -> int:
        e = self.explicit[j]
        return e[c] if c < len(e) else self.start[j] + (c - len(e)) * self.stride

    @property
    def mixed_from(self) -> int:
        """The first draw of the mixture (after the given rows' documents and the carry)."""
        return self.base + len(self.carry)

    def to_json(self) -> dict:
        return {"base": self.base, "carry": [list(c) for c in self.carry],
                "explicit": [list(e) for e in self.explicit], "start": list(self.start),
                "stride": self.stride}

    @classmethod
    def from_json(cls, d: dict) -> Relaned:
        return cls(int(d["base"]), [tuple(int(x) for x in c) for c in d["carry"]],  # type: ignore[misc]
                   [[int(x) for x in e] for e in d["explicit"]], [int(x) for x in d["start"]],
                   int(d["stride"]))


@dataclass
class SourceState:
    """Everything a lane's source needs to resume: draws so far, per dataset.

    With a schedule, also the current phase, the draw at which it began and
    its draws per dataset (the deficit rule runs within a phase).
    """

    draws: int = 0
    counts: list[int] = field(default_factory=list)
    phase: int = 0
    phase_start: int = 0
    phase_counts: list[int] | None = None
    #: after a lane-count change: the lane's re-dealt streams (absent before any)
    relaned: Relaned | None = None

    def to_json(self) -> dict:
        out: dict[str, Any] = {"draws": self.draws, "counts": list(self.counts)}
        if self.phase_counts is not None:
            out.update(phase=self.phase, phase_start=self.phase_start,
                       phase_counts=list(self.phase_counts))
        if self.relaned is not None:
            out["relaned"] = self.relaned.to_json()
        return out

    @classmethod
    def from_json(cls, d: dict) -> SourceState:
        counts = [int(c) for c in d["counts"]]
        relaned = Relaned.from_json(d["relaned"]) if "relaned" in d else None
        if "phase_counts" not in d:
            return cls(int(d["draws"]), counts, relaned=relaned)
        return cls(int(d["draws"]), counts, int(d["phase"]), int(d["phase_start"]),
                   [int(c) for c in d["phase_counts"]], relaned)


def _normalized(weights: list[float]) -> list[float]:
    total = float(sum(weights))
    if total <= 0 or any(w < 0 for w in weights):
        raise ConfigError(f"mixture weights must be >= 0 with a positive sum, got {weights}")
    return [w / total for w in weights]


class LaneSource:
    """The origin stream of one lane.

    `schedule` (weight vectors of phases 0, 1, ...) makes it phased: the lane
    calls `begin_phase` when its gate decides the next phase starts.
    """

    def __init__(self, orders: list[DatasetOrder], weights: list[float], lane: int,
                 num_lanes: int, epochs: int | None, state: SourceState | None = None,
                 schedule: list[list[float]] | None = None):
        self.orders = orders
        self.schedule = [_normalized(w) for w in schedule] if schedule else None
        self.weights = self.schedule[0] if self.schedule else _normalized(weights)
        self.lane = lane
        self.num_lanes = num_lanes
        self.epochs = epochs
        self.exhausted = False
        #: ``mix_by = "tokens"``: tokens of the phase's draws per dataset (`PhaseGate`)
        self.token_estimate: Any = None
        self.state = state or SourceState(0, [0] * len(orders))
        if self.schedule is not None and self.state.phase_counts is None:
            self.state.phase_counts = [0] * len(orders)

    def set_state(self, state: SourceState) -> None:
        """Resume from `state` (a phased source needs a phased state and vice versa)."""
        if (self.schedule is None) != (state.phase_counts is None):
            raise ValueError("source state and recipe disagree on having a mixture schedule")
        if self.schedule is not None:
            if not 0 <= state.phase < len(self.schedule):
                raise ValueError(f"source.phase {state.phase} is outside the schedule's "
                                 f"{len(self.schedule)} phases")
            if len(state.phase_counts or []) != len(self.orders):
                raise ValueError("source.phase_counts has the wrong number of datasets")
            self.weights = self.schedule[state.phase]
        self.state = state

    @property
    def phased(self) -> bool:
        return self.schedule is not None

    def begin_phase(self) -> None:
        """The next draw is the first of the next phase."""
        assert self.schedule is not None and self.state.phase + 1 < len(self.schedule)
        st = self.state
        st.phase += 1
        st.phase_start = st.draws
        st.phase_counts = [0] * len(self.orders)
        self.weights = self.schedule[st.phase]

    def _choose(self) -> int:
        st = self.state
        if st.phase_counts is None:
            n, counts = st.draws + 1, st.counts
            if st.relaned is not None:
                n -= st.relaned.mixed_from
        elif self.token_estimate is not None:
            tokens = self.token_estimate(st.phase_counts)
            total = sum(tokens)
            return int(np.argmax([total * w - t if w > 0 else -np.inf
                                  for w, t in zip(self.weights, tokens, strict=True)]))
        else:
            n, counts = st.draws - st.phase_start + 1, st.phase_counts
        deficits = [n * w - c for w, c in zip(self.weights, counts, strict=True)]
        return max(range(len(deficits)), key=deficits.__getitem__)  # the first largest

    def next(self) -> Origin | None:
        """The next origin of this lane, or None at the end of the data."""
        if self.exhausted:
            return None
        st = self.state
        rl = st.relaned
        if rl is not None and st.draws < rl.mixed_from:
            ds, shard, index, epoch = rl.carry[st.draws - rl.base]
            st.draws += 1
            return Origin(st.draws - 1, ds, shard, index, epoch)
        j = self._choose()
        order = self.orders[j]
        position = (self.state.counts[j] * self.num_lanes + self.lane if rl is None
                    else rl.position(j, self.state.counts[j]))
        if self.epochs is not None and position >= self.epochs * order.total:
            self.exhausted = True
            return None
        shard, index, epoch = order.locate(position)
        origin = Origin(self.state.draws, j, shard, index, epoch)
        self.state.counts[j] += 1
        if self.state.phase_counts is not None:
            self.state.phase_counts[j] += 1
        self.state.draws += 1
        return origin
