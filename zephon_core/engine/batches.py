"""Rows per lane of every step, when the global batch size changes during a run.

Lane streams never depend on the global batch size `G`: a lane makes the same
rows whatever `G` is, and `G` only decides where steps cut them. With `r(t)`
rows per lane at step `t` (`G(t) / L`), step `t` takes rows
``[R(t), R(t) + r(t))`` of every lane, where ``R(t) = sum(r(s) for s < t)``.
`G(t)` is the recipe's `global_batch_size`, changed by each phase that sets one
(from its `start_step`) and by each change a resume asked for (from the step it
resumed at, until the next phase that sets one). See docs/elastic-changes.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon_core.spec import check_lane_geometry


@dataclass(frozen=True)
class BatchSchedule:
    """`changes`: (first step, rows per lane), by step, the first at step 0."""

    changes: tuple[tuple[int, int], ...]

    @classmethod
    def build(cls, num_lanes: int, base: int, phases: list[tuple[int, int]],
              resumes: list[tuple[int, int]]) -> BatchSchedule:
        """From global batch sizes: the recipe's, its phases' (start step, G) and resumes'
        (step, G); a resume's size holds until the next phase that sets one."""
        events = sorted([(s, 0, g) for s, g in phases] + [(s, 1, g) for s, g in resumes])
        out: list[tuple[int, int]] = [(0, base)]
        for step, _, g in events:
            check_lane_geometry(num_lanes, g, where=f" (from step {step})")
            if out[-1][0] == step:
                out[-1] = (step, g)
            else:
                out.append((step, g))
        merged: list[tuple[int, int]] = []
        for step, g in out:
            if not merged or merged[-1][1] != g // num_lanes:
                merged.append((step, g // num_lanes))
        return cls(tuple(merged))

    def r_at(self, step: int) -> int:
        r = self.changes[0][1]
        for s, rr in self.changes:
            if s > step:
                break
            r = rr
        return r

    def rows_before(self, step: int) -> int:
        """R(step): rows per lane in steps ``0..step-1``."""
        total = 0
        for k, (s, r) in enumerate(self.changes):
            end = self.changes[k + 1][0] if k + 1 < len(self.changes) else None
            if step <= s:
                break
            total += r * ((min(step, end) if end is not None else step) - s)
        return total

    @property
    def static(self) -> bool:
        return len(self.changes) == 1

    def step_at_rows(self, rows: int) -> int | None:
        """The step that begins at lane row `rows`, or None if no step does."""
        start_rows = 0
        for k, (s, r) in enumerate(self.changes):
            end = self.changes[k + 1][0] if k + 1 < len(self.changes) else None
            seg = None if end is None else r * (end - s)
            if seg is None or rows < start_rows + seg:
                off = rows - start_rows
                return s + off // r if off % r == 0 else None
            start_rows += seg
        return None
