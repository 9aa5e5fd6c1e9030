"""`zephon-vl inspect STATE`: what a checkpoint holds, without running anything.

STATE is a state JSON (`Loader.state_dict()` saved, `digest --state-out`, or
a ZephonDataLoader ``state_dict()``) or a TorchTitan DCP checkpoint folder,
whose ``dataloader.zephon_state`` entry is read with
torch.distributed.checkpoint in this process (no process group). Prints the
recipe fingerprint, the step, and per lane the source position (draws, and
per dataset the elements taken and the epoch they are in) and the elements
buffered (in flight, in accumulators such as a shuffle buffer, in the
packer's open rows), and the realized shares per dataset over all lanes
(samples drawn; in each lane's current phase; settled tokens with
``mix_by = "tokens"``); ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

from zephon_core import CheckpointError
from zephon_core.extend import parse_state
from zephon_core.internals import CHECKPOINT_FORMAT as FORMAT
from zephon_core.internals import combiner_state, migrate_state, shard_samples
from zephon_vl.cli.registry import command
from zephon_vl.titan.state import STATE_FORMAT, STATE_KEY


class _Holder:
    """A Stateful that receives the dataloader entry of a DCP checkpoint."""

    def __init__(self) -> None:
        self.value: dict[str, Any] = {STATE_KEY: ""}

    def state_dict(self) -> dict[str, Any]:
        return self.value

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = dict(state)


def _from_dcp(folder: Path) -> Any:
    if not (folder / ".metadata").is_file():
        raise CheckpointError(f"{folder} is a folder but not a torch.distributed.checkpoint "
                              "(no .metadata file); pass a DCP checkpoint folder or a state "
                              "JSON file")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    try:
        meta = FileSystemReader(str(folder)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - any unreadable metadata is the same answer
        raise CheckpointError(f"{folder}: its DCP metadata cannot be read "
                              f"({type(exc).__name__}: {exc}); the checkpoint is damaged or "
                              "not a DCP checkpoint") from None
    keys = [k for k in meta.state_dict_metadata if k.endswith(STATE_KEY)]
    if not keys:
        raise CheckpointError(f"{folder}: the checkpoint has no '{STATE_KEY}' entry (no zephon "
                              "dataloader was saved in it); found "
                              f"{sorted(meta.state_dict_metadata)[:6]}")
    prefix = keys[0][:-len(STATE_KEY)].rstrip(".")
    holder = _Holder()
    target: dict[str, Any] = {prefix: holder} if prefix else holder.value
    with warnings.catch_warnings():  # "assuming ... a single process": that is the intent
        warnings.simplefilter("ignore", UserWarning)
        try:
            dcp.load(target, checkpoint_id=str(folder), no_dist=True)
        except Exception as exc:  # noqa: BLE001 - DCP wraps every failure differently
            raise CheckpointError(f"{folder}: reading '{keys[0]}' failed "
                                  f"({type(exc).__name__}: {str(exc)[:200]}); the checkpoint "
                                  "is damaged or incomplete") from None
    return holder.value[STATE_KEY]


def read_state(path: str | Path) -> dict:
    """The zephon global state in a state JSON or a TorchTitan DCP checkpoint folder.

    Raises `CheckpointError` naming what the path is instead, never a traceback.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p} does not exist; pass a state JSON file or a DCP "
                              "checkpoint folder")
    if p.is_dir():
        raw: Any = _from_dcp(p)
    else:
        raw = p.read_bytes()
    try:
        state = parse_state(raw, str(p)) if isinstance(raw, str | bytes) else raw
    except CheckpointError as exc:
        raise CheckpointError(f"{p} is not a zephon state: {exc}") from None
    if isinstance(state, dict) and STATE_KEY in state and isinstance(state[STATE_KEY], str):
        state = parse_state(state[STATE_KEY], f"{p} ({STATE_KEY})")
    if isinstance(state, dict) and state.get("format") == STATE_FORMAT:
        state = state.get("zephon")
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{p} is not a zephon state (no \"format\": \"{FORMAT}\"); pass "
                              "what Loader.state_dict() or ZephonDataLoader.state_dict() saved")
    state = migrate_state(state)  # an older version's layout read as this one's
    for key in ("fingerprint", "step", "lanes"):
        if key not in state:
            raise CheckpointError(f"{p}: the zephon state is truncated: field {key!r} is missing")
    return state


