"""What both packers share (`Pack`, `BalancedPack`): the row filler, the per-row limits,
the drop rules for a document no row can take, and ready rows popped with their filler.

A `RowFiller` makes a per-row rule of "every row has at least one unit of
`cost`" (guarantee 10: every row carries an image): a row that closes with
none gets the filler document appended as its own segment, and the room for
it is kept free while the row fills. The filler is a pure function of the
row, so it is not in the checkpoint: it is added when the row is popped.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import deque
from dataclasses import dataclass

from zephon_core.errors import ConfigError
from zephon_core.ops.contract import Combiner, CombinerOp, Row, Segment
from zephon_core.ops.segments import segment_origins
from zephon_core.records import Dropped, Origin

__all__ = ["FILLER_ORIGIN", "NO_LIMIT", "RowFiller", "RowPackOp", "RowPacker"]

#: the limit of a cost the operator's `limits` do not name
NO_LIMIT = 1 << 62

#: The origin of filler segments: no dataset, so no ledger counts it as a sample.
FILLER_ORIGIN = Origin(-1, -1, -1, -1, -1)


@dataclass(frozen=True)
class RowFiller:
    """A fixed document appended to each row whose total `cost` is 0.

    `payload` is a document like any other (``tokens``, ``targets``,
    ``costs``; its ``costs[cost]`` must be >= 1). `fingerprint` identifies its
    content in checkpoint fingerprints (the payload may hold arrays).
    `datasets`: only a row with a document of one of these datasets (by index)
    gets it; None: every row. Room for it is kept in every row either way.
    """

    cost: str
    payload: dict
    fingerprint: str
    datasets: frozenset[int] | None = None

    def wanted(self, segments: list[Segment]) -> bool:
        """True when the row of `segments` gets the filler: none has the cost, and
        (with `datasets`) one comes from a dataset that wants it."""
        if any(int((s.payload.get("costs") or {}).get(self.cost, 0)) for s in segments):
            return False
        return self.datasets is None or any(s.origin.dataset in self.datasets
                                            for s in segments)

    def __post_init__(self) -> None:
        if int((self.payload.get("costs") or {}).get(self.cost, 0)) < 1:
            raise ConfigError(f"a row filler for {self.cost!r} must itself have "
                              f"costs[{self.cost!r}] >= 1")

    @property
    def num_tokens(self) -> int:
        return len(self.payload["tokens"])

    def settings(self) -> dict:
        out = {"cost": self.cost, "tokens": self.num_tokens, "fingerprint": self.fingerprint}
        if self.datasets is not None:
            out["datasets"] = sorted(self.datasets)
        return out


class RowPackOp(CombinerOp):
    """The settings both packers' operators share: row length, per-row limits of named
    costs, the pad id and the optional row filler."""

    seq_len: int
    limits: dict[str, int]
    pad_id: int
    filler: RowFiller | None

    def _set_rows(self, seq_len: int, limits: dict[str, int] | None, pad_id: int, name: str,
                  filler: RowFiller | None) -> None:
        """Keep the shared settings; a filler must leave room for a document."""
        if filler is not None and filler.num_tokens >= seq_len:
            raise ConfigError(f"the row filler takes {filler.num_tokens} tokens, no room left "
                              f"in seq_len={seq_len}")
        self.seq_len = seq_len
        self.limits = dict(limits or {})
        self.pad_id = pad_id
        self.name = name
        self.filler = filler

    def _with_filler(self, out: dict) -> dict:
        """`out` (the settings) with the filler's, when there is one."""
        if self.filler is not None:
            out["filler"] = self.filler.settings()
        return out


class RowPacker(Combiner):
    """The per-lane state both packers share: rows ready to pop, the room kept for the
    filler, and the rules that drop a document before it is held."""

    op: RowPackOp
    ready: deque[list[Segment]]

    def _limit(self, key: str) -> int:
        return self.op.seq_len if key == "tokens" else self.op.limits.get(key, NO_LIMIT)

    def _filler_tokens(self) -> int:
        return self.op.filler.num_tokens if self.op.filler is not None else 0

    def _reserve(self, used: dict[str, int]) -> int:
        """Tokens a row with `used` keeps free for the filler (it gets one when popped)."""
        filler = self.op.filler
        return filler.num_tokens if filler is not None and not used.get(filler.cost) else 0

    def _refuse(self, n: int, costs: dict[str, int]) -> Dropped | None:
        """Why a document of `n` tokens and `costs` is dropped before packing (empty, or a
        cost over its per-row limit), or None."""
        if n == 0:
            return Dropped("empty")
        over = [k for k, v in costs.items() if k != "tokens" and v > self._limit(k)]
        if over:
            return Dropped(f"over_limit:{over[0]}", f"{costs[over[0]]} > {self._limit(over[0])}")
        return None

    @abstractmethod
    def _held(self) -> list[list[Segment]]:
        """Every held list of segments (open rows, buffers, ready rows), in state order."""

    def held_origins(self) -> list[Origin]:
        """Documents held or in ready rows (a split document once)."""
        return segment_origins(self._held())

    def pop_row(self) -> Row | None:
        """The oldest ready row; a row that `RowFiller.wanted` gets the filler appended."""
        if not self.ready:
            return None
        segments = self.ready.popleft()
        filler = self.op.filler
        if filler is not None and filler.wanted(segments):
            segments = [*segments, Segment(FILLER_ORIGIN, filler.payload, 0, filler.num_tokens)]
        return Row(segments)
