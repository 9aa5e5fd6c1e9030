"""A process stage whose groups and answers are both large and not arrays (text, bytes:
what a user operator between read and tokenize passes on) must not hang.

Arrays travel through shared memory; everything else of a group travels pickled through
the worker's pipe. The dispatcher used to send the next group on the same thread that
reads the answers: with a group and an answer each larger than the pipe's buffer, the
worker waited for the dispatcher to read its answer while the dispatcher waited for the
worker to read its next group, forever (no group deadline fires: the dispatcher is the
one that checks it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

SCRIPT = """
from concurrent.futures import wait
from zephon_core import Element, Map, Origin, RunnerKind
from zephon_core.extend import StageFn
from zephon_core.internals import RunnerSpec, make_runner
from tests.core.test_process_pipes import same

runner = make_runner(RunnerSpec(RunnerKind.PROCESSES, 1, "same", "fork", 30.0),
                     StageFn([Map(same, name="same")]))
groups = [[Element(g * 4 + i, {"text": f"{g}-{i} " + "word " * 400_000,
                               "raw": bytes([g]) * 1_000_000}, Origin(0, 0, 0, 0, g * 4 + i))
           for i in range(4)] for g in range(6)]
futures = [runner.submit(group) for group in groups]
done, pending = wait(futures, timeout=60)
assert not pending, f"{len(pending)} of {len(futures)} groups never came back"
for group, future in zip(groups, futures, strict=True):
    assert future.result() == [e.payload for e in group]
runner.close()
print("every group came back")
"""


def same(sample: dict) -> dict:
    return sample


def test_large_pickled_groups_and_answers_do_not_deadlock_the_dispatcher() -> None:
    """In a process of its own, killed with its workers if it hangs (the old dispatcher
    hung for good, and so did the runner's close)."""
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("the process stage hung on large pickled groups") from None
    assert proc.returncode == 0 and "every group came back" in out, out
