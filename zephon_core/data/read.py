"""`Read`: the transform that turns a pointer into the sample's payload."""

from __future__ import annotations

from typing import Any

from zephon_core.data.readers import ShardReader
from zephon_core.ops.contract import Transform, check_on_error
from zephon_core.records import Element


class Read(Transform):
    """Fetch each sample from its dataset's reader.

    Readers here are local files read by position, so a read costs microseconds
    and its bytes are best consumed where they were read: by default it runs in
    the process pool and fuses with decode/tokenize, so encoded bytes never
    cross a process boundary. For slow remote storage, put it on threads
    (``Execution(runners={"read": "threads"}, workers={"read": 8})``).
    """

    default_runner = "processes"

    def __init__(self, readers: list[ShardReader], name: str = "read", on_error: str = "raise"):
        self.readers = readers
        self.name = name
        self.on_error = check_on_error(on_error)

    def process_many(self, elements: list[Element]) -> list[Any]:
        return [self.readers[e.payload[0]].read(e.payload[1], e.payload[2]) for e in elements]
