"""The per-step ledger: what every global batch was made of, one JSON line per step.

A ledger is proof in the user's own run: two runs (any `D`, runner, worker
count, resumes) that saw the same batches have the same lines, and `compare`
names the first step, lane, row and sample where they did not (`compare_ledgers`).

File format (JSON Lines, UTF-8). A *header* line starts every run and every
resume of a run::

    {"zephon_ledger": 1, "start": K, "sample_digest": "xxh3_64", "fingerprint": {...},
     "fingerprint_sha256": "..."}

then one *step* line per global step::

    {"step": t, "digest": sha256, "lanes": {lane: sha256}, "rows": [...], "drops": [...]}

``rows`` holds the global batch's rows in order (lane order, ``r`` rows per
lane), each ``{"lane", "samples": [{"dataset", "shard", "index", "epoch",
"seq", "key"?, "span": [start, end], "digest": {field: hex16}}]}``; a sample's
digest is `zephon_core.common.digest.sample_digest` of its payload, computed
by the worker that made it. ``drops`` are the drops reported at that step,
``{"lane", "dataset", "shard", "index", "epoch", "seq", "key"?, "reason", "detail"?}``;
``detail`` says why (which field, how many placeholders for how many images,
the decoder's message), the same text at every `D`, runner and run
(`zephon_core.records.drop_detail`).

A run that delivers no step at all (its finite data ended before the first
one) writes its header and one *end* line instead, ``{"end": 0, "rows": n,
"drops": [...]}``: the rows its lanes made and every drop, in the step lines'
drop format (`end_entry`); `read_ledger` keeps it as `Ledger.end`.

A lane digest is the SHA-256 of that lane's rows and drops (canonical JSON,
drops without their ``detail``, so ledgers written before details compare equal);
the step digest is the SHA-256 of ``"lane:digest\\n"`` over the lanes in
lane order. Neither depends on `D`: it is a digest of *what went in* (sample
identities and payload digests), a sibling of the batch digest
(`batch_digest`, the bytes of the collated tensors), which a ledger does not
need the tensors to compute.

Resume: the writer appends a new header with ``start`` = the checkpoint's
step; a reader keeps, for every step, the line written after the latest
header whose ``start`` is at or before it. Lines a crashed run wrote past its
last checkpoint are therefore superseded, not deleted. A last line cut short
by a crash is ignored with a warning (and trimmed by the next writer).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephon_core.common.digest import SAMPLE_DIGEST
from zephon_core.data.readers import sample_key_of
from zephon_core.engine.checkpoint import fingerprint_digest, first_difference, short_json
from zephon_core.engine.state_check import without_later_fields
from zephon_core.errors import ZephonError
from zephon_core.ops.contract import Row
from zephon_core.records import Origin

log = logging.getLogger(__name__)

LEDGER_FORMAT = 1
_ORIGIN = ("seq", "dataset", "shard", "index", "epoch")


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
                    sample["key"] = key
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
                    drop["key"] = key
                drop["reason"] = reason
                digested.append(dict(drop))
                detail = row.drop_details[j] if j < len(row.drop_details) else ""
                if detail:
                    drop["detail"] = detail
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
            drop["key"] = key
        drop["reason"] = reason
        if detail:
            drop["detail"] = detail
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


class LedgerWriter:
    """Appends ledger lines to one file: a header when a run (or resume) starts, then steps.

    Each line goes out in one ``write`` on an ``O_APPEND`` descriptor, so a
    crash leaves at most one cut line at the end; the next writer trims it.
    """

    def __init__(self, path: str | os.PathLike, fingerprint: dict) -> None:
        self.path = Path(path)
        self.fingerprint = fingerprint
        self._fd: int | None = None

    def _open(self, start: int) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        size = os.fstat(fd).st_size
        if size:
            tail = os.pread(fd, min(size, 1 << 20), max(0, size - (1 << 20)))
            if not tail.endswith(b"\n"):
                cut = tail.rfind(b"\n")
                keep = size - len(tail) + cut + 1
                log.warning("ledger %s: its last line was cut short (a crash while writing); "
                            "removing the %d partial bytes", self.path, size - keep)
                os.ftruncate(fd, keep)
        header = {"zephon_ledger": LEDGER_FORMAT, "start": start,
                  "sample_digest": SAMPLE_DIGEST, "fingerprint": self.fingerprint,
                  "fingerprint_sha256": fingerprint_digest(self.fingerprint)}
        os.write(fd, (json.dumps(header, sort_keys=True) + "\n").encode())
        return fd

    def write(self, entry: dict) -> None:
        """Append one step line (or an `end_entry`); the first one after opening starts
        with a header."""
        if self._fd is None:
            self._fd = self._open(int(entry["step"] if "step" in entry else entry["end"]))
        os.write(self._fd, (json.dumps(entry, sort_keys=True, separators=(",", ":"))
                            + "\n").encode())

    def restart(self) -> None:
        """A checkpoint was loaded: the next step line starts a new header (a resume)."""
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class RankLedger:
    """The ledger of one rank's `Loader`: its lanes' entries, merged over every rank.

    With torch.distributed initialized on several ranks, each step's lane
    entries are all-gathered (JSON over gloo) and rank 0 alone writes, so the
    file is the same whatever `D`.
    """

    def __init__(self, path: str | os.PathLike, fingerprint: dict, gather: bool = True) -> None:
        self.distributed = False
        rank = 0
        if gather:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                self.distributed = True
                rank = dist.get_rank()
        self.writer = LedgerWriter(path, fingerprint) if rank == 0 else None
        self.datasets = len(fingerprint.get("datasets", ()))

    def record(self, step: int, entries: dict[int, dict]) -> None:
        if self.distributed:
            from zephon_core.engine.checkpoint import all_gather_json

            merged = {int(k): v for part in all_gather_json({str(k): v for k, v in
                                                             entries.items()})
                      for k, v in part.items()}
        else:
            merged = entries
        if self.writer is not None:
            self.writer.write(step_entry(step, merged, self.datasets))

    def restart(self) -> None:
        if self.writer is not None:
            self.writer.restart()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


@dataclass
class Ledger:
    """A ledger file as read: its fingerprint and, per step, the line that counts."""

    path: str
    fingerprint: dict
    sample_digest: str = SAMPLE_DIGEST
    steps: dict[int, dict] = field(default_factory=dict)
    resumes: list[int] = field(default_factory=list)
    #: the `end_entry` line of a run that delivered no batch (None: every other ledger)
    end: dict | None = None


def read_ledger(path: str | os.PathLike) -> Ledger:
    """Read a ledger; later headers supersede earlier lines from their ``start`` on."""
    where = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise LedgerError(f"cannot read ledger {where}: {exc.strerror or exc}") from None
    lines = data.split(b"\n")
    cut = len(lines)  # the number of a last line without its newline: a crash cut it
    if lines[-1] == b"":
        lines.pop()
        cut = 0
    ledger: Ledger | None = None
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
            if not isinstance(line, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            if n == cut:
                log.warning("ledger %s: ignoring its last line %d, cut short (a crash while "
                            "writing?)", where, n)
                break
            raise LedgerError(f"ledger {where}, line {n} is not a ledger line ({exc}); the "
                              "file is damaged") from None
        if "zephon_ledger" in line:
            fp = line.get("fingerprint")
            if line["zephon_ledger"] != LEDGER_FORMAT or not isinstance(fp, dict):
                raise LedgerError(f"ledger {where}, line {n}: format {line['zephon_ledger']!r} "
                                  f"is not this zephon's ({LEDGER_FORMAT})")
            if ledger is None:
                ledger = Ledger(where, fp, str(line.get("sample_digest")))
            else:
                _same_recipe(ledger.fingerprint, fp, f"{where} (line 1)", f"{where} (line {n})")
            start = int(line.get("start", 0))
            ledger.steps = {t: e for t, e in ledger.steps.items() if t < start}
            ledger.resumes.append(start)
            continue
        if ledger is None:
            raise LedgerError(f"{where} is not a zephon ledger: line {n} comes before any "
                              "header line (write ledgers with --ledger or Loader(ledger=))")
        if "end" in line and "step" not in line:
            ledger.end = line
            continue
        if not isinstance(line.get("step"), int) or "digest" not in line:
            raise LedgerError(f"ledger {where}, line {n}: a step line needs 'step' and 'digest'")
        ledger.steps[line["step"]] = line
    if ledger is None:
        raise LedgerError(f"{where} is not a zephon ledger (no header line); write one with "
                          "--ledger or Loader(ledger=)")
    return ledger


def _same_recipe(a: dict, b: dict, name_a: str, name_b: str) -> None:
    # a ledger written before a shard field existed (`LATER_SHARD_FIELDS`) lacks it
    b = without_later_fields(a, b)[0]
    a = without_later_fields(b, a)[0]
    diff = first_difference(a, b, "fingerprint")
    if diff:
        path, x, y = diff
        raise LedgerError(f"the ledgers come from different recipes: {path} is {short_json(x)} "
                          f"in {name_a} but {short_json(y)} in {name_b}; compare runs of the "
                          "same recipe")


@dataclass
class Divergence:
    """Where two ledgers first disagree, and how."""

    step: int
    lane: int | None
    row: int | None
    sample: int | None
    what: str

    def describe(self) -> str:
        where = [f"step {self.step}"]
        if self.lane is not None:
            where.append(f"lane {self.lane}")
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.sample is not None:
            where.append(f"sample {self.sample}")
        return f"first divergence at {', '.join(where)}: {self.what}"


@dataclass
class Comparison:
    common: list[int]
    divergence: Divergence | None

    @property
    def ok(self) -> bool:
        return self.divergence is None


def compare_ledgers(a: Ledger, b: Ledger) -> Comparison:
    """Compare the steps both ledgers hold; the first divergence, named, or None."""
    if a.sample_digest != b.sample_digest:
        raise LedgerError(f"the ledgers hash samples differently: sample_digest is "
                          f"{a.sample_digest!r} in {a.path} but {b.sample_digest!r} in {b.path}; "
                          "write both with the same zephon version")
    _same_recipe(a.fingerprint, b.fingerprint, a.path, b.path)
    common = sorted(set(a.steps) & set(b.steps))
    for t in common:
        if a.steps[t]["digest"] != b.steps[t]["digest"]:
            found = _divergence(t, a.steps[t], b.steps[t])
            if found is not None:
                return Comparison(common, found)
    return Comparison(common, None)


def compare_entries(a: Iterable[dict], b: Mapping[int, dict]) -> Divergence | None:
    """The first of `a`'s step lines that disagrees with `b`'s line of that step."""
    for entry in a:
        theirs = b.get(entry["step"])
        if theirs is not None and theirs["digest"] != entry["digest"]:
            found = _divergence(entry["step"], entry, theirs)
            if found is not None:
                return found
    return None


def _name(s: dict) -> str:
    key = f" key {s['key']!r}" if "key" in s else ""
    return (f"dataset {s.get('dataset')} shard {s.get('shard')} index {s.get('index')} "
            f"(epoch {s.get('epoch')}){key}")


def _drop_name(d: dict) -> str:
    return f"{_name(d)} dropped as {d.get('reason')!r}"


#: entry fields that later versions added (a drop's sample key, its detail): a ledger
#: written before them lacks them, which is no divergence
ADDED_FIELDS = frozenset({"key", "detail"})


def _same(x: dict, y: dict) -> bool:
    """Equal, up to `ADDED_FIELDS` that only one side has."""
    return all(x[k] == y[k] if k in x and k in y else k in ADDED_FIELDS
               for k in set(x) | set(y))


def _divergence(t: int, a: dict, b: dict) -> Divergence | None:
    """Why step `t`'s digests differ; None when only `ADDED_FIELDS` one side lacks do."""
    lanes = sorted(set(a.get("lanes", {})) | set(b.get("lanes", {})), key=int)
    differ = [int(k) for k in lanes if a["lanes"].get(k) != b["lanes"].get(k)]
    if not differ:
        return Divergence(t, None, None, None, "the step digests differ but every lane digest "
                          "agrees (an edited ledger?)")
    for lane in differ:
        found = _lane_divergence(t, lane, a, b)
        if found is not None:
            return found
    return None


