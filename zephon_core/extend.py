"""The extension surface: what authors of formats, operators, model families and trainer
adapters (and `zephon_vl`, the benchmarks and the tools) use from the engine beyond
`zephon_core.__all__`, which is for users.

A format, an operator, a model family or a trainer adapter needs a few of the engine's
building blocks (the operator and reader contracts, how a shard is opened, how a sample's
JSON is read, how settings are declared, a checkpoint's envelope, the operator-name check
behind ``--workers``). They are named here, once, so the rest of the engine can change
behind them; `zephon_vl` imports only ``zephon_core`` and this module (checked by
``lint-imports``, see docs/architecture.md). The API snapshot (docs/api.txt) covers it like
the user namespaces: a change here is on purpose too. Names resolve lazily, like the
package's own.
"""

from __future__ import annotations

from zephon_core.common.exports import lazy_exports

_EXPORTS: dict[str, str] = {
    # packaging a package's names; its plugin (formats, recipes, kinds, families)
    "lazy_exports": "zephon_core.common.exports",
    "ensure_plugins": "zephon_core.common.plugins",
    "load_plugins": "zephon_core.common.plugins",
    "PLUGIN_GROUP": "zephon_core.common.plugins:GROUP",
    # the operator contracts: per-lane state, rows, a fused stage
    "Operator": "zephon_core.ops.contract",
    "StatefulOp": "zephon_core.ops.contract",
    "Accumulator": "zephon_core.ops.contract",
    "AccumulatorOp": "zephon_core.ops.contract",
    "Combiner": "zephon_core.ops.contract",
    "CombinerOp": "zephon_core.ops.contract",
    "Row": "zephon_core.ops.contract",
    "Segment": "zephon_core.ops.contract",
    "StageFn": "zephon_core.ops.contract",
    "RowFiller": "zephon_core.ops.pack",
    # readers and formats
    "ShardReader": "zephon_core.data.readers",
    "ReadsMany": "zephon_core.data.readers",
    "KnowsShardLengths": "zephon_core.data.readers",
    "NamesSamples": "zephon_core.data.readers",
    "register_format": "zephon_core.data.formats",
    "DataFormat": "zephon_core.data.formats",
    "data_format": "zephon_core.data.formats",
    "known_formats": "zephon_core.data.formats",
    "format_options": "zephon_core.data.formats",
    "open_shard": "zephon_core.data.storage",
    "stat_shard": "zephon_core.data.storage",
    "StoredFile": "zephon_core.data.storage",
    "StorageSettings": "zephon_core.data.storage",
    "storage_settings": "zephon_core.data.storage",
    # declaring settings and recipe factories
    "setting": "zephon_core.common.settings",
    "FlatSetting": "zephon_core.common.settings",
    "flat_settings": "zephon_core.common.settings",
    "check_choices": "zephon_core.common.settings",
    "check_settings": "zephon_core.common.settings",
    "settings_fingerprint": "zephon_core.common.settings",
    "settings_table": "zephon_core.common.settings",
    "forwards_to": "zephon_core.recipes.registry",
    "settings_groups": "zephon_core.recipes.registry",
    "dataset_keys": "zephon_core.recipes.registry",
    "accepted_keys": "zephon_core.recipes.registry",
    "recipe_file_keys": "zephon_core.recipes.registry",
    "moved_keywords": "zephon_core.common.deprecation",
    "moved_names": "zephon_core.common.deprecation",
    "deprecations": "zephon_core.common.deprecation",
    "deprecation": "zephon_core.common.deprecation",
    "Deprecation": "zephon_core.common.deprecation",
    # the engine's parsers and probes, for the command line and tools
    "StageKind": "zephon_core.engine.kinds",
    "parse_workers": "zephon_core.engine.execution",
    "parse_runners": "zephon_core.engine.execution",
    "parse_resources": "zephon_core.engine.execution",
    "Backlog": "zephon_core.engine.backlog",
    "Probed": "zephon_core.engine.probe",
    "probe_dataset": "zephon_core.engine.probe",
    "usable_cores": "zephon_core.common.system",
    "atomic_write": "zephon_core.common.files",
    "cache_dir": "zephon_core.common.files",
    "sample_digest": "zephon_core.common.digest",
    # samples and files
    "loads_sample": "zephon_core.common.jsontext",
    "file_sha256": "zephon_core.common.digest",
    "option_path": "zephon_core.data.formats",
    "dataset_reader": "zephon_core.data.formats",
    "dataset_format": "zephon_core.data.formats",
    "base_name": "zephon_core.data.storage",
    "is_remote": "zephon_core.data.storage",
    "local_path": "zephon_core.data.storage",
    "read_whole": "zephon_core.data.storage",
    "scheme_of": "zephon_core.data.storage",
    "StoredFileIO": "zephon_core.data.storage",
    "current_storage": "zephon_core.data.storage",
    # damaged Parquet files: refused at build, or corrupt_row_group bad samples
    "CORRUPT_ROW_GROUP": "zephon_core.data.parquet",
    "corrupt_group_detail": "zephon_core.data.parquet",
    "is_parquet_damage": "zephon_core.data.parquet",
    "open_parquet": "zephon_core.data.parquet",
    "parquet_layout": "zephon_core.data.parquet",
    "read_checked_group": "zephon_core.data.parquet",
    # operators
    "check_on_error": "zephon_core.ops.contract",
    "as_user_ops": "zephon_core.ops.user",
    "insert_user_ops": "zephon_core.ops.user",
    "TokenizerTransform": "zephon_core.ops.text",
    "text_row_arrays": "zephon_core.ops.pack",
    "PACK_MODES": "zephon_core.ops.pack:MODES",
    # chat framing (zephon_vl's chat records and family templates)
    "ROLES": "zephon_core.ops.chat",
    "chat_framing": "zephon_core.ops.chat",
    "chat_pieces": "zephon_core.ops.chat",
    "chatml_turn": "zephon_core.ops.chat",
    "parse_turn": "zephon_core.ops.chat",
    "record_turns": "zephon_core.ops.chat",
    # recipes
    "settings_from_table": "zephon_core.common.settings",
    # the engine, for adapters and tools
    "unknown_operators": "zephon_core.engine.plan",
    "Plan": "zephon_core.engine.plan",
    "make_runner": "zephon_core.engine.runners",
    "RunnerSpec": "zephon_core.engine.runners",
    "gloo_group": "zephon_core.engine.checkpoint",
    "CHECKPOINT_FORMAT": "zephon_core.engine.checkpoint:FORMAT",
    "parse_state": "zephon_core.engine.state_check",
    "shard_samples": "zephon_core.engine.state_check",
    "LaneSnapshot": "zephon_core.engine.snapshot",
    # a lane concern of your own (`Loader(lane_hooks=...)`, docs/architecture.md)
    "LaneHook": "zephon_core.engine.lane_hooks",
    "LaneView": "zephon_core.engine.lane_hooks",
    "combiner_state": "zephon_core.engine.snapshot",
    "mixture_shares": "zephon_core.engine.ledger",
    "lane_entries": "zephon_core.engine.ledger",
    "reader_keys": "zephon_core.engine.ledger",
    "step_entry": "zephon_core.engine.ledger",
    "compare_entries": "zephon_core.engine.ledger",
    "WAIT_WARN_SHARE": "zephon_core.engine.metrics",
    "recorder_for": "zephon_core.engine.metrics",
    "split_workers": "zephon_core.engine.autoscale",
    # the batch geometry rule (G a multiple of L, D dividing L), for the adapters
    "check_lane_geometry": "zephon_core.spec",
    # shared-memory transport (benchmarks/breakdown.py measures it)
    "SegmentPool": "zephon_core.engine.shm",
    "Packed": "zephon_core.engine.shm",
    "unpack": "zephon_core.engine.shm",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("zephon_core.extend", _EXPORTS, globals())
