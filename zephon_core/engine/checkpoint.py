"""Checkpoints are data: versioned JSON, a fingerprint of the recipe, per-lane states.

A state is *global* when it holds every lane; any rank count `D'` dividing `L`
restores from it by taking its own lanes. `merge_states` builds it from the
local states of ranks simulated in one process; `gather_global_state` builds
it over `torch.distributed` (a gloo group, so it works beside NCCL).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zephon_core.common.files import atomic_write
from zephon_core.data.readers import ExplainsChanges
from zephon_core.engine.snapshot import COMBINER, LaneSnapshot
from zephon_core.engine.state_check import (
    CHECKSUM_KEY,
    LaneChecker,
    check_checksum,
    is_count,
    later_fields_note,
    parse_state,
    state_checksum,
    without_later_fields,
)
from zephon_core.errors import CheckpointError

#: the ``format`` field of every saved state: a state without it is refused as not zephon's
FORMAT = "zephon-checkpoint"
#: 2: lane snapshots name their lane, and the state carries a SHA-256 of itself;
#: 3: a lane's combiner state is under "combiner" (version 2 wrote "packer" until 0.3)
VERSION = 3


def _from_v1(state: dict) -> dict:
    """Version 1 (0.1.0) -> 2: each lane snapshot names its lane, and the state gets the
    SHA-256 it then lacked (so a damaged version-1 state is caught by the field checks
    alone, as it was under 0.1.0)."""
    lanes = state.get("lanes")
    if isinstance(lanes, dict):
        lanes = {k: ({**v, "lane": int(k)} if isinstance(v, dict) and k.isdigit() else v)
                 for k, v in lanes.items()}
    out = {**state, "lanes": lanes, "version": 2}
    out[CHECKSUM_KEY] = state_checksum(out)
    return out


#: the combiner's key in the lane states of versions 1 and 2 up to 0.3 (`_from_v2`)
_PACKER = "packer"


def _from_v2(state: dict) -> dict:
    """Version 2 -> 3: the combiner's state moves from a lane's ``packer`` key (0.1 to 0.3)
    to ``combiner``, the key 0.4 writes, so only this function knows the old one. The
    state's SHA-256 is made again only where the old one matched: a damaged state is still
    refused by it, after the field checks had their chance to name the field."""
    lanes = state.get("lanes")
    if isinstance(lanes, dict):
        lanes = {k: _combiner_key(k, v) for k, v in lanes.items()}
    out = {**state, "lanes": lanes, "version": 3}
    if state.get(CHECKSUM_KEY) == state_checksum(state):
        out[CHECKSUM_KEY] = state_checksum(out)
    return out


def _combiner_key(lane: str, snap: Any) -> Any:
    if not isinstance(snap, dict) or _PACKER not in snap:
        return snap
    if COMBINER in snap:
        raise CheckpointError(f"lane {lane}: the checkpoint's lane state is corrupt: field "
                              f"{_PACKER!r} (the combiner's key before 0.4) is set beside "
                              f"{COMBINER!r}; restore from an intact checkpoint file")
    out = {k: v for k, v in snap.items() if k != _PACKER}
    out[COMBINER] = snap[_PACKER]
    return out


#: the one table of older states: version -> the function that makes it the next version.
#: A change of the state's layout bumps `VERSION` and adds its row here.
MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: _from_v1, 2: _from_v2}


def migrate_state(state: Any) -> Any:
    """`state` at `VERSION`: an older one through `MIGRATIONS`, row by row (a new dict;
    `state` is left as it is); a newer or unknown version is refused, naming it. What is
    not a zephon state passes unchanged, for `check_state` to refuse."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return state
    version = state.get("version")
    while version != VERSION:
        if is_count(version) and version > VERSION:
            raise CheckpointError(f"checkpoint version {version} was written by a newer zephon "
                                  f"than this one (which reads versions up to {VERSION}); "
                                  "upgrade zephon-vl to restore it")
        if version not in MIGRATIONS:
            raise CheckpointError(f"checkpoint version {version!r} is not one zephon wrote "
                                  f"(known: {', '.join(map(str, sorted(MIGRATIONS)))} and "
                                  f"{VERSION}); the checkpoint is corrupt")
        state = MIGRATIONS[version](state)
        version = state["version"]
    return state


