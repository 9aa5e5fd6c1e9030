"""`Read`: the transform that turns a pointer into the sample's payload."""

from __future__ import annotations

from typing import Any

from zephon_core.data.readers import ReadsMany, ShardReader
from zephon_core.ops.contract import Transform, check_on_error
from zephon_core.records import Element


class Read(Transform):
    """Fetch each sample from its dataset's reader.

    Local files are read by position, so a read costs microseconds and its
    bytes are best consumed where they were read: by default it runs in the
    process pool and fuses with decode/tokenize, so encoded bytes never cross
    a process boundary. A group's samples that lie close together in one remote
    shard come in one range request (`Execution.coalesce`). For slow remote
    storage, also put reads on threads
    (``Execution(runners={"read": "threads"}, workers={"read": 8})``).
    """

    default_runner = "processes"

    def __init__(self, readers: list[ShardReader], name: str = "read", on_error: str = "raise"):
        self.readers = readers
        self.name = name
        self.on_error = check_on_error(on_error)

    def process_many(self, elements: list[Element]) -> list[Any]:
        """Through a reader's ``read_many`` when it has one (it may merge neighbouring
        samples into one request), else sample by sample."""
        out: list[Any] = [None] * len(elements)
        by_reader: dict[int, list[int]] = {}
        for j, e in enumerate(elements):
            by_reader.setdefault(e.payload[0], []).append(j)
        for d, js in by_reader.items():
            reader = self.readers[d]
            if isinstance(reader, ReadsMany):
                got = reader.read_many([(elements[j].payload[1], elements[j].payload[2])
                                        for j in js])
            else:
                got = [reader.read(elements[j].payload[1], elements[j].payload[2]) for j in js]
            for j, sample in zip(js, got, strict=True):
                out[j] = sample
        return out
