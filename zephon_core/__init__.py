"""zephon_core: the modality-free engine of zephon-vl, and its text-only Python API.

What a user of text data imports is here (``from zephon_core import text_loader, Loader,
Execution``); `zephon_vl` re-exports all of it beside the vision names, so a VLM user
imports from `zephon_vl` alone. What authors of formats, operators, model families and
trainer adapters need beyond it is `zephon_core.extend` (docs/api.md says which is which
and why). Names resolve lazily, so importing the package is cheap and worker processes
load only the modules their operators need. The submodules are the layers (see
docs/architecture.md): ``common`` -> ``data`` -> ``ops`` -> ``engine`` -> ``recipes``.
"""

from __future__ import annotations

from zephon_core._version import __version__ as __version__  # the one source
from zephon_core.common.deprecation import moved_names, removed_names
from zephon_core.common.exports import lazy_exports

_EXPORTS: dict[str, str] = {
    # errors a user catches
    "BadSampleError": "zephon_core.errors",
    "CheckpointError": "zephon_core.errors",
    "ConfigError": "zephon_core.errors",
    "UnknownKeyError": "zephon_core.errors",
    "NoRowsError": "zephon_core.errors",
    "ZephonError": "zephon_core.errors",
    "StorageError": "zephon_core.data.remote",
    "LedgerError": "zephon_core.engine.ledger",
    # what a user's Map, Filter or Transform sees and returns
    "Dropped": "zephon_core.records",
    "Element": "zephon_core.records",
    "Origin": "zephon_core.records",
    "Pointer": "zephon_core.records",
    # recipes
    "Recipe": "zephon_core.spec",
    "TextCollate": "zephon_core.spec",
    "text_recipe": "zephon_core.recipes.text",
    "text_loader": "zephon_core.recipes.text",
    "text_demo": "zephon_core.recipes.text",
    "builtin_names": "zephon_core.recipes.registry",
    "load_recipe": "zephon_core.recipes.registry",
    "recipe_from_toml": "zephon_core.recipes.registry",
    "register_kind": "zephon_core.recipes.registry",
    "register_recipe": "zephon_core.recipes.registry",
    "qwen_tokenizer_dir": "zephon_core.recipes.assets",
    "text_corpus": "zephon_core.recipes.assets",
    "load_tokenizer": "zephon_core.ops.text",
    "FastTokenizer": "zephon_core.ops.text",
    # datasets
    "Dataset": "zephon_core.data.sources",
    "DatasetSpec": "zephon_core.data.formats",
    "Phase": "zephon_core.data.sources",
    "InMemoryReader": "zephon_core.data.readers",
    "JsonlReader": "zephon_core.data.readers",
    "ParquetReader": "zephon_core.data.readers",
    # settings
    "Execution": "zephon_core.engine.execution",
    "RunnerKind": "zephon_core.engine.kinds",
    "RetryPolicy": "zephon_core.data.storage",
    "Coalesce": "zephon_core.data.storage",
    "ShuffleSettings": "zephon_core.data.sources",
    "PackSettings": "zephon_core.ops.pack",
    "BalanceSettings": "zephon_core.ops.balanced",
    "ChatFraming": "zephon_core.ops.chat",
    # operators a recipe lists
    "Transform": "zephon_core.ops.contract",
    "UserOp": "zephon_core.ops.user",
    "UserTransform": "zephon_core.ops.user",
    "user_rng": "zephon_core.ops.user",
    "Map": "zephon_core.ops.contract",
    "Filter": "zephon_core.ops.contract",
    "Read": "zephon_core.ops.read",
    "Shuffle": "zephon_core.ops.shuffle",
    "Tokenize": "zephon_core.ops.text",
    "MinTokens": "zephon_core.ops.text",
    "Pack": "zephon_core.ops.pack",
    "BalancedPack": "zephon_core.ops.balanced",
    "IGNORE_INDEX": "zephon_core.ops.pack",
    # the loader, what it reports, its checkpoints
    "Loader": "zephon_core.engine.loader",
    "StepMeta": "zephon_core.engine.steps",
    "Drained": "zephon_core.engine.steps",
    "LoaderMetrics": "zephon_core.engine.metrics",
    "StageMetrics": "zephon_core.engine.metrics",
    "LoaderDataset": "zephon_core.engine.torch_dataset",
    "StageEvent": "zephon_core.engine.observe",
    "StageStats": "zephon_core.engine.observe",
    "load_state": "zephon_core.engine.checkpoint",
    "save_state": "zephon_core.engine.checkpoint",
    "merge_states": "zephon_core.engine.checkpoint",
    "change_lanes": "zephon_core.engine.relane",
    # checking determinism: digests, simulated and elastic runs, ledgers
    "batch_digest": "zephon_core.common.digest",
    "run_digests": "zephon_core.engine.simulate",
    "SimulatedRanks": "zephon_core.engine.simulate",
    "ElasticRun": "zephon_core.engine.simulate",
    "StepRecord": "zephon_core.engine.simulate",
    "gathered_batch_digest": "zephon_core.engine.simulate",
    "resumed_ledger_path": "zephon_core.engine.simulate",
    "Ledger": "zephon_core.engine.ledger",
    "LedgerWriter": "zephon_core.engine.ledger",
    "read_ledger": "zephon_core.engine.ledger",
    "compare_ledgers": "zephon_core.engine.ledger",
}

#: names that moved out of `zephon_core` in 0.4.0: building blocks for authors of formats,
#: operators and adapters to `zephon_core.extend`, the engine's inside to
#: `zephon_core.internals`; two left the public surface. They resolve here, with a
#: DeprecationWarning naming their new home (or saying there is none), until 0.5
_MOVED = {
    **moved_names("zephon_core", {name: f"zephon_core.extend.{name}" for name in (
        "Accumulator", "AccumulatorOp", "Combiner", "CombinerOp", "FlatSetting",
        "KnowsShardLengths", "NamesSamples", "Operator", "ReadsMany", "Row", "RowFiller",
        "Segment", "ShardReader", "StageFn", "StatefulOp", "StorageSettings", "StoredFile",
        "atomic_write", "cache_dir", "check_choices", "data_format", "flat_settings",
        "forwards_to", "known_formats", "open_shard", "register_format", "setting",
        "settings_groups", "settings_table", "stat_shard", "storage_settings",
        "usable_cores")}, since="0.4.0"),
    **moved_names("zephon_core", {name: f"zephon_core.internals.{name}" for name in (
        "Probed", "StageKind", "parse_resources", "parse_runners", "parse_workers",
        "probe_dataset", "sample_digest")}, since="0.4.0"),
    **removed_names("zephon_core", {
        "Backlog": "zephon_core.engine.backlog.Backlog",
        "accepted_keys": "zephon_core.recipes.registry.accepted_keys",
    }, since="0.4.0", why="the engine's own; nothing outside it used it"),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("zephon_core", _EXPORTS, globals(), _MOVED)
