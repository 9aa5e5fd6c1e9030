"""The lane's book of sample digests for the ledger (`Plan.digests`).

A worker hashes a sample while it still has the whole payload; the combiner
may cut a document over several rows, and each of those rows' ledger entries
names the same sample digest. So the worker's digest is kept, by origin,
until the element's last segment is in a row, then forgotten: the book holds
only what the lane holds. The book is a lane hook (`engine.lane_hooks`): it
hears of the workers' digests, of refusals and of each row, which it gives
its digests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from zephon_core.common.digest import sample_digest
from zephon_core.engine.lane_hooks import LaneHook, LaneView
from zephon_core.ops.contract import Row, Segment
from zephon_core.records import Origin


class DigestBook(LaneHook):
    """Sample digests by origin, from the worker until the sample's last segment is in a row.

    `budget` is the lane's in-flight bound: past four times it (plus slack) the
    book drops digests of elements the lane no longer holds, which only a
    combiner that truncates a document (its last segment never shows) leaves.
    """

    def __init__(self, budget: int) -> None:
        self._by_origin: dict[Origin, dict[str, str]] = {}
        self._limit = 4 * budget + 1024

    def digest(self, origin: Origin, digest: dict[str, str]) -> None:
        """The worker's digest of a finished element."""
        self._by_origin[origin] = digest

    def refused(self, origin: Origin) -> None:
        """The combiner refused the element: it reaches no row."""
        self._by_origin.pop(origin, None)

    def row(self, lane: LaneView, row: Row) -> None:
        """Give the lane's new row its digests (`of_row`)."""
        row.digests = self.of_row(row, lane.held_origins)

    def of_row(self, row: Row, held: Callable[[], Iterable[Origin]]) -> list[dict[str, str]]:
        """One digest per segment of `row`, in segment order; `held` names what the lane
        still holds, read only when the book has grown past its bound."""
        digests = [self._of_segment(s) for s in row.segments]
        if len(self._by_origin) > self._limit:
            keep = set(held())
            self._by_origin = {o: d for o, d in self._by_origin.items() if o in keep}
        return digests

    def _of_segment(self, s: Segment) -> dict[str, str]:
        """The worker's digest of the segment's sample; made here only for payloads
        recomputed on restore (or a pipeline without transforms)."""
        try:
            last = s.end >= len(s.payload["tokens"])
        except (TypeError, KeyError, IndexError):
            last = True
        book = self._by_origin
        digest = book.pop(s.origin, None) if last else book.get(s.origin)
        if digest is None:
            digest = sample_digest(s.payload)
            if not last:
                book[s.origin] = digest
        return digest
