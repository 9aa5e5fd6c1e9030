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

The module writes and reads the file; the lines themselves are built in
`ledger_entries` and compared in `ledger_compare`, whose names it offers too.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from zephon_core.common.digest import SAMPLE_DIGEST
from zephon_core.engine.checkpoint import fingerprint_digest
from zephon_core.engine.ledger_compare import (  # noqa: F401  (the comparison's names, here too)
    Comparison,
    Divergence,
    _same_recipe,
    compare_entries,
    compare_ledgers,
)
from zephon_core.engine.ledger_entries import (  # noqa: F401  (the lines' names, here too)
    LedgerError,
    end_entry,
    lane_entries,
    mixture_shares,
    reader_keys,
    step_entry,
    step_mixture,
)

log = logging.getLogger(__name__)

LEDGER_FORMAT = 1


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

