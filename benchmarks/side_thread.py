"""Run a worker process's work in a thread of its own, as zephon's process workers do.

glibc gives a process's main thread the main heap arena (a forked process inherits
the parent's, with all the parent allocated) and every other thread an arena of its
own; the same tokenizer calls cost about 1.4x the CPU in the main thread (2026-12-07,
`MALLOC_ARENA_MAX=1` makes both slow). A raw limit has to be the best arrangement of
the work, so its processes work from a side thread too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def in_own_thread(target: Callable[..., None], *args: Any) -> None:
    """``target(*args)`` in a new thread, waited for; what it raises is raised here."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001 - raised again in the calling thread
            failed.append(exc)

    thread = threading.Thread(target=run, name="bench-work", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
