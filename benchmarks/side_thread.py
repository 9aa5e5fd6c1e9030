"""Run a worker process's work in a thread of its own, as zephon's process workers do.

glibc gives a process's main thread the main heap arena (a forked process inherits
the parent's, with all the parent allocated) and every other thread an arena of its
own. The same tokenizer calls cost 1.3-1.5 us of CPU a token in the main thread, 1.7 in
a thread that also loaded the tokenizer, 1.0-1.2 in a thread apart from where it was
loaded (2026-12-07; `MALLOC_ARENA_MAX=1` makes every case slow). A raw limit has to be
the best arrangement of the work, so its processes load in the main thread and work
from a side thread, as zephon's workers do.
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
