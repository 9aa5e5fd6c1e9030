"""Who owns a pool's shared-memory files, and removing those of a dead owner.

A pool's files are owned by a lock file (``<pool prefix>lock``) its driver
holds with `flock`: the lock is tied to the open file, not to a PID, so a job
in another PID namespace sharing /dev/shm can tell a live pool from a dead
one (`sweep_orphans`). See `shm`'s docstring.
"""

from __future__ import annotations

import fcntl
import os
import time
import weakref
from pathlib import Path

from zephon_core.engine.shm_files import SHM_DIR, available


def remove_leftovers(prefix: str) -> int:
    """Unlink every segment whose name starts with `prefix` (after workers died)."""
    if not available():
        return 0
    n = 0
    for p in SHM_DIR.glob(f"{prefix}*"):
        if p.name != f"{prefix}{LOCK}":
            p.unlink(missing_ok=True)
            n += 1
    return n


def abandon(prefix: str, wait_s: float = 2.0) -> None:
    """The driver of pool `prefix` is gone: remove its segments, and its lock once free.

    A dying process closes its files one by one, so its lock may still be held
    for a moment after its pipe reads EOF: the lock is retried for `wait_s`.
    """
    if not available():
        return
    remove_leftovers(prefix)
    lock = SHM_DIR / f"{prefix}{LOCK}"
    deadline = time.monotonic() + wait_s
    while not _lock_is_free(lock):
        if time.monotonic() > deadline:
            return  # still held (a forked worker shares it): the next sweep removes it
        time.sleep(0.02)
    lock.unlink(missing_ok=True)


LOCK = "lock"


class OwnerLock:
    """The lock file that marks a pool's segments as owned by a live process.

    The driver holds an exclusive `flock` on ``<prefix>lock`` for the pool's
    life. The file is locked under a hidden name and then renamed into place,
    so a sweeper never sees it unlocked while its owner lives. A forked child
    closes its copy at once (`_after_fork_in_child`): a flock lives while any
    process holds the file open, so a child that kept it would keep a dead
    driver's files "owned".
    """

    def __init__(self, prefix: str) -> None:
        self.path = SHM_DIR / f"{prefix}{LOCK}"
        tmp = SHM_DIR / f".{prefix}{LOCK}"
        self.fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(tmp, self.path)
        except BaseException:
            os.close(self.fd)
            tmp.unlink(missing_ok=True)
            raise
        _OWNER_LOCKS.add(self)

    def release(self) -> None:
        if self.fd >= 0:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = -1
        _OWNER_LOCKS.discard(self)


_OWNER_LOCKS: weakref.WeakSet[OwnerLock] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a forked child: close the parent's owner locks (the parent still holds them)."""
    for owner in list(_OWNER_LOCKS):
        if owner.fd >= 0:
            try:
                os.close(owner.fd)
            except OSError:
                pass
            owner.fd = -1
    _OWNER_LOCKS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _lock_is_free(path: Path) -> bool:
    """True when nobody holds `path`'s flock (its owner is gone); False while one does."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops a lock we took
    return True


def sweep_orphans(prefix: str = "zephon-") -> int:
    """Unlink segments left by pools whose owner is gone (it was killed).

    Pool prefixes are ``zephon-<owner pid>-<id>-``. A pool is an orphan when
    its lock file can be locked: that holds across PID namespaces, where the
    PID in the name means nothing. A pool without a lock file is left alone:
    it belongs to an older version, whose owner cannot be told apart from a
    live process in another namespace.
    """
    if not available():
        return 0
    pools: dict[str, list[Path]] = {}
    for p in SHM_DIR.glob(f"{prefix}*"):
        parts = p.name[len(prefix):].split("-", 2)
        if len(parts) == 3 and parts[0].isdigit():
            pools.setdefault(f"{prefix}{parts[0]}-{parts[1]}-", []).append(p)
    n = 0
    for pool, files in pools.items():
        lock = SHM_DIR / f"{pool}{LOCK}"
        if not lock.exists() or not _lock_is_free(lock):
            continue
        for p in sorted(files, key=lambda p: p == lock):  # the lock last
            p.unlink(missing_ok=True)
            n += 1
    return n
