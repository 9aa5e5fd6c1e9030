"""Throughput harness: zephon-vl against Google Grain, torch DataLoader and the raw limit.

Run it with ``zephon-vl bench`` (or ``python -m zephon_bench.vlm_bench``); see
docs/benchmarks.md for what is measured and how.
"""
