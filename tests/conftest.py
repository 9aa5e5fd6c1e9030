"""Fixtures shared by the zephon_core tests."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
from pathlib import Path

import pytest
from hypothesis import settings

# The CI gate draws the same examples every run (derandomize), so a red run
# means the change broke something; `make test` elsewhere explores new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("ZEPHON_HYPOTHESIS_PROFILE", "dev"))

SHM = Path("/dev/shm")


def _end_subprocesses_then_terminate(signum: int, frame: object) -> None:
    """SIGTERM to pytest (``timeout``, a cancelled job): end what the tests started first.

    A test's subprocess (a TorchTitan run under torchrun, a storage server) has its own
    process tree: killed with pytest alone, it ran on, holding cores and its loaders'
    shared-memory files (106 left in /dev/shm once, 2026-12-07). A process forked from
    pytest inherits this handler and only ends as it would have without it."""
    import psutil

    children = psutil.Process().children(recursive=True) if os.getpid() == _PYTEST_PID[0] else []
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


#: the pytest process, whose handler ends the subprocesses (a forked one's ends itself only)
_PYTEST_PID = [0]


def pytest_configure(config: pytest.Config) -> None:
    _PYTEST_PID[0] = os.getpid()
    signal.signal(signal.SIGTERM, _end_subprocesses_then_terminate)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built (torch, transformers, TorchTitan, the test modules).

    Tests call ``gc.collect()`` to check that nothing outlives its last reference;
    each call otherwise walks the whole heap of every imported library (about
    0.1 s, over a thousand calls in the property tests). Frozen objects are
    left out of that walk; what a test makes is collected as before.
    """
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def frozen_heap_per_module():
    """Before each test module: collect, then freeze what is left (as after collection).

    What earlier modules imported or cached (torch's submodules, TorchTitan, Hypothesis's
    data) would otherwise be walked by every ``gc.collect()`` a test makes: the property
    test of the shared-memory pool (1,200 collections) took minutes in the whole suite
    and 0.5 s alone. Freezing once a module leaves each module's own garbage to be
    collected as before; only what is alive when the module starts is set aside."""
    gc.collect()
    gc.freeze()


def zephon_shm_files() -> set[str]:
    """zephon shared-memory files made by this process or its workers.

    Every segment of a process pool is named ``zephon-<driver pid>-...`` (workers
    use their driver's prefix), so other jobs on the machine are never counted.
    """
    if not SHM.is_dir():
        return set()
    return {p.name for p in SHM.glob(f"zephon-{os.getpid()}-*")}


@pytest.fixture(autouse=True)
def no_leaked_zephon_shm():
    """After each test: no shared-memory segment of ours is left in /dev/shm."""
    before = zephon_shm_files()
    yield
    leaked = sorted(zephon_shm_files() - before)
    for name in leaked:  # do not let one leak fail every later test too
        (SHM / name).unlink(missing_ok=True)
    assert not leaked, f"leaked zephon shared-memory files in /dev/shm: {leaked[:10]}"
