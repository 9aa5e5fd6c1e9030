"""Refuse a damaged checkpoint before any of it is used (guarantee 9).

A state is checked in three layers, each naming what it found:

1. *Parsing*: a size limit and a nesting-depth limit, so a hostile or damaged
   file fails with `CheckpointError`, never `RecursionError` or memory
   exhaustion.
2. *Fields*: every field of the header and of every lane snapshot has the
   right type and range and agrees with the recipe (origins point inside the
   data, counters are consistent with each other and with the step). This
   names the field, which is what a user needs when a tool wrote a bad state.
3. *Checksum*: a SHA-256 over the canonical JSON of the whole state. Any
   edit that leaves the fields plausible (a flipped digit, lanes swapped)
   still fails here, so a damaged state is never accepted with other batches.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from zephon_core.errors import CheckpointError

#: far above any real state (about 7 KB per lane), far below what would exhaust memory
MAX_STATE_BYTES = 256 << 20
#: real states nest about 6 deep
MAX_DEPTH = 32
CHECKSUM_KEY = "state_sha256"


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


def state_checksum(state: dict) -> str:
    """SHA-256 of the canonical JSON of the state without its own checksum field."""
    return hashlib.sha256(canonical({k: v for k, v in state.items()
                                     if k != CHECKSUM_KEY})).hexdigest()


def _depth_ok(obj: Any) -> bool:
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return True


def parse_state(text: str | bytes, where: str) -> dict:
    """JSON text -> state dict, refusing what is too large, too deep or not JSON."""
    if len(text) > MAX_STATE_BYTES:
        raise CheckpointError(f"{where}: {len(text)} bytes is more than a zephon state can be "
                              f"({MAX_STATE_BYTES} bytes); this is not a zephon checkpoint")
    try:
        state = json.loads(text)
    except RecursionError:
        raise CheckpointError(f"{where}: JSON nested deeper than a zephon state can be; the "
                              "checkpoint file is corrupt") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{where} is not valid JSON ({exc}); the checkpoint file is "
                              "truncated or corrupt") from None
    if not _depth_ok(state):
        raise CheckpointError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels; the "
                              "checkpoint file is corrupt")
    return state


def check_checksum(state: dict) -> None:
    found = state.get(CHECKSUM_KEY)
    if not isinstance(found, str):
        raise CheckpointError(f"checkpoint is truncated or corrupt: field {CHECKSUM_KEY!r} is "
                              "missing")
    if found != state_checksum(state):
        raise CheckpointError(
            "checkpoint is corrupt: its content does not match its SHA-256 "
            f"({CHECKSUM_KEY}); the file was damaged or edited after it was written. Restore "
            "from an intact copy (an earlier checkpoint); never edit a state by hand")


def is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


class _OpChecks:
    """`StateChecks` for one operator's state in one lane (see `StatefulOp.check_state`)."""

    def __init__(self, checker: LaneChecker, lane: int, where: str, draws: int) -> None:
        self.checker, self.lane, self.where, self.draws = checker, lane, where, draws

    def origin(self, field: str, value: Any) -> None:
        self.checker.origin(self.lane, f"{self.where}.{field}", value, self.draws)

    def fail(self, field: str, problem: str) -> Exception:
        return self.checker.fail(self.lane, f"{self.where}.{field}", problem)


