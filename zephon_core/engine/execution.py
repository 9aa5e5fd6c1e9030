"""`Execution`: where and how fast work runs, never what the data is."""

from __future__ import annotations

from dataclasses import dataclass, field

from zephon_core.common.system import usable_cores
from zephon_core.engine.runners import RUNNERS
from zephon_core.errors import ConfigError
from zephon_core.ops.contract import Transform


@dataclass
class Execution:
    """Where and how fast work runs; changing any of it never changes a batch.

    Process stages default to one worker per core (`default_workers=None`),
    thread stages to one thread.

    `runner` is the default for every transform (``auto``: each operator's own
    preference, processes for read, decode and tokenize); `runners` and
    `workers` override it per operator name.
    Consecutive transforms with the same runner and worker count are fused
    into one stage (one worker call per group).
    """

    runner: str = "inline"
    runners: dict[str, str] = field(default_factory=dict)
    workers: dict[str, int] = field(default_factory=dict)
    default_workers: int | None = None
    group_size: int = 8
    #: groups in flight per lane and stage; None: enough to give every worker two groups
    #: (at least 2), so many lanes do not pile up finished documents in memory
    prefetch: int | None = None
    prefetch_steps: int = 1
    start_method: str = "spawn"
    fuse: bool = True
    #: seconds a process worker may spend on one group before it is killed and replaced
    #: and the group re-run (None: wait forever). A healthy group takes well under a
    #: second, a slow read or a long video seconds: 300 s never fires on those, yet a hang
    #: surfaces, naming its samples, before torch's 10-minute collective timeout kills
    #: the job with no hint
    group_timeout: float | None = 300.0

    def __post_init__(self) -> None:
        for kind in [self.runner, *self.runners.values()]:
            if kind not in (*RUNNERS, "auto"):
                raise ConfigError(f"unknown runner {kind!r}; choose one of {RUNNERS}")
        if self.group_size < 1 or (self.prefetch or 1) < 1 or self.prefetch_steps < 0:
            raise ConfigError("group_size and prefetch must be >= 1, prefetch_steps >= 0")
        if self.group_timeout is not None and not self.group_timeout > 0:
            raise ConfigError(f"group_timeout must be > 0 seconds or None (no deadline), "
                              f"not {self.group_timeout!r}")

    def runner_for(self, t: Transform) -> tuple[str, int]:
        kind = self.runners.get(t.name, self.runner)
        if kind == "auto":
            kind = t.default_runner or "inline"
        if kind == "inline":
            return kind, 1
        default = self.default_workers
        if default is None:
            default = usable_cores() if kind == "processes" else 1
        return kind, self.workers.get(t.name, default)
