"""Compute-balanced packing: every lane gives each step the same cost, not just the same tokens.

Ranks own whole lanes, so a rank's vision-encoder work at step `t` is the
cost (e.g. ``vision_tokens``) of the rows its lanes give at that step. Plain
packing fills rows with tokens and leaves that cost to chance (4.4x between
ranks on `vlm-mix-demo`). `BalancedPack` makes the rows of one lane and one
step (a *group* of `rows_per_group` rows, the recipe's ``G / L``) together
carry a target cost that is the same for every lane at that step:

* documents with cost (images) and without (text) are held apart in a
  bounded lookahead buffer per lane;
* a group is made when enough text is held to fill it and `CHOICE` times the
  step's target of cost the step may take; its costly documents are the
  subset of the held ones (the oldest `WINDOW` that the step may take) whose
  total is closest to the target (going over counts `OVERSHOOT` times as much
  as staying under), spread over the group's rows, largest first, to the row
  with the least cost;
* text fills the rest of each row, split across rows when `split_text`
  (the continuation restarts its positions like a split in `Pack`).

The target of step `t` is a pure function of `t` and the settings, so it is
the same for every lane: `budget` per row on average; with `heavy_every = P`
every `P`-th step is a *heavy* step of `heavy_budget` per group, which takes
the documents too costly for the other (light) steps, and the light steps
share the rest of the average. A correction of at most `tolerance`
(relative) follows what the lane holds: up while it holds more cost than
`lookahead` groups' worth, down while it holds more text than `lookahead`
groups' rows, so a lane whose supply runs ahead of or behind the budget
drifts back.

Worst cases (documented, deterministic): when a lane runs short of costly
documents it reads text ahead, and once it holds `4 * lookahead` groups' rows
of text its group takes what it has (below target); when it holds more than
`6 * lookahead` groups' worth of cost, the oldest surplus goes (above
target); with no text at all, `8 * lookahead * rows_per_group` held costly
documents make rows on their own. None of these depend on `D`, and they
bound what a lane holds (so restore cost, guarantee 7).

The state (held documents, ready rows, the group counter) is a list of
origins and slices, like `Pack`'s, and `check_state` validates it.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from zephon_core.common.deprecation import deprecation, moved_keywords
from zephon_core.common.settings import check_settings, setting, settings_from_table
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import Recompute, Segment, StateChecks
from zephon_core.ops.rowpack import RowFiller, RowPacker, RowPackOp
from zephon_core.ops.segments import (
    check_segment,
    check_segment_row,
    decode_segments,
    encode_segments,
)
from zephon_core.records import Dropped, Origin

__all__ = ["BalanceSettings", "BalancedPack", "BalancedPacker"]

#: a light step takes no document whose cost alone exceeds its target by more than this
LIGHT_SLACK = 0.08
#: how much worse a step is for going over its target than under it: one lane over makes
#: that step's max/mean over ranks, one lane under only lowers the mean a little
OVERSHOOT = 8.0
#: a group waits (reading text ahead) until the lane holds this many steps' targets of
#: documents the step may take, so the subset search has a choice
CHOICE = 2.0
#: the most held costly documents the subset search looks at (oldest first)
WINDOW = 24


@dataclass(frozen=True)
class BalanceSettings:
    """A recipe's balanced-packing settings (the ``[balance]`` table of a recipe file).

    `budget` is the mean cost per row (for VLM recipes: vision tokens); set
    it to the mean of your data (`zephon-vl balance` reports
    ``mean_vision_tokens_per_row``). `heavy_every`/`heavy_budget` schedule
    heavy steps for documents too costly for an average step (0: none).
    """

    budget: float = setting(
        unit="cost", above=0,
        help="the mean cost per row (a VLM recipe: vision tokens); `zephon-vl "
        "balance` reports a recipe's mean as mean_vision_tokens_per_row")
    heavy_every: int = setting(
        0, unit="steps", min=0,
        help="every this many steps is a heavy step for documents too costly for an average "
        "step (0: none)")
    heavy_budget: float = setting(
        0.0, unit="cost", min=0,
        help="a heavy step's cost per group (one lane's rows of a step), above one group's "
        "mean")
    lookahead: int = setting(
        4, unit="groups", min=1,
        help="groups' worth of documents a lane holds before its target is corrected toward "
        "what it holds")
    tolerance: float = setting(
        0.03, unit="fraction", min=0, below=0.5,
        help="the largest relative correction of a step's target toward what the lane holds")
    split_text: bool = setting(True, help="split text documents across rows to fill them "
                               "(a document with images is never cut)")

    def __post_init__(self) -> None:
        check_settings(self)
        if self.heavy_every == 1:
            raise ConfigError("BalanceSettings.heavy_every must be 0 (no heavy steps) or >= 2 "
                              "(every second step or rarer); got 1")


#: ``BalancedPack(seq_len, cost, 256.0)``: the budget given where `balance` now goes
_POSITIONAL_BUDGET = deprecation("BalancedPack(seq_len, cost, budget)",
                                 "BalancedPack(seq_len, cost, {'budget': ...})", "0.4.0")

F = TypeVar("F", bound=Callable[..., Any])


def _budget_given_positionally(init: F) -> F:
    """Keep ``BalancedPack(seq_len, cost, budget, ...)`` of before 0.4 working: a number
    where `balance` goes is its budget (with a DeprecationWarning)."""

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) >= 3 and isinstance(args[2], int | float) and not isinstance(args[2], bool):
            given = kwargs.get("balance") or {}  # other old keywords, moved there already
            if len(args) > 3 or not isinstance(given, Mapping) or "budget" in given:
                raise TypeError("BalancedPack(seq_len, cost, budget, ...) of before 0.4: give "
                                "the rest as keywords, or balance={'budget': ...}")
            _POSITIONAL_BUDGET.warn(stacklevel=3)  # under `moved_keywords`' wrapper
            args, kwargs = args[:2], {**kwargs, "balance": {**given, "budget": args[2]}}
        return init(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class BalancedPack(RowPackOp):
    """Rows whose `cost` per lane and step follows one target for every lane (see module doc)."""

    lane_change_refusal = ("balanced packing makes each lane's rows in groups of "
                           "rows_per_group (G / L rows, one lane's step) balanced to the lane's "
                           "cost target, and no rule re-deals its groups and buffers over other "
                           "lanes (a run whose lane count will change packs with Pack)")
    over_length_hint = ("seq_len {seq_len} is smaller than these samples: raise the context "
                        "length (TorchTitan: --training.seq_len), make images smaller "
                        "(max_pixels; --dataloader.max_pixels), or split long text documents "
                        "(split_text=True; a document with images is never cut)")
    settings_hint = "for BalancedPack: seq_len, limits, split_text"

    @moved_keywords("BalancedPack", "0.4.0",
                    {k: f"balance.{k}" for k in ("budget", "heavy_every", "heavy_budget",
                                                 "lookahead", "tolerance", "split_text")})
    @_budget_given_positionally
    def __init__(self, seq_len: int, cost: str,
                 balance: BalanceSettings | Mapping[str, Any] | None = None,
                 rows_per_group: int = 1, limits: dict[str, int] | None = None,
                 pad_id: int = 0, name: str = "pack", filler: RowFiller | None = None) -> None:
        """`balance`: the step targets (`BalanceSettings`, or its fields as a mapping; its
        `budget` has no default), the declaration that holds the defaults and bounds."""
        b = settings_from_table(BalanceSettings, balance or {}, "balance")
        if seq_len < 2 or rows_per_group < 1:
            raise ConfigError(f"balanced packing needs seq_len >= 2 and rows_per_group >= 1, "
                              f"got {seq_len} and {rows_per_group}")
        self._set_rows(seq_len, limits, pad_id, name, filler)
        self.balance = b
        self.cost = cost
        self.budget = float(b.budget)
        self.rows_per_group = rows_per_group
        self.heavy_every = b.heavy_every
        self.heavy_budget = float(b.heavy_budget)
        self.lookahead = b.lookahead
        self.tolerance = float(b.tolerance)
        self.split_text = b.split_text
        self.light = self._light_target()

    def _light_target(self) -> float:
        """A light step's target per group: the mean, less what the heavy steps take."""
        mean = self.budget * self.rows_per_group
        if not self.heavy_every:
            return mean
        light = (self.heavy_every * mean - self.heavy_budget) / (self.heavy_every - 1)
        if self.heavy_budget <= mean or light <= 0:
            raise ConfigError(
                f"heavy_budget={self.heavy_budget:g} must lie between one group's mean budget "
                f"({mean:g}) and {self.heavy_every * mean:g} (heavy_every x mean), so that the "
                "light steps keep a positive budget")
        return light

    def target(self, group: int) -> float:
        """The cost every lane aims at for its rows of step `group`."""
        if self.heavy_every and group % self.heavy_every == self.heavy_every - 1:
            return self.heavy_budget
        return self.light

    def settings(self) -> dict:
        return self._with_filler({
            "mode": "balanced", "seq_len": self.seq_len, "cost": self.cost,
            "budget": self.budget, "rows_per_group": self.rows_per_group,
            "heavy_every": self.heavy_every, "heavy_budget": self.heavy_budget,
            "lookahead": self.lookahead, "tolerance": self.tolerance,
            "split_text": self.split_text, "limits": self.limits, "pad_id": self.pad_id})

    def check_state(self, state: Any, checks: StateChecks) -> None:
        super().check_state(state, checks)
        group = state.get("group")
        if not (isinstance(group, int) and not isinstance(group, bool) and group >= 0):
            raise checks.fail("group", f"is {group!r}, not a count")
        for key in ("costly", "text"):
            segs = state.get(key)
            if not isinstance(segs, list):
                raise checks.fail(key, "is not a list of segments")
            for seg in segs:
                check_segment(key, seg, checks)
        ready = state.get("ready")
        if not isinstance(ready, list):
            raise checks.fail("ready", "is not a list of rows")
        for row in ready:
            check_segment_row("ready", row, checks, self.seq_len, allow_empty=False)

    def make(self, lane: int, seed: int) -> BalancedPacker:
        return BalancedPacker(self)


