"""When a lane's mixture moves to its next phase: a decision made in lane order, never timing.

A phase that starts at global step `s` starts, in lane `l`, at row `B = s * r`
(`r` rows per lane per step). The lane must pick the phase of every draw
*before* it knows which row that draw will land in, and how far it has drawn
when row `B` begins depends on pipelining. So the decision uses only what the
lane has fully consumed, `lag` draws back:

* Every element carries a *trigger* draw: the draw whose arrival made it move
  (its own draw, or, past an accumulator such as a shuffle buffer, the draw
  whose push released it). Along the combiner's input the triggers never
  decrease, so ``R(m)`` -- the rows the lane has made once everything
  triggered by draws ``0..m`` reached the combiner -- is a function of the
  lane's stream alone.
* Draw ``n`` starts the next phase iff ``R(n - 1 - lag) >= B``. The lane
  waits (draws nothing) while ``R(n - 1 - lag)`` is not known yet, i.e. while
  an element triggered by one of those draws is still between stages.

An accumulator never mixes two phases: before it takes its first element of
phase `p` it releases everything it holds (its input is, by induction, all of
phase `p - 1` and then all of phase `p`, so this is a clean cut at a stream
position, not a moment).

Hence rows ``< B`` (steps before `s`) hold draws of the old phase only, the
new phase begins exactly `lag` draws after the draw that the lane pushed
first after finishing row ``B - 1``, and all of it is independent of `D`,
runners, prefetch and timing. `lag` is a recipe setting: the number of draws
the lane may have in flight while a phase change is pending (0: exact, but
one element at a time until the last phase has begun).

The gate is a lane hook (`engine.lane_hooks`): it vetoes draws (`may_draw`),
follows triggers through the accumulators (`cut`, `released`) and records
what reached the combiner (`reached_combiner`, `refused`); its state is its
slice of the lane snapshot, under ``phase_gate``.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from zephon_core.common.jsontext import is_count
from zephon_core.data.sources import LaneSource
from zephon_core.engine.lane_hooks import LaneHook, LaneView
from zephon_core.records import Origin


class PhaseGate(LaneHook):
    """One lane's phase decisions; `start_rows[p]` is the lane row at which phase `p` starts.
    It starts the phases of `source` (the lane's).

    With `tokens` (``mix_by = "tokens"``) it also keeps, per dataset, the tokens
    and samples of the current phase's draws that are *settled* (triggered by a
    draw ``<= n - 1 - lag``, so known in lane order), and gives the source its
    token estimate: settled tokens plus, for draws not settled yet, the
    dataset's settled mean (1 token before any is known).
    """

    state_key = "phase_gate"

    def __init__(self, source: LaneSource, start_rows: list[int], lag: int,
                 tokens: bool = False, num_datasets: int = 0) -> None:
        self.source = source
        if tokens:
            source.token_estimate = self.token_estimate
        self.start_rows = start_rows
        self.lag = lag
        self.tokens = tokens
        #: (trigger, rows made before it, phase, dataset, tokens) of each element the
        #: combiner took, oldest first
        self.entries: deque[tuple[int, int, int, int, int]] = deque()
        self.settled_tokens = [0] * num_datasets
        self.settled_samples = [0] * num_datasets
        #: triggers of elements between stages that differ from their own draw
        self.tau: dict[Origin, int] = {}
        #: the draw at which each phase after the first began, in this lane
        self.start_draws: list[int] = []
        #: per accumulator (operator position): the phase of the last element it took
        self.acc_phase: dict[str, int] = {}

    def trigger(self, o: Origin) -> int:
        return self.tau.get(o, o.seq)

    def released(self, pushed: Origin, outs: list[tuple[Origin, Any]]) -> None:
        """An accumulator took `pushed` and released `outs`: they move because of its trigger."""
        t = self.tau.pop(pushed, pushed.seq)
        for o, _ in outs:
            if o.seq != t:
                self.tau[o] = t

    def phase_of(self, o: Origin) -> int:
        return sum(1 for n in self.start_draws if n <= o.seq)

    def cut(self, position: str, pushed: Origin, acc: Any) -> list[tuple[Origin, Any]]:
        """What accumulator `position` releases before it takes `pushed`: all it holds if
        `pushed` is its first element of a later phase."""
        phase = self.phase_of(pushed)
        if phase <= self.acc_phase.get(position, 0):
            return []
        self.acc_phase[position] = phase
        outs = acc.flush()
        t = self.trigger(pushed)
        for o, _ in outs:
            if o.seq != t:
                self.tau[o] = t
        return outs

    def reached_combiner(self, lane: LaneView, origin: Origin, tokens: int) -> None:
        """Record the element's trigger, the rows made before it, its phase and tokens."""
        trigger = self.tau.pop(origin, origin.seq)
        self.entries.append((trigger, lane.rows_made, self.phase_of(origin), origin.dataset,
                             tokens))

    def refused(self, origin: Origin) -> None:
        """The combiner dropped the element it just took: it brings no tokens."""
        t, rows, phase, ds, _ = self.entries[-1]
        self.entries[-1] = (t, rows, phase, ds, 0)

    def _rows_at(self, m: int, rows_now: int, phase: int) -> int:
        entries = self.entries
        while entries and entries[0][0] <= m:
            _, _, p, ds, tokens = entries.popleft()
            if p == phase:
                self.settled_tokens[ds] += tokens
                self.settled_samples[ds] += 1
        return entries[0][1] if entries else rows_now

    def may_draw(self, lane: LaneView) -> bool:
        """Start the phases that are due and settle token counts; False while the next
        draw's phase (or token estimate) is not known."""
        source, rows_now = self.source, lane.rows_made
        # each queue between stages is in trigger order, so only its head counts
        lowest_moving = min((self.trigger(o) for o in lane.moving_heads()), default=None)
        st = source.state
        while st.phase + 1 < len(self.start_rows) or self.tokens:
            m = st.draws - 1 - self.lag
            if m < 0:
                return True
            if lowest_moving is not None and lowest_moving <= m:
                return False
            rows = self._rows_at(m, rows_now, st.phase)
            if st.phase + 1 >= len(self.start_rows) or rows < self.start_rows[st.phase + 1]:
                return True
            source.begin_phase()
            self.start_draws.append(st.draws)
            self.settled_tokens = [0] * len(self.settled_tokens)
            self.settled_samples = [0] * len(self.settled_samples)
        return True

    def token_estimate(self, phase_counts: list[int]) -> list[float]:
        """Tokens of the current phase's draws per dataset: settled, plus a mean per draw
        not settled yet."""
        known_t, known_n = sum(self.settled_tokens), sum(self.settled_samples)
        fallback = known_t / known_n if known_n else 1.0
        out = []
        for t, n, drawn in zip(self.settled_tokens, self.settled_samples, phase_counts,
                               strict=True):
            mean = t / n if n else fallback
            out.append(t + (drawn - n) * mean)
        return out

    def state(self) -> dict:
        return {"entries": [list(e) for e in self.entries],
                "tau": [[*o, t] for o, t in self.tau.items()],
                "start_draws": list(self.start_draws),
                "acc_phase": dict(sorted(self.acc_phase.items())),
                "settled_tokens": list(self.settled_tokens),
                "settled_samples": list(self.settled_samples)}

    def check_state(self, state: Any) -> None:
        problem = gate_problem(state, len(self.source.orders))
        if problem is not None:
            raise ValueError(f"field {problem[0]!r} {problem[1]}")

    def restore(self, d: dict) -> None:
        self.entries = deque(tuple(int(x) for x in e) for e in d["entries"])  # type: ignore[misc]
        self.settled_tokens = [int(x) for x in d["settled_tokens"]]
        self.settled_samples = [int(x) for x in d["settled_samples"]]
        self.tau = {Origin(*(int(x) for x in e[:5])): int(e[5]) for e in d["tau"]}
        self.start_draws = [int(n) for n in d["start_draws"]]
        self.acc_phase = {str(k): int(v) for k, v in d["acc_phase"].items()}


