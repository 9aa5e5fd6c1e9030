"""Fields a saved record gained in a later release, each declared once, where it is written.

A checkpoint's fingerprint and a ledger are compared with ones an earlier release wrote,
which lack every field added since. Such a field is no difference: the comparison leaves it
out where only the newer record has it (and says what goes unchecked). Which fields those
are is not a list kept beside the comparison: the code that writes a field declares it
with the release that added it (`later_field`), and the comparisons read the declarations
(`later_fields`). A settings field does the same with ``setting(since=...)``; a change of a
checkpoint's layout goes through `zephon_core.engine.checkpoint.MIGRATIONS` instead.
"""

from __future__ import annotations

from typing import NamedTuple

#: a shard's identity in a fingerprint (``fingerprint.datasets[i].shards[j]``), as a
#: reader's `shard_identity` gives it
SHARD_IDENTITY = "shard identity"
#: a sample or a drop in a ledger line (`zephon_core.engine.ledger_entries`)
LEDGER_ENTRY = "ledger entry"


class LaterField(NamedTuple):
    """Field `name` of `record` (`SHARD_IDENTITY`, `LEDGER_ENTRY`), written since release
    `since`; `covers` says what a record without it leaves unchecked."""

    record: str
    name: str
    since: str
    covers: str


_DECLARED: dict[str, dict[str, LaterField]] = {}


def later_field(record: str, name: str, since: str, covers: str) -> str:
    """Declare that `record` gained field `name` in release `since` (``"0.4.0"``); returns
    `name`, for the code that writes the field to use as its key."""
    _DECLARED.setdefault(record, {})[name] = LaterField(record, name, since, covers)
    return name


def later_fields(record: str) -> dict[str, LaterField]:
    """The later fields of `record` declared by the modules imported so far, by name."""
    return dict(_DECLARED.get(record, {}))


def later_shard_field(name: str, since: str, covers: str) -> str:
    """Declare that a reader's shard identities (what a fingerprint records of each shard)
    gained field `name` in release `since`: a checkpoint or ledger written before it
    matches without it, and a resume warns that `covers` goes unchecked. Call it where the
    reader writes the field, in the module of its format; returns `name`."""
    return later_field(SHARD_IDENTITY, name, since, covers)