class BalancedPacker(RowPacker):
    """The per-lane state of `BalancedPack`."""

    op: BalancedPack

    def __init__(self, op: BalancedPack) -> None:
        self.op = op
        self.costly: list[Segment] = []
        self.text: deque[Segment] = deque()
        self.ready: deque[list[Segment]] = deque()
        self.group = 0

    # --- costs ------------------------------------------------------------------
    def _costs(self, payload: dict) -> dict[str, int]:
        return {k: int(v) for k, v in (payload.get("costs") or {}).items()}

    def _cost(self, seg: Segment) -> int:
        return self._costs(seg.payload).get(self.op.cost, 0)

    def _held_cost(self) -> int:
        return sum(self._cost(s) for s in self.costly)

    def _held_text(self) -> int:
        return sum(s.length for s in self.text)

    # --- the contract -----------------------------------------------------------
    def push(self, origin: Origin, payload: dict) -> Dropped | None:
        """Hold one document; make every group the held documents allow."""
        n = len(payload["tokens"])
        S = self.op.seq_len
        costs = self._costs(payload)
        refused = self._refuse(n, costs)
        if refused is not None:
            return refused
        seg = Segment(origin, payload, 0, n)
        if costs.get(self.op.cost, 0) > 0:
            if not self._fits_alone(seg):
                room = S - self._reserve(costs)
                why = "" if room == S else f" minus {S - room} for the row filler"
                return Dropped("over_length", f"{n} tokens > seq_len {S}{why} (a document "
                               f"with {self.op.cost} is never split)")
            self.costly.append(seg)
        else:
            room = S - self._filler_tokens()
            if n > room and not self.op.split_text:
                why = "" if room == S else f" minus {S - room} for the row filler"
                return Dropped("over_length", f"{n} tokens > seq_len {S}{why}")
            self.text.append(seg)
        while self._due():
            self._make_group()
        return None

    def _due(self) -> bool:
        op = self.op
        r, S = op.rows_per_group, op.seq_len
        text = self._held_text()
        if len(self.costly) >= max(r, 8 * op.lookahead * r):
            return True  # no text comes: costly rows alone, so memory stays bounded
        if text < r * S:
            return False
        eligible = sum(self._cost(c) for c in self.costly if self._eligible(c))
        enough = eligible >= CHOICE * self._target()
        return enough or text > 4 * op.lookahead * r * S

    def flush(self) -> None:
        while self.costly or self.text:
            self._make_group(final=True)

    # --- one group: the rows of one lane at one step ---------------------------------
    def _target(self) -> float:
        """The step's common target, corrected by at most `tolerance`: up while the lane holds
        more cost than `lookahead` groups' worth, down while it holds more text."""
        op = self.op
        r = op.rows_per_group
        ahead = (self._held_cost() / (op.lookahead * op.budget * r)
                 - self._held_text() / (op.lookahead * r * op.seq_len))
        return op.target(self.group) * (1.0 + op.tolerance * max(-1.0, min(1.0, ahead)))

    def _eligible(self, seg: Segment) -> bool:
        """A light step takes no document that alone overshoots its target by `tolerance`."""
        op = self.op
        if not op.heavy_every or op.target(self.group) == op.heavy_budget:
            return True
        return self._cost(seg) <= op.light * (1.0 + LIGHT_SLACK)

    def _choose(self, target: float) -> list[int]:
        """Indices of held costly documents whose total cost is closest to `target` (going
        over counts `OVERSHOOT` times as much as staying under), among
        the oldest `WINDOW` eligible ones (older ones win ties); a heavy step always takes
        the oldest document that only a heavy step may take."""
        eligible = [i for i, s in enumerate(self.costly) if self._eligible(s)][:WINDOW]
        if not eligible:
            return []
        best: dict[int, tuple[int, ...]] = {0: ()}
        if self.op.heavy_every and self.op.target(self.group) == self.op.heavy_budget:
            light = self.op.light * (1.0 + LIGHT_SLACK)
            heavy = [i for i in eligible if self._cost(self.costly[i]) > light]
            if heavy:
                best = {self._cost(self.costly[heavy[0]]): (heavy[0],)}
                eligible.remove(heavy[0])
        cap = int(target * 1.5) + 1
        for i in eligible:
            c = self._cost(self.costly[i])
            for total, chosen in list(best.items()):
                t = total + c
                if t <= cap and t not in best:
                    best[t] = (*chosen, i)
        if len(best) > 1:
            best.pop(0, None)  # a lane that holds a document the step may take gives one
        total = min(best, key=lambda t: (max(t - target, 0) * OVERSHOOT + max(target - t, 0), t))
        return sorted(best[total])

    def _make_group(self, final: bool = False) -> None:
        op = self.op
        r, S = op.rows_per_group, op.seq_len
        chosen = self._choose(self._target())
        surplus = self._held_cost() - 6 * op.lookahead * op.budget * r
        if surplus > 0:  # worst case: more held than the bound, the oldest go now
            for i in range(len(self.costly)):
                if surplus <= 0:
                    break
                if i not in chosen:
                    chosen.append(i)
                    surplus -= self._cost(self.costly[i])
        rows: list[list[Segment]] = [[] for _ in range(r)]
        used = [dict[str, int]() for _ in range(r)]
        placed: set[int] = set()
        for i in sorted(chosen, key=lambda j: (-self._cost(self.costly[j]), j)):
            seg = self.costly[i]
            costs = {"tokens": seg.length, **self._costs(seg.payload)}
            fits = [k for k in range(r) if self._fits(used[k], costs)]
            if not fits:
                continue
            k = min(fits, key=lambda j: (used[j].get(op.cost, 0), j))
            rows[k].append(seg)
            for key, v in costs.items():
                used[k][key] = used[k].get(key, 0) + v
            placed.add(i)
        for k in range(r):
            rows[k].extend(self._take_text(S - used[k].get("tokens", 0) - self._reserve(used[k])))
            if not rows[k]:  # no text left for this row: the oldest held document fills it
                for i, seg in enumerate(self.costly):
                    if i not in placed and self._fits_alone(seg):
                        rows[k].append(seg)
                        placed.add(i)
                        break
        self.costly = [s for i, s in enumerate(self.costly) if i not in placed]
        rows = [row for row in rows if row]
        if not rows:
            raise RuntimeError("balanced packing made an empty group (a bug)")
        if not final and len(rows) != r:
            raise RuntimeError(f"balanced packing made {len(rows)} rows, not {r} (a bug)")
        self.ready.extend(rows)
        self.group += 1

    def _fits(self, used: dict[str, int], costs: dict[str, int]) -> bool:
        after = {k: used.get(k, 0) + costs.get(k, 0) for k in set(used) | set(costs)}
        if after["tokens"] + self._reserve(after) > self.op.seq_len:
            return False
        return all(v <= self._limit(k) for k, v in after.items() if k != "tokens")

    def _fits_alone(self, seg: Segment) -> bool:
        return self._fits({}, {"tokens": seg.length, **self._costs(seg.payload)})

    def _take_text(self, room: int) -> list[Segment]:
        """Text for `room` tokens: whole documents in order, then a split one (or, without
        `split_text`, the held documents that fit, oldest first)."""
        out: list[Segment] = []
        if self.op.split_text:
            while room > 0 and self.text:
                seg = self.text[0]
                if seg.length <= room:
                    out.append(self.text.popleft())
                    room -= seg.length
                else:
                    out.append(Segment(seg.origin, seg.payload, seg.start, seg.start + room))
                    self.text[0] = Segment(seg.origin, seg.payload, seg.start + room, seg.end)
                    room = 0
            return out
        keep: deque[Segment] = deque()
        while self.text:
            seg = self.text.popleft()
            if seg.length <= room:
                out.append(seg)
                room -= seg.length
            else:
                keep.append(seg)
        self.text = keep
        return out

    # --- checkpoint -------------------------------------------------------------
    def state(self) -> dict:
        return {"costly": encode_segments(self.costly), "text": encode_segments(self.text),
                "ready": [encode_segments(r) for r in self.ready], "group": self.group}

    def _held(self) -> list[list[Segment]]:
        return [self.costly, list(self.text), *self.ready]

    def restore(self, state: dict, recompute: Recompute) -> None:
        costly, text, *ready = decode_segments(
            [state["costly"], state["text"], *state["ready"]], recompute)
        self.costly = costly
        self.text = deque(text)
        self.ready = deque(ready)
        self.group = int(state["group"])
