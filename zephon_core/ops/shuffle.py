"""Per-lane shuffle buffer, seeded by (seed, lane, emission count)."""

from __future__ import annotations

from typing import Any

from zephon_core.common.hashing import uniform_index
from zephon_core.ops.contract import Accumulator, AccumulatorOp, Recompute, StateChecks
from zephon_core.records import Origin


class Shuffle(AccumulatorOp):
    """Hold `buffer_size` elements per lane and emit a seed-chosen one for each new arrival.

    Put it right after the source (before read/decode) and it buffers pointers
    only: its checkpoint is a list of origins and restoring it costs nothing.
    """

    def __init__(self, buffer_size: int = 1024, name: str = "shuffle") -> None:
        self.buffer_size = buffer_size
        self.name = name

    def settings(self) -> dict:
        return {"buffer_size": self.buffer_size}

    def make(self, lane: int, seed: int) -> Accumulator:
        return _ShuffleBuffer(self.buffer_size, seed, lane)

    def origins_in_state(self, state: dict) -> list[list[int]]:
        return [list(o) for o in state["buffer"]]

    def check_state(self, state: Any, checks: StateChecks) -> None:
        super().check_state(state, checks)
        emitted, buffer = state.get("emitted"), state.get("buffer")
        if not (isinstance(emitted, int) and not isinstance(emitted, bool) and emitted >= 0):
            raise checks.fail("emitted", f"is {emitted!r}, not a count")
        if not isinstance(buffer, list) or len(buffer) > self.buffer_size:
            raise checks.fail("buffer", f"is not a list of at most {self.buffer_size} origins")
        for o in buffer:
            checks.origin("buffer", o)


class _ShuffleBuffer(Accumulator):
    """The buffer, and beside it its origins as the state lists them.

    The lane takes a snapshot after every step: building the buffer's 1,024 origin lists
    each time cost the driver about half of its CPU on text (the lists, and the full
    garbage collections they set off). Each origin's list is made once, when it arrives,
    and moved with it; a state copies only the outer list (its items are never changed
    in place: an item leaves the list, it is not edited).
    """

    def __init__(self, size: int, seed: int, lane: int) -> None:
        self.size = size
        self.seed = seed
        self.lane = lane
        self.buffer: list[tuple[Origin, Any]] = []
        #: ``[list(origin) for origin, _ in buffer]``, kept in step with it
        self._listed: list[list[int]] = []
        self.emitted = 0

    def _take(self) -> tuple[Origin, Any]:
        i = uniform_index(len(self.buffer), self.seed, self.lane, self.emitted, 0x5348)
        item = self.buffer[i]
        self.buffer[i] = self.buffer[-1]
        self.buffer.pop()
        self._listed[i] = self._listed[-1]
        self._listed.pop()
        self.emitted += 1
        return item

    def push(self, item: tuple[Origin, Any]) -> list[tuple[Origin, Any]]:
        self.buffer.append(item)
        self._listed.append(list(item[0]))
        return [self._take()] if len(self.buffer) > self.size else []

    def flush(self) -> list[tuple[Origin, Any]]:
        return [self._take() for _ in range(len(self.buffer))]

    def state(self) -> dict:
        return {"emitted": self.emitted, "buffer": list(self._listed)}

    def held_origins(self) -> list[Origin]:
        return [o for o, _ in self.buffer]

    def restore(self, state: dict, recompute: Recompute) -> None:
        self.emitted = int(state["emitted"])
        origins = [Origin(*o) for o in state["buffer"]]
        self.buffer = list(zip(origins, recompute(origins), strict=True))
        self._listed = [list(o) for o in origins]
