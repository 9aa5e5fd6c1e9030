"""The recipe's packer as a Grain transformation (imported only where Grain is installed).

Module-level classes, so that Grain can pickle the pipeline into its worker processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grain
from zephon_bench.e2e import packed_rows
from zephon_bench.workload import Work

from zephon_core.extend import Row


def _items(it: Any) -> Iterator[Any]:
    while True:
        try:
            yield next(it)
        except StopIteration:
            return


class PackIterator(grain.DatasetIterator):
    def __init__(self, parent: Any, work: Work) -> None:
        super().__init__(parent)
        self._rows = packed_rows(work, _items(parent))

    def __next__(self) -> tuple[Row, int]:
        return next(self._rows)

    def get_state(self) -> dict:
        return self._parent.get_state()

    def set_state(self, state: dict) -> None:
        raise NotImplementedError("the benchmark does not checkpoint Grain pipelines")


class PackRows(grain.IterDataset):
    """Rows of the recipe's packer over a stream of (origin, document), with their drops."""

    def __init__(self, parent: Any, work: Work) -> None:
        super().__init__(parent)
        self.work = work

    def __iter__(self) -> PackIterator:
        return PackIterator(self._parent.__iter__(), self.work)
