"""Per-lane sequence packing: documents in, rows of `seq_len` tokens out.

A document payload is a dict with ``tokens`` (int array), optionally
``targets`` (bool array: which tokens are prediction targets; default all)
and ``costs`` (extra per-row budgets such as ``{"vision_tokens": 256,
"images": 1}``, checked against the packer's `limits`).

The packer keeps up to `max_open_bins` partially filled rows. A document goes
to the first bin it fits (``first_fit``) or the bin it fills best
(``best_fit``); when none fits and no bin can be opened, the fullest bin is
closed and becomes a row. Rows hold *segments* (origin, start, end) of
documents, so the state is a list of origins and slices.

A `RowFiller` (`ops.rowpack`, shared with `BalancedPack`) puts an image in
every row: the room for it is kept free while a row fills, and it is added
when the row is popped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon_core.common.deprecation import moved_keywords
from zephon_core.common.settings import check_settings, setting, settings_from_table
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import Recompute, Row, Segment, StateChecks
from zephon_core.ops.rowpack import FILLER_ORIGIN, RowFiller, RowPacker, RowPackOp
from zephon_core.ops.segments import check_segment_row, decode_segments, encode_segments
from zephon_core.records import Dropped, Origin

#: the packing modes every packer has: the first open row a document fits, or the one it
#: fills best (`PackSettings.pack_mode`)
MODES = ("first_fit", "best_fit")
OVERLONG = ("split", "truncate", "drop")
#: the label of a position that trains nothing (padding, prompts, images): the value
#: torch's cross entropy skips by default
IGNORE_INDEX = -100


__all__ = ["FILLER_ORIGIN", "IGNORE_INDEX", "MODES", "OVERLONG", "Pack", "PackSettings", "Packer",
           "Row", "RowFiller", "Segment", "text_row_arrays"]


@dataclass(frozen=True)
class PackSettings:
    """How a recipe packs documents into rows (`text_recipe`'s ``pack``; a recipe file
    names the fields at its top level: ``pack_mode = "first_fit"``)."""

    pack_mode: str = setting("best_fit", choices=MODES, help="which open row a document "
                             "goes to: the first it fits (first_fit) or the one it fills best "
                             "(best_fit)")
    max_open_bins: int = setting(4, unit="rows", min=1, help="partially filled rows kept open per "
                                 "lane; when a document fits none, the fullest is closed")
    overlong: str = setting("split", choices=OVERLONG, help="a document longer than seq_len: "
                            "split into rows whose positions restart, truncated, or dropped")

    def __post_init__(self) -> None:
        check_settings(self)


class Pack(RowPackOp):
    """Pack documents into rows of `seq_len` tokens, per lane (the usual combiner)."""

    over_length_hint = ("seq_len {seq_len} is smaller than these samples: raise the context "
                        "length (TorchTitan: --training.seq_len), make images smaller "
                        "(max_pixels; --dataloader.max_pixels), or truncate long text "
                        "documents (overlong='truncate'; a document with images is never cut)")
    settings_hint = "for Pack: seq_len, limits, overlong"

    @moved_keywords("Pack", "0.4.0", {"mode": "pack.pack_mode",
                                      "max_open_bins": "pack.max_open_bins",
                                      "overlong": "pack.overlong"})
    def __init__(self, seq_len: int, pack: PackSettings | Mapping[str, Any] | None = None,
                 limits: dict[str, int] | None = None, pad_id: int = 0, name: str = "pack",
                 filler: RowFiller | None = None) -> None:
        """`pack`: how documents go to rows (`PackSettings`, or its fields as a mapping;
        None: its defaults), the declaration that holds the defaults, choices and bounds."""
        self.pack = settings_from_table(PackSettings, pack or {}, "pack")
        if seq_len < 2:
            raise ConfigError(f"pack needs seq_len >= 2, got {seq_len}")
        self._set_rows(seq_len, limits, pad_id, name, filler)
        self.mode = self.pack.pack_mode
        self.max_open_bins = self.pack.max_open_bins
        self.overlong = self.pack.overlong

    def settings(self) -> dict:
        return self._with_filler({
            "seq_len": self.seq_len, "mode": self.mode, "max_open_bins": self.max_open_bins,
            "overlong": self.overlong, "limits": self.limits, "pad_id": self.pad_id})

    def check_state(self, state: Any, checks: StateChecks) -> None:
        super().check_state(state, checks)
        truncated = state.get("truncated")
        if not (isinstance(truncated, int) and not isinstance(truncated, bool) and truncated >= 0):
            raise checks.fail("truncated", f"is {truncated!r}, not a count")
        for key in ("bins", "ready"):
            rows = state.get(key)
            if not isinstance(rows, list):
                raise checks.fail(key, "is not a list of rows")
            if key == "bins" and len(rows) > self.max_open_bins:
                raise checks.fail(key, f"holds {len(rows)} open rows, more than "
                                  f"max_open_bins={self.max_open_bins}")
            for row in rows:
                check_segment_row(key, row, checks, self.seq_len)

    def make(self, lane: int, seed: int) -> Packer:
        return Packer(self)

    def rows_in_state(self, state: dict) -> list[list[list[int]]]:
        """Ready rows, then the open bins closed in their order (as `flush` closes them)."""
        return [list(r) for r in state["ready"]] + [list(b) for b in state["bins"]]

    def state_of_rows(self, rows: list[list[list[int]]]) -> dict:
        return {"bins": [], "ready": [list(r) for r in rows], "truncated": 0}


@dataclass
class _Bin:
    segments: list[Segment] = field(default_factory=list)
    used: dict[str, int] = field(default_factory=dict)

    def tokens(self) -> int:
        return self.used.get("tokens", 0)


class Packer(RowPacker):
    """The per-lane state of `Pack`."""

    op: Pack

    def __init__(self, op: Pack) -> None:
        self.op = op
        self.bins: list[_Bin] = []
        self.ready: deque[list[Segment]] = deque()
        self.truncated = 0

    def _costs(self, payload: dict, length: int) -> dict[str, int]:
        costs = {"tokens": length}
        for k, v in (payload.get("costs") or {}).items():
            costs[k] = int(v)
        return costs

    def _after(self, b: _Bin, costs: dict[str, int]) -> dict[str, int]:
        keys = set(b.used) | set(costs)
        return {k: b.used.get(k, 0) + costs.get(k, 0) for k in keys}

    def _fits(self, b: _Bin, costs: dict[str, int]) -> bool:
        after = self._after(b, costs)
        if not all(after[k] <= self._limit(k) for k in costs):
            return False
        return after["tokens"] + self._reserve(after) <= self.op.seq_len

    def _room(self, costs: dict[str, int]) -> int:
        """The most tokens a document with `costs` may take in an empty row."""
        return self.op.seq_len - self._reserve(costs)

    def push(self, origin: Origin, payload: dict) -> Dropped | None:
        """Absorb one document; returns a `Dropped` when the document cannot be packed."""
        n = len(payload["tokens"])
        S = self.op.seq_len
        costs = self._costs(payload, n)
        refused = self._refuse(n, costs)
        if refused is not None:
            return refused
        start = 0
        room = self._room(costs)
        if n > room:
            if self.op.overlong == "drop" or len(costs) > 1:
                why = "" if room == S else (f" minus {S - room} for the row filler "
                                            "(a document without an image)")
                return Dropped("over_length", f"{n} tokens > seq_len {S}{why}")
            if self.op.overlong == "truncate":
                self.truncated += 1
                self.ready.append([Segment(origin, payload, 0, room)])
                return None
            while n - start > room:
                self.ready.append([Segment(origin, payload, start, start + room)])
                start += room
            costs = {"tokens": n - start}
        self._place(Segment(origin, payload, start, n), costs)
        return None

    def _pick(self, costs: dict[str, int]) -> int | None:
        """The open bin a document with `costs` goes to (None: it fits none)."""
        if self.op.filler is None and len(costs) == 1:
            return self._pick_by_tokens(costs["tokens"])
        return self._pick_by_costs(costs)

    def _pick_by_tokens(self, n: int) -> int | None:
        """`_pick_by_costs` for a document that costs only its `n` tokens, in a packer
        without a filler: a bin fits while its tokens + `n` fit the row, and the best fit
        is the fullest such bin (the first of equals). Integer arithmetic, no dicts: this
        runs for every text document in the driver."""
        room = self.op.seq_len - n
        best, best_used = None, -1
        for j, b in enumerate(self.bins):
            used = b.used.get("tokens", 0)
            if used <= room:
                if self.op.mode == "first_fit":
                    return j
                if used > best_used:
                    best, best_used = j, used
        return best

    def _pick_by_costs(self, costs: dict[str, int]) -> int | None:
        candidates = [i for i, b in enumerate(self.bins) if self._fits(b, costs)]
        if not candidates:
            return None
        if self.op.mode == "first_fit":
            return candidates[0]

        def slack(j: int) -> int:
            after = self._after(self.bins[j], costs)
            return self.op.seq_len - after["tokens"] - self._reserve(after)

        return min(candidates, key=lambda j: (slack(j), j))

    def _place(self, seg: Segment, costs: dict[str, int]) -> None:
        i = self._pick(costs)
        if i is None:
            if len(self.bins) >= self.op.max_open_bins:
                fullest = max(range(len(self.bins)), key=lambda j: (self.bins[j].tokens(), -j))
                self.ready.append(self.bins.pop(fullest).segments)
            self.bins.append(_Bin())
            i = len(self.bins) - 1
        b = self.bins[i]
        b.segments.append(seg)
        for k, v in costs.items():
            b.used[k] = b.used.get(k, 0) + v
        if b.tokens() + self._reserve(b.used) >= self.op.seq_len:
            self.ready.append(self.bins.pop(i).segments)

    def flush(self) -> None:
        while self.bins:
            self.ready.append(self.bins.pop(0).segments)

    # --- checkpoint -------------------------------------------------------
    def state(self) -> dict:
        return {"bins": [encode_segments(b.segments) for b in self.bins],
                "ready": [encode_segments(r) for r in self.ready], "truncated": self.truncated}

    def _held(self) -> list[list[Segment]]:
        return [b.segments for b in self.bins] + list(self.ready)

    def restore(self, state: dict, recompute: Recompute) -> None:
        nbins = len(state["bins"])
        groups = decode_segments([*state["bins"], *state["ready"]], recompute)
        self.bins = []
        for segs in groups[:nbins]:
            b = _Bin(segs)
            for s in b.segments:
                for k, v in self._costs(s.payload, s.length).items():
                    b.used[k] = b.used.get(k, 0) + v
            self.bins.append(b)
        self.ready = deque(groups[nbins:])
        self.truncated = int(state["truncated"])


def text_row_arrays(row: Row, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """`input`, `labels` and `positions` of one row (labels are next-token targets).

    The last token of each segment has label -100: nothing follows it inside
    the row, and a segment never predicts across a document boundary.
    """
    inp = np.full(seq_len, pad_id, dtype=np.int64)
    lab = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    pos = np.zeros(seq_len, dtype=np.int64)
    _fill_text_row(row, inp, lab, pos)
    return {"input": inp, "labels": lab, "positions": pos}


def text_rows_arrays(rows: list[Row], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """`text_row_arrays` of `rows`, stacked (``[len(rows), seq_len]`` each): each row is
    written into its line of one array, not made apart and copied by a stack."""
    shape = (len(rows), seq_len)
    inp = np.full(shape, pad_id, dtype=np.int64)
    lab = np.full(shape, IGNORE_INDEX, dtype=np.int64)
    pos = np.zeros(shape, dtype=np.int64)
    for i, row in enumerate(rows):
        _fill_text_row(row, inp[i], lab[i], pos[i])
    return {"input": inp, "labels": lab, "positions": pos}


def _fill_text_row(row: Row, inp: np.ndarray, lab: np.ndarray, pos: np.ndarray) -> None:
    """Write `row`'s segments into `inp`, `lab` and `pos` (filled with pad, -100 and 0)."""
    at = 0
    for s in row.segments:
        toks = np.asarray(s.payload["tokens"][s.start:s.end])
        n = len(toks)
        inp[at:at + n] = toks
        pos[at:at + n] = np.arange(n)
        if n > 1:
            nxt = toks[1:].astype(np.int64)
            targets = s.payload.get("targets")
            if targets is not None:
                nxt = np.where(np.asarray(targets[s.start + 1:s.end]), nxt, IGNORE_INDEX)
            lab[at:at + n - 1] = nxt
        at += n