class LaneChecker:
    """Field checks of one lane snapshot against the recipe's fingerprint and operators.

    Stateful stages are named by their operator's position in the recipe
    (`ops`); each operator checks its own part (`StatefulOp.check_state`).
    """

    def __init__(self, fingerprint: dict, step: int, ops: list[Any],
                 rows: int | None = None) -> None:
        from zephon_core.ops.contract import AccumulatorOp, StatefulOp

        self.fingerprint = fingerprint
        self.step = step
        self.ops = ops
        self.accumulators = {str(i) for i, op in enumerate(ops) if isinstance(op, AccumulatorOp)}
        self.stateful = {str(i) for i, op in enumerate(ops) if isinstance(op, StatefulOp)}
        self.rows_per_lane = fingerprint["global_batch_size"] // fingerprint["num_lanes"]
        self.rows = step * self.rows_per_lane if rows is None else rows
        self.epochs = fingerprint.get("epochs")
        self.shards: list[list[int | None]] = []
        for d in fingerprint["datasets"]:
            self.shards.append([s.get("samples", s.get("num_samples")) for s in d["shards"]])

    def fail(self, lane: int, field: str, problem: str) -> CheckpointError:
        return CheckpointError(
            f"lane {lane}: the checkpoint's lane state is corrupt: {field} {problem}; restore "
            "from an intact checkpoint file")

    def origin(self, lane: int, field: str, o: Any, draws: int) -> None:
        if not (isinstance(o, list) and len(o) == 5 and all(is_count(x) for x in o)):
            raise self.fail(lane, field, f"holds {json.dumps(o)[:80]}, not an origin "
                            "[seq, dataset, shard, index, epoch]")
        seq, ds, shard, index, epoch = o
        if seq >= draws:
            raise self.fail(lane, field, f"holds draw {seq} but the source has made {draws}")
        if ds >= len(self.shards) or shard >= len(self.shards[ds]):
            raise self.fail(lane, field, f"points at dataset {ds} shard {shard}, outside the data")
        size = self.shards[ds][shard]
        if size is not None and index >= size:
            raise self.fail(lane, field, f"points at sample {index} of a {size}-sample shard")
        if self.epochs is not None and epoch >= self.epochs:
            raise self.fail(lane, field, f"is in epoch {epoch} of a {self.epochs}-epoch run")

    def check(self, lane: int, snap: Any) -> None:
        if not isinstance(snap, dict):
            raise self.fail(lane, "the lane state", "is not a mapping")
        want = {"source", "source_done", "rows", "pending", "accumulators", "packer", "flushed",
                "drops", "dropped", "lane"}
        missing = sorted(want - set(snap))
        if missing:
            raise self.fail(lane, f"field {missing[0]!r}", "is missing")
        if snap["lane"] != lane:
            raise self.fail(lane, "field 'lane'", f"says {snap['lane']!r}: the states of lanes "
                            "were swapped or copied")
        src = snap["source"]
        if not (isinstance(src, dict) and is_count(src.get("draws"))
                and isinstance(src.get("counts"), list)
                and all(is_count(c) for c in src["counts"])):
            raise self.fail(lane, "source", "is not {draws, counts} of non-negative integers")
        if len(src["counts"]) != len(self.shards):
            raise self.fail(lane, "source.counts", f"has {len(src['counts'])} entries for "
                            f"{len(self.shards)} datasets")
        mixed_from = self._check_relaned(lane, src) if "relaned" in src else 0
        if sum(src["counts"]) != max(0, src["draws"] - mixed_from):
            raise self.fail(lane, "source", f"counts {src['counts']} do not add up to draws "
                            f"{src['draws']}" + (f" past the relaned lane's first {mixed_from}"
                                                 if mixed_from else ""))
        if any("weights" in p for p in self.fingerprint.get("phases", [])) or \
                self.fingerprint.get("mix_by") == "tokens":
            self._check_phases(lane, snap)
        if not isinstance(snap["source_done"], bool):
            raise self.fail(lane, "source_done", "is not true or false")
        if snap["rows"] != self.rows:
            raise self.fail(lane, "rows", f"is {snap['rows']!r} at step {self.step}, where every "
                            f"lane has given {self.rows} rows")
        draws = src["draws"]
        for key, want in (("pending", self.stateful), ("accumulators", self.accumulators)):
            if not isinstance(snap[key], dict) or set(snap[key]) != want:
                raise self.fail(lane, key, f"is not a mapping of operator positions "
                                f"{sorted(want, key=int)}")
        for stage, origins in snap["pending"].items():
            if not isinstance(origins, list):
                raise self.fail(lane, f"pending[{stage}]", "is not a list")
            for o in origins:
                self.origin(lane, f"pending[{stage}]", o, draws)
        for position, state in snap["accumulators"].items():
            op = self.ops[int(position)]
            op.check_state(state, _OpChecks(self, lane, f"accumulators[{position}] "
                                            f"({op.name})", draws))
        self.ops[-1].check_state(snap["packer"], _OpChecks(self, lane, "packer", draws))
        if not (isinstance(snap["flushed"], list)
                and {str(i) for i in snap["flushed"] if is_count(i)} <= self.stateful
                and all(is_count(i) for i in snap["flushed"])):
            raise self.fail(lane, "flushed", "is not a list of operator positions")
        if not isinstance(snap["drops"], list):
            raise self.fail(lane, "drops", "is not a list")
        for d in snap["drops"]:
            if not (isinstance(d, list) and len(d) == 6 and isinstance(d[5], str)):
                raise self.fail(lane, "drops", f"holds {json.dumps(d)[:80]}, not [origin..., "
                                "reason]")
            self.origin(lane, "drops", d[:5], draws)
        pending = {tuple(d[:5]) for d in snap["drops"]}
        details = snap.get("drop_details", [])
        if not (isinstance(details, list) and all(
                isinstance(d, list) and len(d) == 6 and isinstance(d[5], str)
                and tuple(d[:5]) in pending for d in details)):
            raise self.fail(lane, "drop_details", "is not a list of [origin..., detail] of "
                            "pending drops")
        dropped = snap["dropped"]
        if not (isinstance(dropped, dict) and all(is_count(v) for v in dropped.values())):
            raise self.fail(lane, "dropped", "is not a mapping of reasons to counts")

    def _check_relaned(self, lane: int, src: dict) -> int:
        """A lane re-dealt by a lane-count change (`engine.relane`); returns its first mixture
        draw."""
        rl = src["relaned"]
        n = len(self.shards)
        if not (isinstance(rl, dict) and is_count(rl.get("base"))
                and isinstance(rl.get("carry"), list) and isinstance(rl.get("explicit"), list)
                and len(rl["explicit"]) == n and isinstance(rl.get("start"), list)
                and len(rl["start"]) == n and all(is_count(a) for a in rl["start"])
                and rl.get("stride") == self.fingerprint["num_lanes"]):
            raise self.fail(lane, "source.relaned", "is not {base, carry, explicit, start, "
                            f"stride}} for {n} datasets and stride num_lanes")
        if any("weights" in p for p in self.fingerprint.get("phases", [])) or \
                self.fingerprint.get("mix_by") == "tokens":
            raise self.fail(lane, "source.relaned", "is set in a run with a mixture schedule, "
                            "which a lane-count change refuses")
        for c in rl["carry"]:
            if not isinstance(c, list) or len(c) != 4:
                raise self.fail(lane, "source.relaned.carry", f"holds {json.dumps(c)[:80]}, not "
                                "[dataset, shard, index, epoch]")
            self.origin(lane, "source.relaned.carry", [0, *c], 1)
        for j, e in enumerate(rl["explicit"]):
            if not (isinstance(e, list) and all(is_count(x) for x in e)
                    and all(a < b for a, b in zip(e, e[1:], strict=False))):
                raise self.fail(lane, f"source.relaned.explicit[{j}]", "is not an increasing "
                                "list of positions")
        mixed_from = rl["base"] + len(rl["carry"])
        if src["draws"] < rl["base"]:
            raise self.fail(lane, "source.draws", f"is {src['draws']}, below the relaned "
                            f"lane's base {rl['base']}")
        return mixed_from

    def _check_phases(self, lane: int, snap: dict) -> None:
        """A phased lane: its phase counters and its gate (engine.phases)."""
        src = snap["source"]
        phases = 1 + sum(1 for p in self.fingerprint["phases"]
                         if p["start_step"] > 0 and "weights" in p)
        if not (is_count(src.get("phase")) and src["phase"] < phases
                and is_count(src.get("phase_start")) and src["phase_start"] <= src["draws"]):
            raise self.fail(lane, "source.phase", f"is not a phase of the {phases}-phase "
                            "schedule with its start draw")
        counts = src.get("phase_counts")
        if not (isinstance(counts, list) and len(counts) == len(self.shards)
                and all(is_count(c) for c in counts)
                and sum(counts) == src["draws"] - src["phase_start"]):
            raise self.fail(lane, "source.phase_counts", "does not count the phase's draws "
                            "per dataset")
        gate = snap.get("phase_gate")
        if not (isinstance(gate, dict) and isinstance(gate.get("entries"), list)
                and isinstance(gate.get("tau"), list)
                and all(isinstance(e, list) and len(e) == 5 and all(is_count(x) for x in e)
                        and e[3] < len(self.shards) for e in gate["entries"])
                and all(isinstance(e, list) and len(e) == 6 and is_count(e[5])
                        for e in gate["tau"])):
            raise self.fail(lane, "phase_gate", "is not {entries: [[trigger, rows, phase, "
                            "dataset, tokens]...], tau: [[origin..., trigger]...]}")
        for key in ("settled_tokens", "settled_samples"):
            v = gate.get(key)
            if not (isinstance(v, list) and len(v) == len(self.shards)
                    and all(is_count(x) for x in v)):
                raise self.fail(lane, f"phase_gate.{key}", "is not a count per dataset")
        for e in gate["tau"]:
            self.origin(lane, "phase_gate.tau", e[:5], src["draws"])
        starts = gate.get("start_draws")
        if not (isinstance(starts, list) and len(starts) == src["phase"]
                and all(is_count(n) and n <= src["draws"] for n in starts)
                and starts == sorted(starts)):
            raise self.fail(lane, "phase_gate.start_draws", f"is not the start draws of the "
                            f"{src['phase']} phases begun so far")
        acc = gate.get("acc_phase")
        if not (isinstance(acc, dict) and set(acc) <= self.accumulators
                and all(is_count(v) and v <= src["phase"] for v in acc.values())):
            raise self.fail(lane, "phase_gate.acc_phase", "is not a phase per accumulator")
