"""The extension surface: what `zephon_vl`, adapters and benchmarks may use from the engine
beyond `zephon_core.__all__`.

A format, an operator, a model family or a trainer adapter needs a few of the engine's
building blocks (how a shard is opened, how a sample's JSON is read, a checkpoint's envelope,
the operator-name check behind ``--workers``). They are named here, once, so the rest of the
engine can change behind them; `zephon_vl` imports only ``zephon_core`` and this module
(checked by ``lint-imports``, see docs/architecture.md). Names resolve lazily, like the
package's own.
"""

from __future__ import annotations

from zephon_core.common.exports import lazy_exports

_EXPORTS: dict[str, str] = {
    # packaging a package's names
    "lazy_exports": "zephon_core.common.exports",
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
    "gloo_group": "zephon_core.engine.checkpoint",
    "CHECKPOINT_FORMAT": "zephon_core.engine.checkpoint:FORMAT",
    "parse_state": "zephon_core.engine.state_check",
    "shard_samples": "zephon_core.engine.state_check",
    "LaneSnapshot": "zephon_core.engine.snapshot",
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
