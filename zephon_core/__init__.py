"""zephon_core: the modality-free engine of zephon-vl, and its text-only Python API.

Everything a user, a benchmark or an adapter needs is importable from here
(``from zephon_core import Loader, Recipe, Execution``). Names resolve lazily,
so importing the package is cheap and worker processes load only the modules
their operators need. The submodules are the layers (see docs/architecture.md):
``common`` -> ``data`` -> ``ops`` -> ``engine`` -> ``recipes``.
"""

from __future__ import annotations

from zephon_core.common.exports import lazy_exports

_EXPORTS: dict[str, str] = {
    # errors and records
    "BadSampleError": "zephon_core.errors",
    "CheckpointError": "zephon_core.errors",
    "ConfigError": "zephon_core.errors",
    "NoRowsError": "zephon_core.errors",
    "ZephonError": "zephon_core.errors",
    "Dropped": "zephon_core.records",
    "Element": "zephon_core.records",
    "Origin": "zephon_core.records",
    "Pointer": "zephon_core.records",
    # common
    "batch_digest": "zephon_core.common.digest",
    "atomic_write": "zephon_core.common.files",
    "cache_dir": "zephon_core.common.files",
    "usable_cores": "zephon_core.common.system",
    # data
    "Dataset": "zephon_core.data.sources",
    "ShuffleSettings": "zephon_core.data.sources",
    "DatasetSpec": "zephon_core.data.formats",
    "data_format": "zephon_core.data.formats",
    "known_formats": "zephon_core.data.formats",
    "register_format": "zephon_core.data.formats",
    "Phase": "zephon_core.data.sources",
    "InMemoryReader": "zephon_core.data.readers",
    "JsonlReader": "zephon_core.data.readers",
    "open_shard": "zephon_core.data.storage",
    "stat_shard": "zephon_core.data.storage",
    "StoredFile": "zephon_core.data.storage",
    "RetryPolicy": "zephon_core.data.storage",
    "Coalesce": "zephon_core.data.storage",
    "StorageSettings": "zephon_core.data.storage",
    "storage_settings": "zephon_core.data.storage",
    "StorageError": "zephon_core.data.remote",
    "ParquetReader": "zephon_core.data.readers",
    "ShardReader": "zephon_core.data.readers",
    "Read": "zephon_core.data.read",
    # operators
    "ChatFraming": "zephon_core.ops.chat",
    "Accumulator": "zephon_core.ops.contract",
    "AccumulatorOp": "zephon_core.ops.contract",
    "Filter": "zephon_core.ops.contract",
    "Map": "zephon_core.ops.contract",
    "Combiner": "zephon_core.ops.contract",
    "CombinerOp": "zephon_core.ops.contract",
    "Operator": "zephon_core.ops.contract",
    "StageFn": "zephon_core.ops.contract",
    "StatefulOp": "zephon_core.ops.contract",
    "Transform": "zephon_core.ops.contract",
    "IGNORE_INDEX": "zephon_core.ops.pack",
    "Pack": "zephon_core.ops.pack",
    "BalancedPack": "zephon_core.ops.balanced",
    "BalanceSettings": "zephon_core.ops.balanced",
    "RowFiller": "zephon_core.ops.pack",
    "Row": "zephon_core.ops.contract",
    "Segment": "zephon_core.ops.contract",
    "Shuffle": "zephon_core.ops.shuffle",
    "MinTokens": "zephon_core.ops.text",
    "Tokenize": "zephon_core.ops.text",
    "load_tokenizer": "zephon_core.ops.text",
    # engine
    "Execution": "zephon_core.engine.execution",
    "parse_workers": "zephon_core.engine.execution",
    "parse_runners": "zephon_core.engine.execution",
    "parse_resources": "zephon_core.engine.execution",
    "Drained": "zephon_core.engine.loader",
    "StageEvent": "zephon_core.engine.observe",
    "StageStats": "zephon_core.engine.observe",
    "LoaderMetrics": "zephon_core.engine.metrics",
    "StageMetrics": "zephon_core.engine.metrics",
    "Loader": "zephon_core.engine.loader",
    "Probed": "zephon_core.engine.probe",
    "probe_dataset": "zephon_core.engine.probe",
    "StepMeta": "zephon_core.engine.loader",
    "Backlog": "zephon_core.engine.backlog",
    "load_state": "zephon_core.engine.checkpoint",
    "merge_states": "zephon_core.engine.checkpoint",
    "change_lanes": "zephon_core.engine.relane",
    "save_state": "zephon_core.engine.checkpoint",
    "SimulatedRanks": "zephon_core.engine.simulate",
    "run_digests": "zephon_core.engine.simulate",
    "ElasticRun": "zephon_core.engine.simulate",
    "StepRecord": "zephon_core.engine.simulate",
    "gathered_batch_digest": "zephon_core.engine.simulate",
    "resumed_ledger_path": "zephon_core.engine.simulate",
    "Ledger": "zephon_core.engine.ledger",
    "LedgerError": "zephon_core.engine.ledger",
    "LedgerWriter": "zephon_core.engine.ledger",
    "read_ledger": "zephon_core.engine.ledger",
    "compare_ledgers": "zephon_core.engine.ledger",
    "sample_digest": "zephon_core.common.digest",
    # recipes
    "Recipe": "zephon_core.recipes.recipe",
    "TextCollate": "zephon_core.recipes.recipe",
    "builtin_names": "zephon_core.recipes.registry",
    "load_recipe": "zephon_core.recipes.registry",
    "recipe_from_toml": "zephon_core.recipes.registry",
    "register_kind": "zephon_core.recipes.registry",
    "register_recipe": "zephon_core.recipes.registry",
    "text_demo": "zephon_core.recipes.text",
    "text_loader": "zephon_core.recipes.text",
    "text_recipe": "zephon_core.recipes.text",
    "qwen_tokenizer_dir": "zephon_core.recipes.assets",
    "text_corpus": "zephon_core.recipes.assets",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("zephon_core", _EXPORTS, globals())
