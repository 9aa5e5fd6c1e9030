"""Shared helpers of the benchmark tests (tests/bench/)."""

from __future__ import annotations

from pathlib import Path

from zephon_bench.workload import WorkSpec


def tiny_spec(folder: Path) -> WorkSpec:
    """The per-sample work of a benchmark at test size: 14 demo samples (real photos, one
    video) in 8-sample shards, 1024-token rows, 2 rows a batch, 2 lanes, small images."""
    from zephon_core import qwen_tokenizer_dir
    from zephon_vl import build_demo_dataset

    ds = build_demo_dataset(folder, num_samples=14, videos=1, samples_per_shard=8)
    return WorkSpec(tuple(str(s) for s in ds.shards), str(qwen_tokenizer_dir()), seq_len=1024,
                    batch_rows=2, num_lanes=2, max_pixels=128 * 28 * 28, shuffle_buffer=4)
