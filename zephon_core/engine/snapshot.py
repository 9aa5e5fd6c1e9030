"""One lane's checkpoint state, its JSON form and its checks, in one place.

The lane writes a `LaneSnapshot` after every step's last row and restores
from one (`engine.lane`), the checkpoint check refuses a damaged one field by
field (`LaneSnapshot.check`, with the recipe's context from
`engine.state_check.LaneChecker`), and a lane-count change builds new ones
(`engine.relane`). The keys below are the schema; no other module spells them.

A snapshot holds origins, never payloads: ``pending`` are the elements on
their way to each stateful operator (named by its position in the recipe,
which no execution choice changes), ``accumulators`` and ``combiner`` the
operators' own states (each checks its own, `StatefulOp.check_state`),
``drops`` the drops not yet reported with a row. Beside these, each lane hook
with state (`engine.lane_hooks.LaneHook.state_key`) has its slice under its own
key (the phase gate's is ``phase_gate``): the snapshot keeps the slices
without reading them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from zephon_core.common.jsontext import is_count
from zephon_core.data.sources import SourceState
from zephon_core.engine.phases import PhaseGate, gate_problem
from zephon_core.engine.state_check import LaneChecker, OpChecks
from zephon_core.records import Origin

SOURCE = "source"
SOURCE_DONE = "source_done"
ROWS = "rows"
PENDING = "pending"
ACCUMULATORS = "accumulators"
#: the combiner's per-lane state (states written before 0.4 say "packer":
#: `engine.checkpoint.MIGRATIONS` renames it)
COMBINER = "combiner"
FLUSHED = "flushed"
DROPS = "drops"
DROP_DETAILS = "drop_details"
DROPPED = "dropped"
#: the lane a snapshot belongs to (set when a global state is made, `checkpoint.make_state`)
LANE = "lane"
#: with a mixture schedule: the phase gate's state (`engine.phases.PhaseGate`)
PHASE_GATE = PhaseGate.state_key

REQUIRED = (SOURCE, SOURCE_DONE, ROWS, PENDING, ACCUMULATORS, COMBINER, FLUSHED, DROPS, DROPPED,
            LANE)
#: every key of the lane's own schema; any other key is a hook's slice
SCHEMA = frozenset((*REQUIRED, DROP_DETAILS))


@dataclass
class LaneSnapshot:
    """A consistent cut of one lane between two rows, from which it continues exactly."""

    source: SourceState
    source_done: bool
    #: rows the lane has given
    rows: int
    #: per stateful operator position: origins on their way to it, oldest first
    pending: dict[str, list[Origin]]
    #: per accumulator position: its state (`Accumulator.state`)
    accumulators: dict[str, Any]
    #: the combiner's state (`Combiner.state`)
    combiner: Any
    #: operator positions whose stage has flushed (its input ended)
    flushed: list[int]
    #: drops not yet reported with a row, in order
    drops: list[tuple[Origin, str]]
    #: drops by reason so far
    dropped: dict[str, int]
    #: the detail of a pending drop, by origin (written only when there is one)
    drop_details: dict[Origin, str] = field(default_factory=dict)
    #: the lane hooks' slices, by their `state_key` (as JSON data)
    hooks: dict[str, Any] = field(default_factory=dict)
    lane: int | None = None

    def to_json(self) -> dict:
        """The snapshot as JSON data (the form a checkpoint holds)."""
        out: dict[str, Any] = {
            SOURCE: self.source.to_json(),
            SOURCE_DONE: self.source_done,
            ROWS: self.rows,
            PENDING: {k: [list(o) for o in v] for k, v in self.pending.items()},
            ACCUMULATORS: self.accumulators,
            COMBINER: self.combiner,
            FLUSHED: list(self.flushed),
            DROPS: [[*o, reason] for o, reason in self.drops],
        }
        if self.drop_details:
            out[DROP_DETAILS] = [[*o, self.drop_details[o]] for o, _ in self.drops
                                 if o in self.drop_details]
        out[DROPPED] = dict(sorted(self.dropped.items()))
        clash = sorted(set(self.hooks) & SCHEMA)
        if clash:
            raise ValueError(f"a lane hook's state_key {clash[0]!r} is a key of the lane "
                             "snapshot itself: give the hook a key of its own")
        out.update(self.hooks)
        if self.lane is not None:
            out[LANE] = self.lane
        return out

    @classmethod
    def from_json(cls, d: dict) -> LaneSnapshot:
        """A snapshot from JSON data (checked first where it comes from a file, `check`)."""
        return cls(
            source=SourceState.from_json(d[SOURCE]),
            source_done=bool(d[SOURCE_DONE]),
            rows=int(d[ROWS]),
            pending={str(k): [Origin(*o) for o in v] for k, v in d[PENDING].items()},
            accumulators=dict(d[ACCUMULATORS]),
            combiner=combiner_state(d),
            flushed=[int(i) for i in d[FLUSHED]],
            drops=[(Origin(*x[:5]), str(x[5])) for x in d[DROPS]],
            dropped={str(k): int(v) for k, v in d[DROPPED].items()},
            drop_details={Origin(*x[:5]): str(x[5]) for x in d.get(DROP_DETAILS, [])},
            hooks={k: v for k, v in d.items() if k not in SCHEMA},
            lane=int(d[LANE]) if LANE in d else None,
        )

    @staticmethod
    def check(snap: Any, lane: int, checker: LaneChecker) -> None:
        """Refuse a damaged snapshot of `lane`, naming the field (`CheckpointError`)."""
        if not isinstance(snap, dict):
            raise checker.fail(lane, "the lane state", "is not a mapping")
        missing = [k for k in REQUIRED if k not in snap]
        if missing:
            raise checker.fail(lane, f"field {sorted(missing)[0]!r}", "is missing")
        if snap[LANE] != lane:
            raise checker.fail(lane, "field 'lane'", f"says {snap[LANE]!r}: the states of lanes "
                               "were swapped or copied")
        _check_source(checker, lane, snap)
        if not isinstance(snap[SOURCE_DONE], bool):
            raise checker.fail(lane, SOURCE_DONE, "is not true or false")
        if snap[ROWS] != checker.rows:
            raise checker.fail(lane, ROWS, f"is {snap[ROWS]!r} at step {checker.step}, where "
                               f"every lane has given {checker.rows} rows")
        _check_operators(checker, lane, snap)
        _check_drops(checker, lane, snap)


def combiner_state(snap: dict, default: Any = None) -> Any:
    """The combiner's state in a snapshot's JSON (of a state at the current version:
    `migrate_state` renames the key older ones used); `default` where it has none."""
    if COMBINER in snap:
        return snap[COMBINER]
    if default is None:
        raise KeyError(COMBINER)
    return default


def _mixture(fingerprint: dict) -> bool:
    """A run whose sources follow a mixture schedule (phases with weights, or tokens)."""
    return any("weights" in p for p in fingerprint.get("phases", [])) or \
        fingerprint.get("mix_by") == "tokens"


def _check_source(checker: LaneChecker, lane: int, snap: dict) -> None:
    """The source's counters: one per dataset, adding up to its draws."""
    src = snap[SOURCE]
    if not (isinstance(src, dict) and is_count(src.get("draws"))
            and isinstance(src.get("counts"), list)
            and all(is_count(c) for c in src["counts"])):
        raise checker.fail(lane, "source", "is not {draws, counts} of non-negative integers")
    if len(src["counts"]) != len(checker.shards):
        raise checker.fail(lane, "source.counts", f"has {len(src['counts'])} entries for "
                           f"{len(checker.shards)} datasets")
    mixed_from = _check_relaned(checker, lane, src) if "relaned" in src else 0
    if sum(src["counts"]) != max(0, src["draws"] - mixed_from):
        raise checker.fail(lane, "source", f"counts {src['counts']} do not add up to draws "
                           f"{src['draws']}" + (f" past the relaned lane's first {mixed_from}"
                                                if mixed_from else ""))
    if _mixture(checker.fingerprint):
        _check_phases(checker, lane, snap)


