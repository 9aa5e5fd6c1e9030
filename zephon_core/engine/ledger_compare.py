"""Compare two ledgers: the first step, lane, row and sample where they differ.

Two runs that saw the same batches have the same lines (see `ledger` for the
format); `compare_ledgers` refuses ledgers of different recipes and names
the first `Divergence` otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zephon_core.common.later import LEDGER_ENTRY, later_fields
from zephon_core.engine.checkpoint import first_difference, short_json
from zephon_core.engine.ledger_entries import _ORIGIN, LedgerError
from zephon_core.engine.state_check import without_later_fields

if TYPE_CHECKING:
    from zephon_core.engine.ledger import Ledger


def _same_recipe(a: dict, b: dict, name_a: str, name_b: str) -> None:
    # a ledger written before a shard identity field existed (`later_field`) lacks it
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


def _same(x: dict, y: dict) -> bool:
    """Equal, up to fields a later release added to ledger entries (declared where they are
    written, `ledger_entries`) that only one side has: a ledger written before them lacks
    them, which is no divergence."""
    added = later_fields(LEDGER_ENTRY)
    return all(x[k] == y[k] if k in x and k in y else k in added for k in set(x) | set(y))


def _divergence(t: int, a: dict, b: dict) -> Divergence | None:
    """Why step `t`'s digests differ; None when only later fields one side lacks do."""
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
