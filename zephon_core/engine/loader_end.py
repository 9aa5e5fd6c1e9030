"""The end of a rank's data, for `Loader`: when it comes, and what the lanes hold then.

Kept apart from the loader's steps and checkpoints: `leftover` and `drain` account for
every element the lanes drew and never delivered (guarantee 5), and the ranks agree on
the last step over gloo.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zephon_core.engine.snapshot import LaneSnapshot
from zephon_core.engine.steps import Drained, lane_drops
from zephon_core.errors import ZephonError
from zephon_core.ops.contract import Row


class LoaderEnd:
    """Mixin of `Loader`: the end of finite data (the ranks agree on it), what is left
    then (`leftover`), and finishing the lanes to take it all (`drain`)."""

    _end_group: Callable[[], Any] | None

    def _every_rank_has_a_batch(self, full: bool) -> bool:
        """With finite data, the run ends at the first step *any* rank cannot fill.

        How many rows a lane yields depends on packing, so no rank can know
        locally when another rank's lanes run out: the ranks agree (gloo MIN).
        """
        if self._end_group is None:
            return full
        import torch
        import torch.distributed as dist

        group = self._end_group()
        if group is None:
            raise ZephonError("the loader's gloo group was destroyed (destroy_process_group) "
                               "while data was still being read; close the loader first")
        flag = torch.tensor([1 if full else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        return bool(flag.item())

    def leftover(self) -> dict:
        """At the end of finite data: what the lanes drew but never delivered.

        ``rows``: rows made but not delivered; ``drops``: drops not yet
        reported; ``held``: elements still buffered or in flight in lanes
        that had not finished.

        Together with every `last_meta` of the run, this accounts for every
        element the lanes consumed (exactly once, guarantee 5). How the
        remainder splits between ``rows``, ``drops`` and ``held`` (and the
        counts of `end_of_data`) is a picture of the moment this rank stopped:
        it depends on how far each lane had worked ahead (runner timing,
        `Execution.prefetch_steps`, the short warm-up after a restore), so it
        differs between runners and across a resume, and is no part of the
        guarantees. `drain()` finishes the lanes instead: its rows and drops are
        the same at every D, runner and resume.
        """
        rest = [run.leftover() for run in self._runs]
        return {
            "rows": [[(s.origin, s.start, s.end) for s in row.segments]
                     for taken in rest for row in taken.rows],
            "drops": [d for taken in rest for d in taken.drops]
                     + [d for taken in rest for d in taken.after],
            "held": [o for run in self._runs for o in run.held_origins()],
        }

    def drain(self) -> Drained:
        """Finish every lane of this rank and take everything it has not delivered.

        With finite data (``recipe.epochs`` set) each lane runs to the end of
        its data; with endless data each lane stops drawing and finishes what
        it holds (shuffle buffers, groups in flight, open rows: a last row may
        be short). Rows a background driver made ahead of the consumer are
        included, before the lanes' later rows. Every element the lanes drew
        and no `StepMeta` reported is then in `Drained.rows` or
        `Drained.drops`, exactly once (guarantee 5).

        The loader is then at its end: `next_rows()` returns None (and
        iteration stops) until `load_state_dict`; `state_dict()` still
        describes the last step delivered. Only this rank's lanes take part:
        no collective call.
        """
        self._check_usable()
        undelivered = [item for item in self._stop_background() if item is not None]
        for item in undelivered:
            if isinstance(item, BaseException):
                raise item
        per_lane: dict[int, list[Row]] = {lane: [] for lane in self.lanes}
        for step, _batch in undelivered:
            r = self.batches.r_at(step.meta.step)
            for k, lane in enumerate(self.lanes):
                per_lane[lane] += step.rows[k * r:(k + 1) * r]
        try:
            for run in self._runs:
                run.finish(stop_drawing=self.recipe.epochs is None)
            while not all(run.finished for run in self._runs):
                self._pump_lanes()
        except BaseException as exc:
            self._failed = exc
            raise
        out = Drained([], [], [])
        for run in self._runs:
            pending = LaneSnapshot.from_json(run.snapshot()).drop_details
            rest = run.take_rest()
            mine = per_lane[run.lane] + rest.rows
            out.rows += mine
            out.lanes += [run.lane] * len(mine)
            for drop, detail in lane_drops(mine, rest.after, pending):
                out.drops.append(drop)
                out.drop_lanes.append(run.lane)
                out.drop_details.append(detail)
        return out