def _origins(obj: Any) -> set[tuple[int, ...]]:
    """Element identities in an operator state: lists that start with an origin's 5 ints."""
    found: set[tuple[int, ...]] = set()
    if isinstance(obj, list):
        if 5 <= len(obj) <= 7 and all(isinstance(v, int) for v in obj):
            found.add(tuple(obj[:5]))
        else:
            for v in obj:
                found |= _origins(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            found |= _origins(v)
    return found


def summarize(state: dict) -> dict:
    """Fingerprint summary, step and per-lane positions of a zephon state, as plain data."""
    fp = state["fingerprint"]
    L = int(fp.get("num_lanes", len(state["lanes"])))
    totals = []
    for d in fp.get("datasets", []):
        shards = d.get("shards", [])
        totals.append(sum(int(shard_samples(s) or 0) for s in shards))
    lanes = {}
    for key in sorted(state["lanes"], key=int):
        snap = state["lanes"][key]
        src = snap.get("source", {})
        counts = src.get("counts", [])
        epochs = [(_position(src, j, c, L, int(key)) // t) if t else None
                  for j, (c, t) in enumerate(zip(counts, totals + [0] * len(counts),
                                                 strict=False))]
        in_flight = sum(len(v) for v in snap.get("pending", {}).values())
        held = _origins([snap.get("accumulators", {}), combiner_state(snap, {})])
        lanes[key] = {"draws": src.get("draws"), "taken": counts, "epoch": epochs,
                      "rows": snap.get("rows"), "in_flight": in_flight, "buffered": len(held),
                      "pending_drops": len(snap.get("drops", []))}
        if "phase" in src:
            lanes[key]["phase"] = src["phase"]
            lanes[key]["phase_start_draws"] = snap.get("phase_gate", {}).get("start_draws")
    return {
        "realized": _realized(state, len(totals)),
        "recipe": fp.get("recipe"), "fingerprint_sha256": state.get("fingerprint_sha256"),
        "num_lanes": L, "global_batch_size": fp.get("global_batch_size"),
        "seq_len": fp.get("seq_len"), "seed": fp.get("seed"), "epochs": fp.get("epochs"),
        "datasets": [{"name": d.get("name"), "weight": d.get("weight"), "samples": t}
                     for d, t in zip(fp.get("datasets", []), totals, strict=False)],
        "operators": [o.get("name") for o in fp.get("operators", [])],
        "step": state["step"], "lanes": lanes,
        "phases": fp.get("phases", []), "phase_lag": fp.get("phase_lag"),
        "global_batch_sizes": state.get("global_batch_sizes", []),
        "lane_changes": state.get("lane_changes", []),
    }


def _realized(state: dict, nds: int) -> dict:
    """Per dataset, summed over the lanes: the samples drawn (since step 0 or the last lane
    change, where the lanes' tallies restart), those drawn in each lane's current phase and,
    with mix_by = "tokens", the phase's settled tokens that the deficit rule counts."""
    snaps = list(state["lanes"].values())
    srcs = [snap.get("source", {}) for snap in snaps]

    def total(lists: list[list[int]]) -> list[int]:
        return [sum(int(v[j]) for v in lists if j < len(v)) for j in range(nds)]

    changes = state.get("lane_changes", [])
    out: dict[str, Any] = {"since_step": changes[-1][0] if changes else 0,
                           "samples": total([s.get("counts", []) for s in srcs])}
    if any("phase_counts" in s for s in srcs):
        out["phase_samples"] = total([s.get("phase_counts", []) for s in srcs])
    if state["fingerprint"].get("mix_by") == "tokens":
        out["phase_tokens"] = total([snap.get("phase_gate", {}).get("settled_tokens", [])
                                     for snap in snaps])
    return out


def _shares(names: list[str], counts: list[int]) -> str:
    whole = sum(counts) or 1
    return ", ".join(f"{n} {c} ({c / whole:.1%})" for n, c in zip(names, counts, strict=False))


def _position(src: dict, j: int, c: int, L: int, lane: int) -> int:
    """The position in dataset `j`'s order of the lane's next draw from it (after a lane-count
    change: its re-dealt list, then its stride; docs/elastic-changes.md)."""
    rl = src.get("relaned")
    if rl is None:
        return c * L + lane
    e = rl["explicit"][j]
    return e[c] if c < len(e) else rl["start"][j] + (c - len(e)) * rl["stride"]


def render(s: dict) -> str:
    out = [f"recipe {s['recipe']} (fingerprint {str(s['fingerprint_sha256'])[:16]}): "
           f"L={s['num_lanes']} lanes, G={s['global_batch_size']} rows/step, S={s['seq_len']}, "
           f"seed {s['seed']}, epochs {s['epochs'] if s['epochs'] is not None else 'endless'}",
           "datasets: " + ", ".join(f"{d['name']} ({d['samples']} samples, weight {d['weight']})"
                                    for d in s["datasets"]),
           "operators: " + " -> ".join(map(str, s["operators"])),
           *([f"mixture schedule (phase_lag {s['phase_lag']}): " + "; ".join(
               f"from step {p['start_step']}: "
               + ", ".join(f"{k} {p[k]}" for k in ("weights", "global_batch_size") if k in p)
               for p in s["phases"])]
             if s.get("phases") else []),
           f"step {s['step']}: the next batch is global step {s['step']}",
           *(["global batch size changed on resume: " + ", ".join(
               f"G={g} from step {t}" for t, g in s["global_batch_sizes"])]
             if s.get("global_batch_sizes") else []),
           *(["lane count changed on resume: " + ", ".join(
               f"{a} -> {b} lanes at step {t}" for t, a, b in s["lane_changes"])]
             if s.get("lane_changes") else []),
           *_render_realized(s),
           "lane  draws  taken per dataset  epoch  rows  in flight  buffered  drops pending"]
    for lane, v in s["lanes"].items():
        taken = ",".join(map(str, v["taken"]))
        epoch = ",".join("-" if e is None else str(e) for e in v["epoch"])
        phase = (f"  phase {v['phase']} (began at draws {v['phase_start_draws']})"
                 if "phase" in v else "")
        out.append(f"{lane:<5} {v['draws']!s:<6} {taken:<18} {epoch:<6} {v['rows']!s:<5} "
                   f"{v['in_flight']:<10} {v['buffered']:<9} {v['pending_drops']}{phase}")
    return "\n".join(out)


def _render_realized(s: dict) -> list[str]:
    r, names = s["realized"], [d["name"] for d in s["datasets"]]
    since = "from step 0" if not r["since_step"] else f"since the lane change at step " \
        f"{r['since_step']}"
    out = [f"samples drawn per dataset (all lanes, {since}): {_shares(names, r['samples'])}"]
    if "phase_samples" in r:
        out.append("samples drawn in each lane's current phase: "
                   + _shares(names, r["phase_samples"]))
    if "phase_tokens" in r:
        out.append("tokens settled in each lane's current phase (mix_by tokens): "
                   + _shares(names, r["phase_tokens"]))
    return out


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("state", help="a state JSON file or a TorchTitan DCP checkpoint folder")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


@command("inspect", "summarize a checkpoint: recipe, step, per-lane source position and buffers",
         _args)
def cmd_inspect(args: argparse.Namespace) -> int:
    summary = summarize(read_state(args.state))
    print(json.dumps(summary, indent=1) if args.json else render(summary))
    return 0
