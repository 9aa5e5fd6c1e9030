"""The lane's two stall checks: a lane that only drops stops, naming why.

Both count the lane's own decisions (draws, drops) in the lane's element
order, never time, so where a lane stops is a function of its data: the same
sample at every `D`, runner and resume (guarantee 1). The timed report
(`Execution.stall_seconds`) is the loader's and only logs. The guard is a
lane hook (`engine.lane_hooks`) that every lane has: it hears of draws,
drops, rows and what the combiner took.
"""

from __future__ import annotations

from zephon_core.engine.lane_hooks import LaneHook, LaneView
from zephon_core.errors import NoRowsError
from zephon_core.ops.contract import CombinerOp, Row
from zephon_core.records import Origin

#: the drop reason of a sample longer than a row (the combiner's hint says what to change)
OVER_LENGTH = "over_length"


class StallGuard(LaneHook):
    """Counts draws since the lane's last row and drops since its combiner last took an
    element; raises `NoRowsError` when either passes its limit.

    `draw_limit`: draws without a row (a bound no healthy lane reaches: four times the
    data plus the lane's in-flight bound and slack); `drop_limit`: consecutive drops
    (`Execution.stall_drops`; None: never). The messages take their advice from the
    combiner (`CombinerOp.over_length_hint`, `CombinerOp.settings_hint`), so the engine
    names no concrete operator.
    """

    def __init__(self, lane: int, combiner: CombinerOp, draw_limit: int,
                 drop_limit: int | None) -> None:
        self._lane = lane
        self._combiner = combiner
        self._draw_limit = draw_limit
        self._drop_limit = drop_limit
        self._draws = 0
        self._drops: dict[str, int] = {}

    @property
    def draws_since_row(self) -> int:
        """Elements drawn since the lane's last row."""
        return self._draws

    def row(self, lane: LaneView, row: Row) -> None:
        """The lane made a row."""
        self._draws = 0

    def took(self, origin: Origin) -> None:
        """The combiner took an element: the run of drops is broken."""
        self._drops = {}

    def drew(self, lane: LaneView) -> None:
        """One more draw; the lane's drops so far, by reason, go in the message."""
        self._draws += 1
        if self._draws > self._draw_limit:
            op = self._combiner
            raise NoRowsError(
                f"lane {self._lane} drew {self._draws} elements since its last row without "
                f"making one (drops so far: {dict(lane.dropped)}); every element is being "
                f"dropped: check the filters and the settings of the combiner {op.name!r}"
                + (f" ({op.settings_hint})" if op.settings_hint else ""))

    def dropped(self, origin: Origin, reason: str) -> None:
        """One more drop in a row; at the limit, stop at this sample."""
        run = self._drops
        run[reason] = run.get(reason, 0) + 1
        limit = self._drop_limit
        if limit is not None and sum(run.values()) >= limit:
            raise NoRowsError(self._all_dropped_message(origin))

    def hints(self) -> list[str]:
        """What to change, from the reasons of the drops since the combiner last took one."""
        run = self._drops
        hints = []
        seq_len = self._combiner.seq_len
        if OVER_LENGTH in run:
            hints.append(self._combiner.over_length_hint.format(seq_len=seq_len) if seq_len
                         else "the samples are longer than a row: raise the context length")
        other = sorted(set(run) - {OVER_LENGTH})
        if other:
            hints.append(f"check the data and the filters that drop {', '.join(other)} "
                         "(`zephon-vl inspect-data --recipe R` shows a few drops of each "
                         "dataset with why; a ledger, `zephon-vl digest --ledger PATH` or "
                         "`Loader(ledger=)`, names every dropped sample)")
        return hints

    def _all_dropped_message(self, origin: Origin) -> str:
        run = self._drops
        counts = ", ".join(f"{n} {r}" for r, n in sorted(run.items(), key=lambda x: -x[1]))
        return (f"lane {self._lane} dropped every one of the last {sum(run.values())} samples "
                f"it drew ({counts}; last {origin.where()}) and made no row from them: "
                f"{'; '.join(self.hints())}. The limit is Execution.stall_drops "
                f"({self._drop_limit}; TorchTitan: --dataloader.stall_drops)")
