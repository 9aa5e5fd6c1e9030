"""The lines of a ledger: what one step's global batch was made of, per lane and per sample.

The writer (`zephon_core.engine.ledger`) puts them in the file and the
comparison (`ledger_compare`) reads them back; see `ledger` for the format.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from zephon_core.common.later import LEDGER_ENTRY, later_field
from zephon_core.data.readers import sample_key_of
from zephon_core.errors import ZephonError
from zephon_core.ops.contract import Row
from zephon_core.records import Origin

_ORIGIN = ("seq", "dataset", "shard", "index", "epoch")
#: a sample's or a drop's own key (``file:id``), where its reader names samples
KEY = later_field(LEDGER_ENTRY, "key", since="0.3.0", covers="the samples' own keys")
#: why a sample was dropped, in words (the reason decides the drop; the digest leaves it out)
DETAIL = later_field(LEDGER_ENTRY, "detail", since="0.3.0", covers="the drops' details")


class LedgerError(ZephonError):
    """A ledger that cannot be read, or two ledgers that cannot be compared."""


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def _origin(o: Origin) -> dict[str, int]:
    return dict(zip(_ORIGIN, (int(v) for v in o), strict=True))


def lane_entries(lanes: list[int], rows_per_lane: int, rows: list[Row],
                 keys: Any = None, phase_of: Mapping[int, Any] | None = None
                 ) -> dict[int, dict]:
    """Per lane: its rows' samples and drops at one step, and their digest.

    `rows` are one rank's rows of the step in lane order (`rows_per_lane` per
    lane of `lanes`). `keys(dataset, shard, index)` names a sample when the
    dataset's reader has keys (a WebDataset's ``__key__``), else None. With a
    mixture schedule, `phase_of[lane](origin)` is the phase each sample was drawn in.
    """
    out: dict[int, dict] = {}
    for k, lane in enumerate(lanes):
        mine = rows[k * rows_per_lane:(k + 1) * rows_per_lane]
        lane_rows = []
        for row in mine:
            digests = row.digests or [{}] * len(row.segments)
            samples = []
            for s, d in zip(row.segments, digests, strict=True):
                sample: dict[str, Any] = _origin(s.origin)
                key = keys(s.origin.dataset, s.origin.shard, s.origin.index) if keys else None
                if key is not None:
                    sample[KEY] = key
                sample["span"] = [s.start, s.end]
                if phase_of is not None:
                    sample["phase"] = phase_of[lane](s.origin)
                sample["digest"] = d
                samples.append(sample)
            lane_rows.append(samples)
        drops, digested = [], []
        for row in mine:
            for j, (o, reason) in enumerate(row.drops):
                drop: dict[str, Any] = _origin(o)
                key = keys(o.dataset, o.shard, o.index) if keys else None
                if key is not None:
                    drop[KEY] = key
                drop["reason"] = reason
                digested.append(dict(drop))
                detail = row.drop_details[j] if j < len(row.drop_details) else ""
                if detail:
                    drop[DETAIL] = detail
                drops.append(drop)
        # the digest leaves details out: they explain a drop, the reason decides it
        out[lane] = {"rows": lane_rows, "drops": drops,
                     "digest": _sha({"rows": lane_rows, "drops": digested})}
    return out


def step_entry(step: int, entries: Mapping[int, dict], datasets: int = 0) -> dict:
    """The ledger line of a global step from every lane's entry (any rank's, merged);
    `datasets` the recipe's dataset count, so its mixture shows a 0 for each one not drawn."""
    order = sorted(entries)
    digest = hashlib.sha256("".join(f"{lane}:{entries[lane]['digest']}\n"
                                    for lane in order).encode()).hexdigest()
    rows = [{"lane": lane, "samples": samples}
            for lane in order for samples in entries[lane]["rows"]]
    return {
        "step": step,
        "digest": digest,
        "lanes": {str(lane): entries[lane]["digest"] for lane in order},
        "rows": rows,
        "drops": [{"lane": lane, **d} for lane in order for d in entries[lane]["drops"]],
        "mixture": step_mixture(rows, datasets),
    }


def end_entry(step: int, rows: int, drops: Iterable[tuple[int, Origin, str, str]],
              keys: Any = None) -> dict:
    """The ledger line of a run that ended at `step` without delivering it: how many rows
    its lanes had made (`rows`) and every drop no step line reported, each
    ``(lane, origin, reason, detail)``, in the drop format of a step line. Written when a
    run delivers no batch at all (`zephon_core.engine.simulate`), so the ledger says
    where the data went; it has no digest and compares with nothing."""
    out = []
    for lane, o, reason, detail in drops:
        drop: dict[str, Any] = {"lane": lane, **_origin(o)}
        key = keys(o.dataset, o.shard, o.index) if keys else None
        if key is not None:
            drop[KEY] = key
        drop["reason"] = reason
        if detail:
            drop[DETAIL] = detail
        out.append(drop)
    return {"end": step, "rows": rows, "drops": out}


def step_mixture(rows: list[dict], datasets: int = 0) -> dict[str, Any]:
    """The realized mixture of a step, per dataset index: samples (segments that begin a
    sample) and tokens (span lengths) its rows hold. Derived from the rows alone; datasets
    `0..datasets-1` are listed with 0 when the step holds none of them, so a dataset weighted
    0 (or removed) by a phase shows as 0, not as a missing key."""
    samples: dict[str, int] = {str(j): 0 for j in range(datasets)}
    tokens: dict[str, int] = dict(samples)
    phases: set[int] = set()
    for row in rows:
        for s in row["samples"]:
            if "phase" in s:
                phases.add(s["phase"])
            ds = str(s["dataset"])
            start, end = s["span"]
            samples[ds] = samples.get(ds, 0) + (start == 0)
            tokens[ds] = tokens.get(ds, 0) + end - start
    order = sorted(tokens, key=int)
    out: dict[str, Any] = {"samples": {k: samples[k] for k in order},
                           "tokens": {k: tokens[k] for k in order}}
    if phases:
        out["phases"] = sorted(phases)  # the phases its samples were drawn in
    return out


def mixture_shares(entry: dict, names: list[str], by: str = "tokens") -> dict[str, float]:
    """A step's realized share per dataset name (`by` tokens or samples); 0 for datasets it
    does not hold."""
    counts = (entry.get("mixture") or step_mixture(entry["rows"]))[by]
    total = sum(counts.values()) or 1
    return {name: counts.get(str(j), 0) / total for j, name in enumerate(names)}


def reader_keys(recipe: Any) -> Any:
    """`keys(dataset, shard, index)` for `lane_entries`: the reader's sample key, if it has one."""
    getters = [sample_key_of(d.reader) for d in recipe.datasets]
    if not any(getters):
        return None

    def keys(dataset: int, shard: int, index: int) -> str | None:
        get = getters[dataset]
        return str(get(shard, index)) if get is not None else None
    return keys


