"""A checkpoint written before mixture schedules existed still restores as it did.

`fixtures/text-demo-state-v0-step2.json` was saved by main at fce9ed9 (before
phases): `zephon-vl digest --recipe text-demo --dp 2 --steps 4 --save-at 2
--resume-dp 1 --state-out ...`. Its steps 2 and 3 had these digests.
"""

from __future__ import annotations

import json
from pathlib import Path

from zephon_core import Execution, Loader, batch_digest
from zephon_core.recipes.text import text_demo

FIXTURE = Path(__file__).parent / "fixtures" / "text-demo-state-v0-step2.json"
STEPS_2_3 = ["f935cd6c73b6c6783a52cfd8fb15ee4b62577d995e8f1485668018aa712c79bb",
             "82785c744171dd01219a1495560d93994dadfd6fac494fed37fbd25db02d10aa"]


def test_a_state_saved_before_phases_restores_with_the_same_batches():
    state = json.loads(FIXTURE.read_text())
    recipe = text_demo()
    loader = Loader(recipe, 0, 1, Execution(runner="inline"))
    try:
        loader.load_state_dict(state)
        got = [batch_digest(recipe.collate(loader.next_rows())) for _ in range(2)]
    finally:
        loader.close()
    assert got == STEPS_2_3
