"""How a process pool's failures end: a group's retries, or the stage when workers
cannot start (for `ProcessRunner`, `engine/processes.py`).

Apart from the pool's dispatching: these only read what the pool counted (deaths
while starting, start times, each group's attempts) and word the error a user acts on.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from typing import TYPE_CHECKING

from zephon_core.engine.runner_base import MAX_ATTEMPTS
from zephon_core.engine.workers import death_advice, death_cause

if TYPE_CHECKING:
    from zephon_core.engine.processes import _Task


class WorkerFailures:
    """Mixin of `ProcessRunner`: whether deaths while starting end the stage, and the
    errors that end a group's retries or the stage."""

    name: str
    workers: int
    group_timeout: float | None
    start_times: deque[float]
    _early_deaths: int
    _early_causes: dict[str, int]
    _progress_at: float
    _started: int
    _answered: list[bool]
    _assigned: list[deque]
    _spawned_at: list[float]

    def start_patience(self) -> float:
        raise NotImplementedError

    def start_deadline(self) -> float | None:
        """Seconds a worker may take to start once groups are dealt to it: `group_timeout`,
        or `start_patience` if longer (a start takes longer than a group: imports, a model
        load). None without a `group_timeout`: no deadline, as for groups."""
        if self.group_timeout is None:
            return None
        return max(self.group_timeout, self.start_patience())

    def _start_overdue(self, i: int) -> bool:
        """Worker `i` has not said it is ready past `start_deadline`, holding groups:
        `group_timeout` counts from a worker's "ready", so a start that never ends (a
        model load stuck on a dead file server, a worker stopped while it started) would
        hold them, and the run, for good."""
        deadline = self.start_deadline()
        return (deadline is not None and not self._answered[i] and bool(self._assigned[i])
                and time.monotonic() - self._spawned_at[i] > deadline)

    def _why_replaced(self, exitcode: int | None, overdue: bool, started: bool) -> str:
        """How a replaced worker ended, for the log line."""
        if not overdue:
            return death_cause(exitcode)
        if started:
            return f"ran past group_timeout ({self.group_timeout:g} s) and was killed"
        return f"did not start within {self.start_deadline():g} s and was killed"

    def _cannot_start(self, exitcode: int | None) -> bool:
        """Whether the deaths while starting since the last progress show that workers
        cannot start, rather than that they were cut short.

        `MAX_ATTEMPTS` deaths per worker in a row are needed either way. A worker
        that exits by itself, or any death in a pool that never started, counts at
        once: nothing outside is to blame. A pool that has started before and
        whose replacements are killed by a signal (an OOM killer, a fault
        injector, on a machine where starting now takes far longer) waits
        `start_patience` from its last progress: the start-up deadline follows
        the start times this pool has seen, not a fixed clock.
        """
        if self._early_deaths < MAX_ATTEMPTS * self.workers:
            return False
        if self._started == 0 or exitcode is None or exitcode >= 0:
            return True
        return time.monotonic() - self._progress_at >= self.start_patience()

    def _start_record(self) -> str:
        """What the pool saw: deaths in a row and how they ended, starts and their times."""
        causes = ", ".join(f"{c} x{n}" for c, n in sorted(self._early_causes.items()))
        seen = (f"{self._early_deaths} in a row ({causes}), none ready for "
                f"{time.monotonic() - self._progress_at:.1f} s")
        if not self._started:
            return f"{seen}; no worker of this stage has started yet"
        times = sorted(self.start_times)
        span = (f"{times[0]:.2f} s" if len(times) == 1
                else f"{times[0]:.2f}-{times[-1]:.2f} s")
        plural = "worker" if self._started == 1 else "workers"
        return f"{seen}; {self._started} {plural} started before, taking {span} to start"

    def _start_failure(self, exitcode: int | None, hung: bool = False) -> str:
        if hung:
            return (f"stage {self.name}: worker processes keep hanging while they start: "
                    f"{self._start_record()}; the last one "
                    f"{self._why_replaced(exitcode, True, False)}; check what the stage's "
                    "setup loads (a model, a tokenizer, a file on a network mount), or "
                    "raise Execution.group_timeout if starting is only slow")
        head = (f"stage {self.name}: worker processes keep dying while they start: "
                f"{self._start_record()}; the last one {death_cause(exitcode)}")
        if exitcode in (-signal.SIGKILL, -signal.SIGBUS):
            return f"{head}; {death_advice(exitcode)}"
        return (f"{head}; the stage cannot start in a worker process (is the script guarded "
                "by `if __name__ == '__main__':`? are its operators importable and "
                "picklable?)")

    def _group_failure(self, task: _Task, exitcode: int | None) -> str:
        """The error that ends a group's retries, or "" while it may run again."""
        if task.overdue >= MAX_ATTEMPTS:
            return (f"stage {self.name}: {task.overdue} workers in a row ran past "
                    f"group_timeout ({self.group_timeout:g} s) on the group of samples "
                    f"{task.samples}; one of them hangs the operator (check it, drop it "
                    "with a filter, or raise Execution.group_timeout if such groups are "
                    "only slow)")
        if task.attempts < MAX_ATTEMPTS:
            return ""
        advice = death_advice(exitcode) or "check the samples, or drop the culprit with a filter"
        blame = ("" if exitcode in (-signal.SIGKILL, -signal.SIGBUS)
                 else "; a sample crashes the process")
        return (f"stage {self.name}: a worker died {task.attempts} times on the group of "
                f"samples {task.samples} (it {death_cause(exitcode)}){blame}; {advice}")
