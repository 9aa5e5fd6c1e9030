"""Functions the ray runner's tests run on Ray workers (importable, module level).

Ray workers import this module to unpickle them: it imports only numpy and
`tests.helpers.core`'s synthetic tokenizer.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.helpers.core import to_tokens


def crash_always(payload: dict, crash_ids: tuple[int, ...]) -> dict:
    """Kill the worker process on every sighting of one of `crash_ids` (a sample that
    crashes its worker, or a node that keeps dying under one group)."""
    if int(payload["id"]) in crash_ids:
        os._exit(1)
    return to_tokens(payload)


def slow_tokens(payload: dict, every: int, seconds: float, marker_dir: str = "") -> dict:
    """`to_tokens` that takes `seconds` on one document in `every`: groups finish out of
    submission order, as on a slow node. With `marker_dir`, a file there says a slow
    document has started (a test waits for it to kill the node under it)."""
    if int(payload["id"]) % every == 0:
        if marker_dir:
            (Path(marker_dir) / f"started-{os.getpid()}-{payload['id']}").touch()
        time.sleep(seconds)
    return to_tokens(payload)