def fingerprint_digest(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()


#: the global batch sizes resumes asked for, [[step, G], ...]; absent when none did
RESIZED_KEY = "global_batch_sizes"


def resized_of(state: Any) -> list[tuple[int, int]]:
    """The (step, G) changes a state's resumes asked for; refuses a malformed list."""
    found = state.get(RESIZED_KEY, []) if isinstance(state, dict) else []
    if not (isinstance(found, list) and all(
            isinstance(e, list) and len(e) == 2 and all(is_count(x) for x in e) and e[1] > 0
            for e in found)):
        raise CheckpointError(f"checkpoint is corrupt: {RESIZED_KEY} is not a list of "
                              "[step, global batch size]")
    return [(int(s), int(g)) for s, g in found]


#: the lane-count changes of the run's resumes, [[step, L, L2], ...]; absent when none
LANES_KEY = "lane_changes"


def lane_changes_of(state: Any) -> list[tuple[int, int, int]]:
    """The (step, old L, new L) lane-count changes a state records; refuses a malformed list."""
    found = state.get(LANES_KEY, []) if isinstance(state, dict) else []
    if not (isinstance(found, list) and all(
            isinstance(e, list) and len(e) == 3 and all(is_count(x) for x in e)
            and e[1] > 0 and e[2] > 0 for e in found)):
        raise CheckpointError(f"checkpoint is corrupt: {LANES_KEY} is not a list of "
                              "[step, old lanes, new lanes]")
    return [(int(s), int(a), int(b)) for s, a, b in found]


def _own(data: Any) -> Any:
    """A copy of JSON data's dicts and lists (anything else is immutable and kept)."""
    if isinstance(data, dict):
        return {k: _own(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_own(v) for v in data]
    return data


def make_state(fingerprint: dict, step: int, lanes: dict[int, dict], num_lanes: int,
               resized: list[tuple[int, int]] | None = None,
               lane_changes: list[tuple[int, int, int]] | None = None) -> dict:
    state = {
        "format": FORMAT,
        "version": VERSION,
        "fingerprint": fingerprint,
        "fingerprint_sha256": fingerprint_digest(fingerprint),
        "num_lanes": num_lanes,
        "step": step,
        # copies: a lane's snapshot shares unchanging parts with the live lane (the shuffle
        # buffer's origin lists), and a state is the caller's to change
        "lanes": {str(k): {**_own(v), "lane": k} for k, v in sorted(lanes.items())},
    }
    if resized:
        state[RESIZED_KEY] = [[s, g] for s, g in resized]
    if lane_changes:
        state[LANES_KEY] = [list(c) for c in lane_changes]
    state[CHECKSUM_KEY] = state_checksum(state)
    return state


def first_difference(a: Any, b: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first path (dotted, with [i] for list items) where JSON values `a` and `b` differ.

    List items that carry a ``name`` (a dataset, a shard) are named after the path,
    so a refusal says which shard changed, not only its position.
    """
    found = _difference(a, b, path, ())
    if found is None:
        return None
    where, names, theirs, ours = found
    return (f"{where} ({' / '.join(names)})" if names else where, theirs, ours)


def _difference(a: Any, b: Any, path: str,
                names: tuple[str, ...]) -> tuple[str, tuple[str, ...], Any, Any] | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return (f"{path}.{k}", names, a.get(k, "<missing>"), b.get(k, "<missing>"))
            found = _difference(a[k], b[k], f"{path}.{k}", names)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return (f"{path} (length)", names, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            named = (x["name"],) if isinstance(x, dict) and isinstance(x.get("name"), str) else ()
            found = _difference(x, y, f"{path}[{i}]", names + named)
            if found:
                return found
        return None
    return None if a == b else (path, names, a, b)


def short_json(v: Any) -> str:
    """`v` as JSON, cut to 120 characters for an error message."""
    text = json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def check_fingerprint(recorded: dict, fingerprint: dict,
                      readers: Sequence[Any] | None = None) -> None:
    """Refuse a checkpoint whose fingerprint `recorded` is not `fingerprint`, naming the first
    field that differs; where it is a shard's and the dataset's reader (`readers`, in
    dataset order) can say what changed in it (`ExplainsChanges`), that too.

    A recorded fingerprint written before a shard identity field existed (one declared with
    `later_field`) matches without it, with a warning.
    """
    ours, missing = without_later_fields(recorded, fingerprint)
    diff = first_difference(recorded, ours, "fingerprint")
    if diff:
        path, theirs, here = diff
        note = _shard_change(recorded, ours, path, readers)
        if note:
            raise CheckpointError(
                f"checkpoint was made with other data: {path} is {short_json(theirs)} in the "
                f"checkpoint but {short_json(here)} here: {note}. Resume with the data the "
                "checkpoint was made with, or start a new run")
        hint = (" (or change the lane count on purpose: load_state_dict(state, "
                "allow_lane_change=True), --resume-lanes; docs/elastic-changes.md)"
                if path == "fingerprint.num_lanes" else "")
        raise CheckpointError(
            f"checkpoint was made with another recipe: {path} is {short_json(theirs)} in the "
            f"checkpoint but {short_json(here)} here. Restore with the same setting{hint}, or "
            "start a new run")
    if missing:
        warnings.warn(later_fields_note(missing), UserWarning, stacklevel=3)


def _shard_change(recorded: dict, ours: dict, path: str,
                  readers: Sequence[Any] | None) -> str | None:
    """What the reader says changed in the shard whose identity holds `path` (None: the
    difference is not in a shard, or its reader cannot say)."""
    if readers is None:
        return None
    for i, reader in enumerate(readers):
        if not (isinstance(reader, ExplainsChanges) and
                path.startswith(f"fingerprint.datasets[{i}].shards[")):
            continue
        for j, shard in enumerate(recorded["datasets"][i]["shards"]):
            if path.startswith(f"fingerprint.datasets[{i}].shards[{j}].") and \
                    shard != ours["datasets"][i]["shards"][j]:
                return reader.identity_change(j, shard)
    return None


def check_state(state: Any, fingerprint: dict, lanes: list[int], ops: list[Any],
                rows: int | None = None, readers: Sequence[Any] | None = None) -> None:
    """Refuse a state that is not ours or is damaged, naming what is wrong and how to fix it.

    Every lane is checked, not only `lanes` (the ones this rank restores), so
    all ranks refuse a damaged state alike. `rows`: the rows every lane has
    given by the state's step (default: step * G / L). `readers`: the datasets'
    readers, to say what changed in a shard (`check_fingerprint`).
    """
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError("not a zephon checkpoint (no 'format': 'zephon-checkpoint'); "
                              "pass the dict returned by state_dict()")
    if state.get("version") != VERSION:
        migrate_state(state)  # refuses a newer or unknown version, naming it
        raise CheckpointError(f"checkpoint version {state['version']} must be migrated before "
                              "it is checked: pass it through migrate_state")
    for key in ("fingerprint", "fingerprint_sha256", "num_lanes", "step", "lanes",
                CHECKSUM_KEY):
        if key not in state:
            raise CheckpointError(f"checkpoint is truncated or corrupt: field {key!r} is missing")
    if not is_count(state["step"]):
        raise CheckpointError(f"checkpoint is corrupt: step is {state['step']!r}, not a count")
    if not isinstance(state["lanes"], dict):
        raise CheckpointError("checkpoint is corrupt: 'lanes' is not a mapping of lane states")
    if not isinstance(state["fingerprint"], dict) or \
            fingerprint_digest(state["fingerprint"]) != state["fingerprint_sha256"]:
        raise CheckpointError("checkpoint is corrupt: its fingerprint does not match its "
                              "fingerprint_sha256 (the file was edited or damaged)")
    check_fingerprint(state["fingerprint"], fingerprint, readers)
    if state["num_lanes"] != fingerprint["num_lanes"]:
        raise CheckpointError(f"checkpoint is corrupt: num_lanes is {state['num_lanes']!r} but "
                              f"its fingerprint says {fingerprint['num_lanes']}")
    missing = [lane for lane in lanes if str(lane) not in state["lanes"]]
    if missing:
        raise CheckpointError(
            f"checkpoint lacks the states of lanes {missing[:8]}: it is a rank-local state. "
            "Save the global state (state_dict() with torch.distributed initialized, or "
            "merge_states over all ranks) to resume on another rank count")
    lane_changes_of(state)
    checker = LaneChecker(fingerprint, state["step"], ops, rows)
    for key, snap in state["lanes"].items():
        if not (key.isdigit() and int(key) < fingerprint["num_lanes"]):
            raise CheckpointError(f"checkpoint is corrupt: it holds a state for lane {key!r} of "
                                  f"a {fingerprint['num_lanes']}-lane run")
        LaneSnapshot.check(snap, int(key), checker)
    check_checksum(state)


def merge_states(states: list[dict]) -> dict:
    """One global state from the local states of all ranks (same step, same recipe)."""
    if not states:
        raise CheckpointError("merge_states needs at least one state")
    for s in states:
        check_checksum(s)
    first = states[0]
    lanes: dict[int, dict] = {}
    for s in states:
        if s.get("fingerprint_sha256") != first.get("fingerprint_sha256"):
            raise CheckpointError("cannot merge states of different recipes (fingerprints differ)")
        for key in (RESIZED_KEY, LANES_KEY):
            if s.get(key) != first.get(key):
                raise CheckpointError(f"cannot merge states that disagree on {key}")
        if s.get("step") != first.get("step"):
            raise CheckpointError(f"cannot merge states of different steps: {first.get('step')} "
                                  f"and {s.get('step')}; take them at the same step boundary")
        for k, v in s["lanes"].items():
            if int(k) in lanes and lanes[int(k)] != v:
                raise CheckpointError(f"two ranks disagree on the state of lane {k}")
            lanes[int(k)] = v
    return make_state(first["fingerprint"], first["step"], lanes, first["num_lanes"],
                      resized_of(first), lane_changes_of(first))


def gather_global_state(local: dict) -> dict:
    """All-gather the local states of every rank over gloo; every rank returns the same dict.

    The states travel as JSON bytes, not pickles.
    """

    return merge_states(all_gather_json(local))


def all_gather_json(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, sent as JSON bytes over gloo (never pickles)."""
    import torch
    import torch.distributed as dist

    group = gloo_group()
    blob = json.dumps(obj, sort_keys=True).encode()
    size = torch.tensor([len(blob)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, size, group=group)
    longest = int(max(s.item() for s in sizes))
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[:len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    bufs = [torch.zeros(longest, dtype=torch.uint8) for _ in sizes]
    dist.all_gather(bufs, mine, group=group)
    return [json.loads(b[:int(n.item())].numpy().tobytes())
            for b, n in zip(bufs, sizes, strict=True)]


_GLOO: Any = None


def gloo_group() -> Any:
    """A gloo group over every rank: WORLD itself, or one made once beside NCCL.

    Only a weak reference is cached: torch's registry owns the group, so
    ``destroy_process_group`` really frees it. A strong module-level reference
    kept gloo's threads alive into interpreter shutdown, where joining them
    aborted the process (``terminate called without an active exception``).
    """
    import weakref

    import torch.distributed as dist

    global _GLOO
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    group = _GLOO() if _GLOO is not None else None
    if group is None:
        group = dist.new_group(backend="gloo")
        _GLOO = weakref.ref(group)
    return group


def save_state(state: dict, path: str | Path) -> None:
    """Write a state as JSON (atomically)."""
    atomic_write(path, json.dumps(state, sort_keys=True))


def load_state(path: str | Path) -> dict:
    """Read a state file; it is checked in full when a loader restores it."""
    return parse_state(Path(path).read_bytes(), str(path))
