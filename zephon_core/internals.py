"""A look inside the engine: the pieces tests, benchmarks and the ``zephon-vl`` tools
(``inspect``, ``replay``, ``verify``, ``profile``, ``balance``) take apart, named so that
they need no private module.

Not for building on. An author of a format, an operator, a model family or a trainer
adapter finds what they need in `zephon_core.extend`; what is here is how the engine does
its work (how a runner is made from a plan, how a sample crosses shared memory, what a
lane's snapshot and the ledger's lines hold), which a measurement or a diagnosis has to
reach and an extension never should. The name says so: code that imports
``zephon_core.internals`` reads the engine's inside, and changes with it.

It is still public, so the API snapshot (docs/api.txt) lists it and the deprecation rule
(docs/api.md) holds: a name here is renamed or removed with a warning for one minor
version. Names resolve lazily, like the package's own.
"""

from __future__ import annotations

from zephon_core.common.exports import lazy_exports

_EXPORTS: dict[str, str] = {
    # the stages and runners: what a Loader builds from a recipe and an Execution
    "Plan": "zephon_core.engine.plan",
    "StageKind": "zephon_core.engine.kinds",
    "RunnerSpec": "zephon_core.engine.runners",
    "make_runner": "zephon_core.engine.runners",
    "parse_workers": "zephon_core.engine.execution",
    "parse_runners": "zephon_core.engine.execution",
    "parse_resources": "zephon_core.engine.execution",
    "split_workers": "zephon_core.engine.autoscale",
    # a dataset's first samples, timed (`zephon-vl inspect-data`)
    "Probed": "zephon_core.engine.probe",
    "probe_dataset": "zephon_core.engine.probe",
    # shared-memory transport between the worker processes and the lane
    "SegmentPool": "zephon_core.engine.shm",
    "Packed": "zephon_core.engine.shm",
    "unpack": "zephon_core.engine.shm",
    # a worker process's work runs in a thread of its own (its own heap arena)
    "in_own_thread": "zephon_core.engine.workers",
    # a checkpoint's inside: the envelope, a lane's snapshot, its combiner's bins
    "CHECKPOINT_FORMAT": "zephon_core.engine.checkpoint:FORMAT",
    "migrate_state": "zephon_core.engine.checkpoint",
    "LaneSnapshot": "zephon_core.engine.snapshot",
    "combiner_state": "zephon_core.engine.snapshot",
    "shard_samples": "zephon_core.engine.state_check",
    # the ledger's lines and their comparison (`zephon-vl replay`, `verify`)
    "sample_digest": "zephon_core.common.digest",
    "step_entry": "zephon_core.engine.ledger",
    "lane_entries": "zephon_core.engine.ledger",
    "reader_keys": "zephon_core.engine.ledger",
    "compare_entries": "zephon_core.engine.ledger",
    "mixture_shares": "zephon_core.engine.ledger",
    # metrics
    "WAIT_WARN_SHARE": "zephon_core.engine.metrics",
    "recorder_for": "zephon_core.engine.metrics",
    # the recipe-file keys every kind accepts (the API snapshot lists them)
    "recipe_file_keys": "zephon_core.recipes.registry",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("zephon_core.internals", _EXPORTS, globals())
