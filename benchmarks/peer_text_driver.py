"""The original Zephon (``zephon`` 0.2.0) on the text workload: runs in the peer's own
virtual environment (:mod:`zephon_bench.text_peer`), never in zephon-vl's, and imports
nothing of zephon-vl.

``python peer_text_driver.py JOB.json``. The job: ``{"datasets": {name: folder},
"weights": {name: weight}, "tokenizer": folder, "rows": n, "seq_len": 2048,
"open_rows": 4, "lanes": 8, "rows_per_batch": 2, "chunk_size": n, "runner": "threads" |
"process", "parallelism": n, "eos": id, "out": path}``. The pipeline is the one the
issue describes, with the peer's public API only: its JSONL reader, a
`StaticMixtureWorkSource` (shuffled shards and samples), ``decode_text`` (newlines
kept, as zephon-vl keeps them), ``tokenize`` (EOS appended; the tokenizer folder is a
copy with ``split_special_tokens`` on, so the ids are zephon-vl's), ``pack_flat``
(best fit into `open_rows` rows of `seq_len`) and ``batch``; `lanes` canonical
replicas. It writes ``{"t_start", "events": [[t, rows, tokens], ...]}`` to ``out``:
`t` when each batch reached this process (``time.monotonic``, the same clock as the
harness), its rows and its real (non-padding) tokens, until `rows` rows came.
"""

from __future__ import annotations

import json
import sys
import time


def pipeline(job: dict):
    from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource

    datasets = [Dataset.from_path(name, folder) for name, folder in job["datasets"].items()]
    ws = StaticMixtureWorkSource(datasets=datasets, mixture=MixtureSpec(job["weights"]),
                                 seed=0, chunk_size=job["chunk_size"], shuffle_shards=True,
                                 shuffle_within_shard=True)
    return (Pipeline(ws).decode_text(normalize_newlines=False)
            .tokenize(tokenizer_id=job["tokenizer"], field="text", special_tokens="eos",
                      add_attention_mask=False, parallelism=job["parallelism"])
            .pack_flat(job["seq_len"], num_bins=job["open_rows"], algorithm="best_fit",
                       pad_token_id=job["eos"])
            .batch(job["rows_per_batch"])
            .options(canonical_replicas=job["lanes"], runner=job["runner"]))


def real_tokens(batch) -> tuple[int, int]:
    """Rows and real (non-padding) tokens of one batch, from each row's packing record."""
    rows = batch.records
    return len(rows), sum(int(r.meta.tags["_packing_metadata"]["total_length"]) for r in rows)


def main() -> None:
    job = json.loads(open(sys.argv[1], encoding="utf-8").read())
    t_start = time.monotonic()
    events = []
    rows = 0
    for batch in pipeline(job):
        n, tokens = real_tokens(batch)
        rows += n
        events.append([time.monotonic(), n, tokens])
        if rows >= job["rows"]:
            break
    with open(job["out"], "w", encoding="utf-8") as f:
        json.dump({"t_start": t_start, "events": events}, f)
    sys.stdout.flush()
    import os

    os._exit(0)  # the pipeline's workers are daemons; skip a slow orderly shutdown


if __name__ == "__main__":
    main()
