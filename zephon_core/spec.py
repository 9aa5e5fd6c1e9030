"""A recipe: everything that decides the data (and therefore the fingerprint)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from zephon_core.data.sources import Dataset, Phase, ShuffleSettings, phase_weights
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import CombinerOp, Operator, Row
from zephon_core.ops.pack import text_rows_arrays
from zephon_core.ops.row_transform import RowTransform


class TextCollate:
    """Rows -> ``input``, ``labels``, ``positions`` int64 tensors of shape [rows, seq_len]."""

    def __init__(self, seq_len: int, pad_id: int) -> None:
        self.seq_len = seq_len
        self.pad_id = pad_id

    def settings(self) -> dict:
        return {"type": "text", "seq_len": self.seq_len, "pad_id": self.pad_id}

    def __call__(self, rows: list[Row]) -> dict[str, torch.Tensor]:
        arrays = text_rows_arrays(rows, self.seq_len, self.pad_id)
        return {k: torch.from_numpy(a) for k, a in arrays.items()}


Collate = Callable[[list[Row]], dict[str, Any]]


def check_rank_count(dp_world_size: int, what: str = "the data-parallel rank count") -> None:
    """Refuse a rank count below one (`what` names where it came from)."""
    if isinstance(dp_world_size, bool) or not isinstance(dp_world_size, int) \
            or dp_world_size < 1:
        raise ConfigError(f"{what} must be an int >= 1, got {dp_world_size!r}")


def check_lane_geometry(num_lanes: int, global_batch_size: int | None = None,
                        dp_world_size: int | None = None, *, where: str = "",
                        hint: str = "") -> None:
    """The one rule of batch geometry, for the recipe, a batch-size change and the adapters:
    every lane gives ``G / L`` whole rows per step (G a positive multiple of L) and every
    rank owns whole lanes (D divides L). `where` names the source of `G`; `hint` (the
    adapter's flag) ends the message about D."""
    L = num_lanes
    if not isinstance(L, int) or L < 1:
        raise ConfigError(f"num_lanes must be >= 1, got {L!r}")
    if dp_world_size is not None and (check_rank_count(dp_world_size) or L % dp_world_size):
        D = dp_world_size
        divisors = [d for d in range(1, L + 1) if L % d == 0]
        raise ConfigError(
            f"{D} data-parallel ranks cannot share num_lanes={L} evenly: the rank count must "
            f"divide the lane count. Use D in {divisors}, or a lane count that is a multiple "
            f"of every rank count you will run at (e.g. 64){hint}")
    G = global_batch_size
    if G is None:
        return
    if not isinstance(G, int) or G < 1:
        raise ConfigError(f"global_batch_size={G!r}{where} must be an int >= 1")
    if G % L:
        raise ConfigError(f"global_batch_size={G}{where} is not a multiple of num_lanes={L} "
                          f"(G % L = {G % L}): every lane gives G / L rows per step")


@dataclass(frozen=True)
class Recipe:
    """Datasets, operators (ending with a `CombinerOp` such as `Pack`), batch geometry and seed.

    `global_batch_size` rows per step, `num_lanes` lanes (`L`), so each lane
    gives `global_batch_size // num_lanes` rows per step. `phases` make the
    mixture a schedule (`Phase(start_step, weights)`; before the first one the
    datasets' own weights apply); `phase_lag` is how many draws past its last
    step a lane keeps the old mixture (engine.phases, docs/elastic-changes.md).

    Frozen: a recipe is what a checkpoint's fingerprint describes, so a changed one is a
    new recipe (``dataclasses.replace(recipe, seed=1)``), checked again.
    """

    datasets: list[Dataset]
    ops: list[Operator]
    global_batch_size: int
    num_lanes: int
    seed: int = 0
    epochs: int | None = None
    shuffle: ShuffleSettings = field(default_factory=ShuffleSettings)
    collate: Any = None
    name: str = "custom"
    phases: list[Phase] = field(default_factory=list)
    phase_lag: int = 32
    #: "samples" (weights count samples) or "tokens" (weights count the tokens the
    #: combiner receives; docs/elastic-changes.md)
    mix_by: str = "samples"
    #: stateless operators on each finished row, after the combiner (`RowTransform`,
    #: docs/operators.md): they run in the worker pool only for the rows a step takes
    row_ops: list[RowTransform] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.datasets:
            raise ConfigError("a recipe needs at least one dataset")
        if not self.ops or not isinstance(self.ops[-1], CombinerOp):
            raise ConfigError("a recipe's operators must end with a CombinerOp that makes rows, "
                              "such as Pack(seq_len=...)")
        seq_len = self.ops[-1].seq_len
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ConfigError(f"the combiner {self.ops[-1].name!r} must set seq_len (tokens per "
                              f"row) to a positive int, got {seq_len!r}")
        check_lane_geometry(self.num_lanes, self.global_batch_size)
        # frozen: __post_init__ completes the fields through object.__setattr__
        object.__setattr__(self, "phases", [p if isinstance(p, Phase) else Phase(**p)
                                            for p in self.phases])
        if not isinstance(self.phase_lag, int) or self.phase_lag < 0:
            raise ConfigError(f"phase_lag must be an int >= 0, got {self.phase_lag!r}")
        if self.mix_by not in ("samples", "tokens"):
            raise ConfigError(f"mix_by must be 'samples' or 'tokens', got {self.mix_by!r}")
        self.schedule()  # refuses a bad schedule now, not at the first step
        for step, g in self.batch_sizes():
            check_lane_geometry(self.num_lanes, g, where=f" (phase at step {step})")
        bad = [getattr(o, "name", repr(o)) for o in self.row_ops
               if not isinstance(o, RowTransform)]
        if bad:
            raise ConfigError(f"row_ops holds {bad}, which are not RowTransforms; an operator "
                              "before the combiner goes in ops")
        if self.collate is None:
            object.__setattr__(self, "collate", TextCollate(self.seq_len, self.combiner.pad_id))

    @property
    def combiner(self) -> CombinerOp:
        """The last operator, which makes the rows."""
        return self.ops[-1]  # type: ignore[return-value]

    def schedule(self) -> tuple[list[int], list[list[float]]] | None:
        """Start steps and weight vectors of the phases, or None for a static mixture."""
        if not any(p.weights is not None for p in self.phases):
            if self.phases:
                phase_weights(self.phases, [d.name for d in self.datasets], [])
            if self.mix_by == "tokens":  # one phase: the gate settles the token counts
                return [0], [[d.weight for d in self.datasets]]
            return None
        return phase_weights(self.phases, [d.name for d in self.datasets],
                             [d.weight for d in self.datasets])

    def batch_sizes(self) -> list[tuple[int, int]]:
        """(start step, global batch size) of the phases that set one."""
        return [(p.start_step, p.global_batch_size) for p in self.phases
                if p.global_batch_size is not None]

    @property
    def seq_len(self) -> int:
        return self.combiner.seq_len

    @property
    def rows_per_lane(self) -> int:
        return self.global_batch_size // self.num_lanes

    def lanes_of(self, dp_rank: int, dp_world_size: int) -> list[int]:
        """Contiguous lanes of a rank: `[d*L/D, (d+1)*L/D)`."""
        L, D = self.num_lanes, dp_world_size
        check_lane_geometry(L, dp_world_size=D)
        if not 0 <= dp_rank < D:
            raise ConfigError(f"dp_rank {dp_rank} is outside [0, {D})")
        per = L // D
        return list(range(dp_rank * per, (dp_rank + 1) * per))

    def fingerprint(self) -> dict:
        settings = getattr(self.collate, "settings", None)
        return {
            "recipe": self.name,
            "num_lanes": self.num_lanes,
            "global_batch_size": self.global_batch_size,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "epochs": self.epochs,
            "shuffle": self.shuffle.settings(),
            "mixture": [d.weight for d in self.datasets],
            "datasets": [d.identity() for d in self.datasets],
            "operators": [{"name": o.name, "type": type(o).__name__, **o.settings()}
                          for o in self.ops],
            "collate": settings() if callable(settings) else type(self.collate).__name__,
            # only with a schedule, so a static recipe's fingerprint is what it always was
            **({"phases": [p.settings() for p in self.phases], "phase_lag": self.phase_lag}
               if self.phases else {}),
            **({"mix_by": "tokens", "phase_lag": self.phase_lag}
               if self.mix_by == "tokens" else {}),
            # only with a row transform that changes rows, so other recipes' fingerprints
            # are what they always were
            **({"row_ops": row_ops} if (row_ops := [
                {"name": o.name, "type": type(o).__name__, **o.settings()}
                for o in self.row_ops if o.fingerprinted]) else {}),
        }
