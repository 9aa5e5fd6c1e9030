"""Facts of the machine the loader runs on."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. under taskset or a container)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def ranks_on_this_machine() -> int:
    """Data-loading ranks sharing this machine: torchrun's ``LOCAL_WORLD_SIZE``, else 1."""
    raw = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        from zephon_core.errors import ConfigError

        raise ConfigError(f"LOCAL_WORLD_SIZE={raw!r} is not a positive integer; it is set by "
                          "torchrun to the number of ranks on this machine")
    return int(raw)


def worker_budget() -> int:
    """Default process workers per stage of one rank: the machine's cores shared by its ranks.

    One process per core *per rank* would oversubscribe a machine running 8
    ranks 8 times over, so each rank gets ``usable cores // ranks here``, at least 1.
    """
    return max(1, usable_cores() // ranks_on_this_machine())


def release_free_heap() -> None:
    """Give the C heap's free memory back to the system (glibc's `malloc_trim`; a no-op
    elsewhere): after a large library object is dropped, glibc keeps its pages otherwise."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim  # the symbols already loaded: libc's
    except (OSError, AttributeError):
        return
    trim(0)