def _check_operators(checker: LaneChecker, lane: int, snap: dict) -> None:
    """What the stateful operators hold: origins in flight, their own states, flushes."""
    draws = snap[SOURCE]["draws"]
    for key, want in ((PENDING, checker.stateful), (ACCUMULATORS, checker.accumulators)):
        if not isinstance(snap[key], dict) or set(snap[key]) != want:
            raise checker.fail(lane, key, "is not a mapping of operator positions "
                               f"{sorted(want, key=int)}")
    for stage, origins in snap[PENDING].items():
        if not isinstance(origins, list):
            raise checker.fail(lane, f"pending[{stage}]", "is not a list")
        for o in origins:
            checker.origin(lane, f"pending[{stage}]", o, draws)
    for position, state in snap[ACCUMULATORS].items():
        op = checker.ops[int(position)]
        op.check_state(state, OpChecks(checker, lane, f"accumulators[{position}] ({op.name})",
                                       draws))
    checker.ops[-1].check_state(snap[COMBINER], OpChecks(checker, lane, COMBINER, draws))
    flushed = snap[FLUSHED]
    if not (isinstance(flushed, list)
            and {str(i) for i in flushed if is_count(i)} <= checker.stateful
            and all(is_count(i) for i in flushed)):
        raise checker.fail(lane, FLUSHED, "is not a list of operator positions")


