"""The walkthroughs in notebooks/ run top to bottom (their code cells, in order)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path) -> None:
    cells = json.loads(path.read_text())["cells"]
    scope: dict = {"__name__": "__notebook__"}
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            code = compile("".join(cell["source"]), f"{path.name}[cell {i}]", "exec")
            exec(code, scope)  # noqa: S102 - running our own walkthrough
