"""Every example of the README and the documentation site runs (issue 40).

Each Python and shell block (tests/helpers/docblocks.py says which) is one test: the
Python blocks of a page run in order in one namespace, in a temporary folder of that page,
as a reader who pastes them one after the other would; a shell block runs with bash there,
with ``set -euo pipefail``. A block marked ``<!-- skip: why -->`` is reported as skipped
with its reason. So an example that breaks fails CI, naming its file and line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.docblocks import ROOT, Block, examples

# most blocks build a loader (a few seconds each on 2 cores); the whole file is ~1-2 min
pytestmark = pytest.mark.slow

EXAMPLES = examples()
SHELL_TIMEOUT_S = 120


class _Page:
    """What a page's earlier blocks left: the Python namespace and the folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self.done: set[int] = set()


_PAGES: dict[str, _Page] = {}


def _page(block: Block, factory: pytest.TempPathFactory) -> _Page:
    if block.page not in _PAGES:
        _PAGES[block.page] = _Page(factory.mktemp(Path(block.page).stem))
    return _PAGES[block.page]


def _run_python(block: Block, page: _Page) -> None:
    old = Path.cwd()
    os.chdir(page.folder)
    try:
        exec(compile(block.code, block.where, "exec"), page.namespace)  # noqa: S102
    finally:
        os.chdir(old)
    page.done.add(block.line)


def _run_shell(block: Block, page: _Page) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    # the interpreter running the tests first on PATH: `python` is this one
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + block.code],
                          cwd=page.folder, env=env, capture_output=True, text=True,
                          timeout=SHELL_TIMEOUT_S)
    assert proc.returncode == 0, (
        f"{block.where}: the shell example exited {proc.returncode}\n"
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")


@pytest.mark.parametrize("block", EXAMPLES, ids=[b.where for b in EXAMPLES])
def test_example_runs(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    if block.skip:
        pytest.skip(block.skip)
    page = _page(block, tmp_path_factory)
    if block.kind == "python":
        # the page's earlier Python blocks first, when this one runs alone (-k)
        for earlier in EXAMPLES:
            if (earlier.page == block.page and earlier.line < block.line
                    and earlier.kind == "python" and not earlier.skip
                    and earlier.line not in page.done):
                _run_python(earlier, page)
        _run_python(block, page)
    else:
        _run_shell(block, page)