def gate_problem(gate: Any, datasets: int) -> tuple[str, str] | None:
    """What is wrong with a phase gate's slice of `datasets` datasets, as (field, what), or
    None: its shape, which needs no other part of the snapshot. The gate refuses such a
    slice before a lane restores (`PhaseGate.check_state`); the checkpoint check adds what
    the rest of the snapshot says about it (`engine.snapshot`)."""
    key = PhaseGate.state_key
    if not (isinstance(gate, dict) and isinstance(gate.get("entries"), list)
            and isinstance(gate.get("tau"), list)
            and all(isinstance(e, list) and len(e) == 5 and all(is_count(x) for x in e)
                    and e[3] < datasets for e in gate["entries"])
            and all(isinstance(e, list) and len(e) == 6 and is_count(e[5])
                    for e in gate["tau"])):
        return key, ("is not {entries: [[trigger, rows, phase, dataset, tokens]...], "
                     "tau: [[origin..., trigger]...]}")
    for field in ("settled_tokens", "settled_samples"):
        v = gate.get(field)
        if not (isinstance(v, list) and len(v) == datasets and all(is_count(x) for x in v)):
            return f"{key}.{field}", "is not a count per dataset"
    for e in gate["tau"]:
        if not all(is_count(x) for x in e[:5]):
            return f"{key}.tau", (f"holds {json.dumps(e)[:80]}, not an origin [seq, dataset, "
                                  "shard, index, epoch] and its trigger")
    starts = gate.get("start_draws")
    if not (isinstance(starts, list) and all(is_count(n) for n in starts)
            and starts == sorted(starts)):
        return f"{key}.start_draws", "is not an increasing list of draws"
    acc = gate.get("acc_phase")
    if not (isinstance(acc, dict) and all(is_count(v) for v in acc.values())):
        return f"{key}.acc_phase", "is not a phase per accumulator"
    return None
