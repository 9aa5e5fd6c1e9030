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

A transform that needs a small part of a row (the encoded images of a row whose
pixels it decodes) says so with `row_part` and `row_from`: the lane sends the
runner only that part and builds the row from the runner's answer. A process
pool then moves the part and the answer, not every token array of the row both
ways (a row a group, so what crosses per row is what the lane pays).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

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

    def row_part(self, row: Row) -> Any:
        """What of `row` `process_rows` is given (runs in the lane as the row is sent):
        the row itself unless the transform needs less of it; None where there is nothing
        to do for this row (it passes unchanged, in its turn, without going to the
        runner)."""
        return row

    def row_from(self, row: Row, result: Any) -> Row:
        """The row this transform makes of `row`, given what `process_rows` returned for
        `row_part(row)` (runs in the lane when the answer is back): the answer itself
        unless `row_part` sent less than the row."""
        return result

    @abstractmethod
    def process_rows(self, rows: list[Any]) -> list[Any]:
        """One answer per `row_part` given, in order: with the default `row_part` and
        `row_from`, a row with the same segments (see the module)."""


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

    def part(self, row: Row) -> Any:
        """What the lane sends the runner for `row`: a lone transform's `row_part`, the
        whole row for several fused (each then takes its part where they run, a None
        part passing the row on unchanged)."""
        return self.transforms[0].row_part(row) if len(self.transforms) == 1 else row

    def finish(self, row: Row, answer: Any) -> Row:
        """The row the stage made of `row`, from the runner's `answer` for `part(row)`."""
        return self.transforms[0].row_from(row, answer) if len(self.transforms) == 1 \
            else answer

    def __call__(self, elements: list[Element]) -> list[Any]:
        with storage_settings(self.storage):
            parts = [e.payload for e in elements]
            if len(self.transforms) == 1:
                return _answers(self.transforms[0], parts)
            rows = parts
            for t in self.transforms:
                parts = [t.row_part(r) for r in rows]
                sent = [p for p in parts if p is not None]
                answers = iter(_answers(t, sent)) if sent else iter(())
                rows = [r if p is None else t.row_from(r, next(answers))
                        for r, p in zip(rows, parts, strict=True)]
            return rows


def _answers(t: RowTransform, parts: list[Any]) -> list[Any]:
    out = t.process_rows(parts)
    if len(out) != len(parts):
        raise RuntimeError(f"row transform {t.name} returned {len(out)} answers for "
                           f"{len(parts)} rows")
    return out