def _lane_divergence(t: int, lane: int, a: dict, b: dict) -> Divergence | None:
    rows_a = [r["samples"] for r in a["rows"] if r["lane"] == lane]
    rows_b = [r["samples"] for r in b["rows"] if r["lane"] == lane]
    drops_a = [d for d in a.get("drops", []) if d["lane"] == lane]
    drops_b = [d for d in b.get("drops", []) if d["lane"] == lane]
    if rows_a == rows_b and drops_a == drops_b:
        return Divergence(t, lane, None, None, "the lane digests differ but its rows and drops "
                          "agree (an edited ledger?)")
    first_row = next(i for i, r in enumerate(a["rows"]) if r["lane"] == lane) \
        if rows_a else None
    for i, (ra, rb) in enumerate(zip(rows_a, rows_b, strict=False)):
        row = (first_row or 0) + i
        for j in range(max(len(ra), len(rb))):
            if j >= len(ra) or j >= len(rb):
                extra = (rb if j >= len(ra) else ra)[j]
                side = "B" if j >= len(ra) else "A"
                return Divergence(t, lane, row, j, f"only {side} has a sample here: "
                                  f"{_name(extra)}")
            sa, sb = ra[j], rb[j]
            identity = (*_ORIGIN, "key")
            if not _same({k: sa[k] for k in identity if k in sa},
                         {k: sb[k] for k in identity if k in sb}):
                return Divergence(t, lane, row, j, f"different sample: A has {_name(sa)}, "
                                  f"B has {_name(sb)}")
            if sa.get("span") != sb.get("span"):
                return Divergence(t, lane, row, j, f"same sample {_name(sa)}, different tokens "
                                  f"taken: span {sa.get('span')} in A, {sb.get('span')} in B")
            if sa.get("digest") != sb.get("digest"):
                da, db = sa.get("digest") or {}, sb.get("digest") or {}
                fields = sorted(k for k in set(da) | set(db) if da.get(k) != db.get(k))
                return Divergence(t, lane, row, j, f"same sample {_name(sa)}, different "
                                  f"content: field(s) {', '.join(fields)} differ")
            if not _same(sa, sb):
                fields = sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k))
                return Divergence(t, lane, row, j, f"same sample {_name(sa)}, different "
                                  f"entry: {', '.join(fields)}")
    if len(rows_a) != len(rows_b):
        return Divergence(t, lane, None, None, f"A has {len(rows_a)} rows in this lane, "
                          f"B has {len(rows_b)}")
    only_a = [d for d in drops_a if not any(_same(d, e) for e in drops_b)]
    only_b = [d for d in drops_b if not any(_same(d, e) for e in drops_a)]
    if only_a or only_b or len(drops_a) != len(drops_b):
        side, d = ("A", only_a[0]) if only_a else ("B", (only_b or drops_b or drops_a)[0])
        return Divergence(t, lane, None, None, f"a drop on one side only: in {side}, "
                          f"{_drop_name(d)}")
    return None
