"""Refuse a damaged checkpoint before any of it is used (guarantee 9).

A state is checked in three layers, each naming what it found:

1. *Parsing*: a size limit and a nesting-depth limit, so a hostile or damaged
   file fails with `CheckpointError`, never `RecursionError` or memory
   exhaustion.
2. *Fields*: every field of the header and of every lane snapshot has the
   right type and range and agrees with the recipe (origins point inside the
   data, counters are consistent with each other and with the step). This
   names the field, which is what a user needs when a tool wrote a bad state.
   The lane snapshot's fields are checked beside their schema
   (`engine.snapshot.LaneSnapshot.check`); `LaneChecker` here is the recipe's
   side of it.
3. *Checksum*: a SHA-256 over the canonical JSON of the whole state. Any
   edit that leaves the fields plausible (a flipped digit, lanes swapped)
   still fails here, so a damaged state is never accepted with other batches.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from zephon_core.common.jsontext import is_count
from zephon_core.common.later import SHARD_IDENTITY, LaterField, later_fields
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


#: a shard's sample count in a fingerprint: core readers write "samples", the WebDataset
#: reader "num_samples" (its manifest's name). Renaming either would change the fingerprint,
#: and so refuse every checkpoint written before, so both stay and are read here only.
SAMPLE_KEYS = ("samples", "num_samples")


def shard_samples(shard: dict) -> int | None:
    """A fingerprint's sample count of one shard (None where the reader records none)."""
    for key in SAMPLE_KEYS:
        if key in shard:
            return shard[key]
    return None


def without_later_fields(recorded: Any, ours: dict) -> tuple[dict, list[str]]:
    """`ours` without the shard identity fields a later release added (`later_field`,
    declared where a reader writes them) that the shards of fingerprint `recorded` lack,
    and the paths left out: a fingerprint written before such a field still matches. Only
    where both list the same datasets and shards: any other difference is the mismatch to
    name."""
    theirs = recorded.get("datasets") if isinstance(recorded, dict) else None
    mine = ours.get("datasets")
    if not (isinstance(theirs, list) and isinstance(mine, list) and len(theirs) == len(mine)):
        return ours, []
    missing: list[str] = []
    datasets = []
    for i, (t, m) in enumerate(zip(theirs, mine, strict=True)):
        t_shards = t.get("shards") if isinstance(t, dict) else None
        if not (isinstance(t_shards, list) and len(t_shards) == len(m["shards"])):
            datasets.append(m)
            continue
        shards = []
        for j, (ts, ms) in enumerate(zip(t_shards, m["shards"], strict=True)):
            only_ours = [k for k in ms if isinstance(ts, dict) and k not in ts]
            gone = [k for k in only_ours if k in _later_shard_fields(ms)] if only_ours else []
            missing += [f"fingerprint.datasets[{i}].shards[{j}].{k}" for k in gone]
            shards.append({k: v for k, v in ms.items() if k not in gone} if gone else ms)
        datasets.append({**m, "shards": shards})
    return ({**ours, "datasets": datasets} if missing else ours), missing


def _later_shard_fields(shard: dict) -> dict[str, LaterField]:
    """The later fields of shard identities; a shard that names its format (``"format"``)
    has that format's module imported first, which declares those its readers write."""
    name = shard.get("format")
    if isinstance(name, str):
        from zephon_core.data.formats import data_format, known_formats

        if name in known_formats():
            data_format(name)
    return later_fields(SHARD_IDENTITY)


def later_fields_note(missing: list[str]) -> str:
    """The warning for a fingerprint written before `missing` (paths) existed."""
    field = missing[0].rsplit(".", 1)[-1]
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    later = later_fields(SHARD_IDENTITY)[field]
    return (f"checkpoint was written before fingerprints recorded {field} (zephon-vl "
            f"{later.since}; {missing[0]}{more}: {later.covers}); it restores, but this resume "
            "cannot check that those are unchanged. Checkpoints written from now on record it")


class OpChecks:
    """`StateChecks` for one operator's state in one lane (see `StatefulOp.check_state`)."""

    def __init__(self, checker: LaneChecker, lane: int, where: str, draws: int) -> None:
        self.checker, self.lane, self.where, self.draws = checker, lane, where, draws

    def origin(self, field: str, value: Any) -> None:
        self.checker.origin(self.lane, f"{self.where}.{field}", value, self.draws)

    def fail(self, field: str, problem: str) -> Exception:
        return self.checker.fail(self.lane, f"{self.where}.{field}", problem)


class LaneChecker:
    """The recipe's side of checking lane snapshots (`engine.snapshot.LaneSnapshot.check`):
    its fingerprint, operators and step, and the origin check every field shares.

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
            self.shards.append([shard_samples(s) for s in d["shards"]])

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
