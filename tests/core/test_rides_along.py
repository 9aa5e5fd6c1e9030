"""An operator that rides along (issue 39): under ``runner="auto"`` a cheap map such as
`MinTokens` runs in the worker call of the transform stage before it, not as a stage of
its own in the driver; a runner or worker count of its own keeps it apart. Where it runs
never changes a batch."""

from __future__ import annotations

import pytest

from zephon_core import Execution, Loader, batch_digest, text_corpus, text_demo, text_recipe
from zephon_core.engine.plan import Plan


def _stages(ex: Execution) -> list[tuple[str, str]]:
    return [(s.name, str(s.runner_kind)) for s in Plan(text_demo().ops, ex).stages]


@pytest.mark.parametrize("ex, stages", [
    (Execution(), [("shuffle", "inline"), ("read+tokenize+min_tokens", "processes"),
                   ("pack", "inline")]),
    (Execution(workers="auto"), [("shuffle", "inline"),
                                 ("read+tokenize+min_tokens", "processes"), ("pack", "inline")]),
    (Execution(runners={"tokenize": "threads"}),
     [("shuffle", "inline"), ("read", "processes"), ("tokenize+min_tokens", "threads"),
      ("pack", "inline")]),
    (Execution(runners={"min_tokens": "inline"}),
     [("shuffle", "inline"), ("read+tokenize", "processes"), ("min_tokens", "inline"),
      ("pack", "inline")]),
    (Execution(workers={"min_tokens": 1}),
     [("shuffle", "inline"), ("read+tokenize", "processes"), ("min_tokens", "inline"),
      ("pack", "inline")]),
    (Execution(runner="threads"), [("shuffle", "inline"),
                                   ("read+tokenize+min_tokens", "threads"), ("pack", "inline")]),
])
def test_min_tokens_runs_where_the_tokenizer_runs_unless_told(ex, stages):
    assert _stages(ex) == stages


def _digests(ex: Execution) -> list[str]:
    # min_tokens=150 drops some of the demo's documents: the drops come from the workers
    recipe = text_recipe(text_corpus()[:2], None, seq_len=512, global_batch_size=4,
                         num_lanes=4, shuffle_buffer=16, min_tokens=150)
    loader = Loader(recipe, 0, 1, ex)
    try:
        out = []
        for _ in range(4):
            batch = next(loader)
            out.append(batch_digest(batch) + repr(loader.last_meta.drops))
        return out
    finally:
        loader.close()


def test_batches_and_drops_are_the_same_wherever_it_runs():
    inline = _digests(Execution(runner="inline"))
    assert any("too_short" in d for d in inline), "the test needs drops to compare"
    assert _digests(Execution(default_workers=1)) == inline