def _check_drops(checker: LaneChecker, lane: int, snap: dict) -> None:
    """Pending drops as [origin..., reason], their details, and the counts by reason."""
    draws = snap[SOURCE]["draws"]
    if not isinstance(snap[DROPS], list):
        raise checker.fail(lane, DROPS, "is not a list")
    for d in snap[DROPS]:
        if not (isinstance(d, list) and len(d) == 6 and isinstance(d[5], str)):
            raise checker.fail(lane, DROPS, f"holds {json.dumps(d)[:80]}, not [origin..., "
                               "reason]")
        checker.origin(lane, DROPS, d[:5], draws)
    pending = {tuple(d[:5]) for d in snap[DROPS]}
    details = snap.get(DROP_DETAILS, [])
    if not (isinstance(details, list) and all(
            isinstance(d, list) and len(d) == 6 and isinstance(d[5], str)
            and tuple(d[:5]) in pending for d in details)):
        raise checker.fail(lane, DROP_DETAILS, "is not a list of [origin..., detail] of "
                           "pending drops")
    dropped = snap[DROPPED]
    if not (isinstance(dropped, dict) and all(is_count(v) for v in dropped.values())):
        raise checker.fail(lane, DROPPED, "is not a mapping of reasons to counts")


def _check_relaned(checker: LaneChecker, lane: int, src: dict) -> int:
    """A lane re-dealt by a lane-count change (`engine.relane`); returns its first mixture
    draw."""
    rl = src["relaned"]
    n = len(checker.shards)
    if not (isinstance(rl, dict) and is_count(rl.get("base"))
            and isinstance(rl.get("carry"), list) and isinstance(rl.get("explicit"), list)
            and len(rl["explicit"]) == n and isinstance(rl.get("start"), list)
            and len(rl["start"]) == n and all(is_count(a) for a in rl["start"])
            and rl.get("stride") == checker.fingerprint["num_lanes"]):
        raise checker.fail(lane, "source.relaned", "is not {base, carry, explicit, start, "
                           f"stride}} for {n} datasets and stride num_lanes")
    if _mixture(checker.fingerprint):
        raise checker.fail(lane, "source.relaned", "is set in a run with a mixture schedule, "
                           "which a lane-count change refuses")
    for c in rl["carry"]:
        if not isinstance(c, list) or len(c) != 4:
            raise checker.fail(lane, "source.relaned.carry", f"holds {json.dumps(c)[:80]}, not "
                               "[dataset, shard, index, epoch]")
        checker.origin(lane, "source.relaned.carry", [0, *c], 1)
    for j, e in enumerate(rl["explicit"]):
        if not (isinstance(e, list) and all(is_count(x) for x in e)
                and all(a < b for a, b in zip(e, e[1:], strict=False))):
            raise checker.fail(lane, f"source.relaned.explicit[{j}]", "is not an increasing "
                               "list of positions")
    if src["draws"] < rl["base"]:
        raise checker.fail(lane, "source.draws", f"is {src['draws']}, below the relaned "
                           f"lane's base {rl['base']}")
    return rl["base"] + len(rl["carry"])


def _check_phases(checker: LaneChecker, lane: int, snap: dict) -> None:
    """A phased lane: its phase counters and its gate (engine.phases)."""
    src = snap[SOURCE]
    nds = len(checker.shards)
    phases = 1 + sum(1 for p in checker.fingerprint["phases"]
                     if p["start_step"] > 0 and "weights" in p)
    if not (is_count(src.get("phase")) and src["phase"] < phases
            and is_count(src.get("phase_start")) and src["phase_start"] <= src["draws"]):
        raise checker.fail(lane, "source.phase", f"is not a phase of the {phases}-phase "
                           "schedule with its start draw")
    counts = src.get("phase_counts")
    if not (isinstance(counts, list) and len(counts) == nds
            and all(is_count(c) for c in counts)
            and sum(counts) == src["draws"] - src["phase_start"]):
        raise checker.fail(lane, "source.phase_counts", "does not count the phase's draws "
                           "per dataset")
    gate = snap.get(PHASE_GATE)
    problem = gate_problem(gate, nds)
    if problem is not None:
        raise checker.fail(lane, *problem)
    for e in gate["tau"]:
        checker.origin(lane, "phase_gate.tau", e[:5], src["draws"])
    if len(gate["start_draws"]) != src["phase"] or \
            any(n > src["draws"] for n in gate["start_draws"]):
        raise checker.fail(lane, "phase_gate.start_draws", "is not the start draws of the "
                           f"{src['phase']} phases begun so far")
    if not (set(gate["acc_phase"]) <= checker.accumulators
            and all(v <= src["phase"] for v in gate["acc_phase"].values())):
        raise checker.fail(lane, "phase_gate.acc_phase", "is not a phase per accumulator")
