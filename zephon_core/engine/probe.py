"""Run a recipe's transforms on a few samples of each dataset, outside any lane.

What a user wants to know before training (`zephon-vl inspect-data`): does my
data get in, and as what? `probe_dataset` takes the first `n` samples of a
dataset in the recipe's own order (epoch 0, the order training draws them
in), runs every transform of the recipe on them in this thread, exactly as a
lane's workers would (same per-element keys, same drop rules), and returns
each sample's outcome: its payload or the `Dropped` reason and detail.
Nothing is packed, so nothing here changes or consumes a run's data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon_core.data.readers import sample_key_of, shard_lengths
from zephon_core.data.sources import DatasetOrder
from zephon_core.engine.execution import Execution
from zephon_core.engine.lane_queues import element_key
from zephon_core.engine.plan import Plan
from zephon_core.errors import BadSampleError
from zephon_core.ops.contract import StageFn
from zephon_core.records import Dropped, Element, Origin
from zephon_core.spec import Recipe


@dataclass
class Probed:
    """One sample's outcome: `payload` (what the combiner would get) or `dropped`."""

    origin: Origin
    key: str | None
    payload: Any = None
    dropped: Dropped | None = None


def probe_dataset(recipe: Recipe, dataset: int, n: int, group: int = 16) -> list[Probed]:
    """The first `n` samples of `recipe`'s dataset `dataset`, through every transform."""
    plan = Plan(recipe.ops, Execution(runner="inline"), lanes=1)
    fn = plan.prefix_fn(len(plan.stages) - 1)
    fn.setup()
    reader = recipe.datasets[dataset].reader
    order = DatasetOrder(shard_lengths(reader), recipe.seed, dataset, recipe.shuffle)
    get_key = sample_key_of(reader)
    out: list[Probed] = []
    positions = list(range(min(n, order.total)))
    for start in range(0, len(positions), group):
        origins = [Origin(p, dataset, *order.locate(p)) for p in positions[start:start + group]]
        results = _run(fn, [Element(element_key(recipe.seed, o), o.pointer, o)
                            for o in origins])
        for o, r in zip(origins, results, strict=True):
            key = str(get_key(o.shard, o.index)) if get_key is not None else None
            if isinstance(r, Dropped):
                out.append(Probed(o, key, dropped=r))
            else:
                out.append(Probed(o, key, payload=r))
    return out


def _run(fn: StageFn, elements: list[Element]) -> list[Any]:
    """`fn` on the group; under ``on_error="raise"`` a bad sample is reported, not raised."""
    if not fn.transforms:
        return [e.payload for e in elements]
    try:
        return fn(elements)
    except BadSampleError:
        out: list[Any] = []
        for e in elements:
            try:
                out += fn([e])
            except BadSampleError as exc:
                out.append(Dropped("would_stop_the_run", str(exc)))
        return out
