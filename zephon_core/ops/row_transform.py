"""Row transforms: stateless work on finished rows, after the combiner.

A `Transform` runs before the combiner, on every element drawn, so its work is
spent on samples the combiner may still refuse (too long, over a row's limits)
and its output sits in the combiner's open rows until they close. Some work only
the rows a step takes need (decoding the pixels of images a row holds, where the
combiner decided from the images' sizes alone): a `RowTransform` does it once a
row is made, in the same runners as transforms (inline, threads, a process pool
whose arrays travel through shared memory), on each row by itself, so any number
of workers may run it and the lane takes the results back in row order.

Contract: `process_rows(rows)` returns one row per input row, in order, with the
same segments (origin, start, end) in the same order: it may change their
payloads (a new payload object, never an edit of the one it was given: a
document cut over two rows shares its payload), and it may record drops of its
own row's samples in `Row.drops` (with `Row.drop_details`), for a sample whose
content fails here (the sample stays in its row; the transform decides what the
row then holds). It holds no state, so a lane's snapshot (taken when a row is
made) never describes it, and a restore makes the same rows again.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

from zephon_core.data.storage_settings import StorageSettings, storage_settings
from zephon_core.ops.contract import Operator, Row
from zephon_core.records import Element

__all__ = ["RowStageFn", "RowTransform", "row_layout"]


class RowTransform(Operator):
    """Stateless per-row work after the combiner (docs/operators.md, "Row transforms").

    A recipe lists its row transforms in `Recipe.row_ops`; the plan runs them as a stage
    of their own after the combiner, on the runner `Execution` gives their name (like a
    transform's: ``--workers NAME=N``, ``--runners NAME=processes``). `fingerprinted`
    False leaves the operator out of a checkpoint's fingerprint: for one whose rows are
    the same with it or without it (so a checkpoint written before it was added
    restores).
    """

    default_runner: str | None = None
    #: part of the recipe's fingerprint (its name, type and `settings()`)
    fingerprinted: bool = True

    def setup(self) -> None:
        """Called once in each process before the first `process_rows`."""

    def release(self) -> None:
        """Drop what this operator can load again where it runs (see `Transform.release`)."""

    @abstractmethod
    def process_rows(self, rows: list[Row]) -> list[Row]:
        """One row per input row, in order, with the same segments (see the module)."""


def row_layout(row: Row) -> list[tuple[object, int, int]]:
    """What a row transform must keep: each segment's origin, start and end, in order."""
    return [(s.origin, s.start, s.end) for s in row.segments]


@dataclass
class RowStageFn:
    """Consecutive row transforms fused into one call, as a runner's worker runs them
    (the row counterpart of `StageFn`: elements in, one output per element out). Each
    element's payload is a `Row`."""

    transforms: list[RowTransform]
    storage: StorageSettings | None = None

    def setup(self) -> None:
        with storage_settings(self.storage):
            for t in self.transforms:
                t.setup()

    def __call__(self, elements: list[Element]) -> list[Row]:
        with storage_settings(self.storage):
            rows = [e.payload for e in elements]
            for t in self.transforms:
                out = t.process_rows(rows)
                if len(out) != len(rows):
                    raise RuntimeError(f"row transform {t.name} returned {len(out)} rows for "
                                       f"{len(rows)}")
                rows = out
            return rows
