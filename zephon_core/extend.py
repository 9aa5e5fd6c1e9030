"""The extension surface: what an author of a dataset format, an operator, a model family,
a lane concern or a trainer adapter uses from the engine beyond `zephon_core.__all__`,
which is for users.

Such an author needs a few of the engine's building blocks (the operator and reader
contracts, how a shard is opened and a sample's JSON read, how settings are declared and
checked, how a package registers its formats and serves its names, a checkpoint's state
check, the operator-name check behind ``--workers``). They are named here, once, so the
rest of the engine can change behind them; each is described in one line in docs/api.md
(a test checks that every name is). `zephon_vl` imports only ``zephon_core``, this module
and `zephon_core.internals` (checked by ``lint-imports``, see docs/architecture.md).

What tests, benchmarks and tools use to look inside the engine (runners, the
shared-memory pool, a lane's snapshot, the ledger's lines) is in `zephon_core.internals`
since 0.4.0; those names, and the two that left the public surface, still resolve here
with a `DeprecationWarning` until 0.5.0 (`_MOVED`). The API snapshot (docs/api.txt) covers
this module like the user namespaces: a change here is on purpose too. Names resolve
lazily, like the package's own.
"""

from __future__ import annotations

from zephon_core.common.deprecation import moved_names, removed_names
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
    "RowTransform": "zephon_core.ops.row_transform",
    "RowStageFn": "zephon_core.ops.row_transform",
    "RowFiller": "zephon_core.ops.pack",
    # bytes a lane holds in a worker's shared memory, sent on to another worker by name
    "SharedBytes": "zephon_core.engine.shm_slices",
    "shared_bytes": "zephon_core.engine.shm_slices",
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
    "settings_from_table": "zephon_core.common.settings",
    "forwards_to": "zephon_core.recipes.registry",
    "settings_groups": "zephon_core.recipes.registry",
    "dataset_keys": "zephon_core.recipes.registry",
    # deprecating a name, keyword or recipe-file key of your own (docs/api.md)
    "moved_keywords": "zephon_core.common.deprecation",
    "moved_names": "zephon_core.common.deprecation",
    "deprecations": "zephon_core.common.deprecation",
    "deprecation": "zephon_core.common.deprecation",
    "Deprecation": "zephon_core.common.deprecation",
    # files and the machine
    "usable_cores": "zephon_core.common.system",
    "atomic_write": "zephon_core.common.files",
    "cache_dir": "zephon_core.common.files",
    "loads_sample": "zephon_core.common.jsontext",
    "file_sha256": "zephon_core.common.digest",
    "option_path": "zephon_core.data.formats",
    "later_shard_field": "zephon_core.common.later",
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
    # for adapters: the operator-name check behind --workers, a checkpoint's state check
    "unknown_operators": "zephon_core.engine.plan",
    "gloo_group": "zephon_core.engine.checkpoint",
    "parse_state": "zephon_core.engine.state_check",
    # a lane concern of your own (`Loader(lane_hooks=...)`, docs/architecture.md)
    "LaneHook": "zephon_core.engine.lane_hooks",
    "LaneView": "zephon_core.engine.lane_hooks",
    # the batch geometry rule (G a multiple of L, D dividing L), for the adapters
    "check_lane_geometry": "zephon_core.spec",
}

#: names that moved to `zephon_core.internals` in 0.4.0: no author of a format, family,
#: operator or adapter needs them; tests, benchmarks and tools look inside the engine there
_INTERNALS = (
    "CHECKPOINT_FORMAT", "LaneSnapshot", "Packed", "Plan", "Probed", "RunnerSpec",
    "SegmentPool", "StageKind", "WAIT_WARN_SHARE", "combiner_state", "compare_entries",
    "lane_entries", "make_runner", "mixture_shares", "parse_resources", "parse_runners",
    "parse_workers", "probe_dataset", "reader_keys", "recipe_file_keys", "recorder_for",
    "sample_digest", "shard_samples", "split_workers", "step_entry", "unpack")

#: names that leave the public surface in 0.4.0 (nothing outside the engine used them);
#: 0.5.0 removes them here
_REMOVED = {
    "Backlog": "zephon_core.engine.backlog.Backlog",
    "accepted_keys": "zephon_core.recipes.registry.accepted_keys",
}

_MOVED = {
    **moved_names("zephon_core.extend",
                  {name: f"zephon_core.internals.{name}" for name in _INTERNALS}, "0.4.0"),
    **removed_names("zephon_core.extend", _REMOVED, "0.4.0",
                    "the engine's own; nothing outside it used it"),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("zephon_core.extend", _EXPORTS, globals(), _MOVED)
