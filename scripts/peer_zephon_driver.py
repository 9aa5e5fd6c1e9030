"""Runs inside the peer virtual environment (``zephon`` 0.2.0), never in zephon-vl's.

Reads a JSON job from argv[1]: ``{"tokenizers": {label: folder}, "datasets": {name:
folder}, "expected": {name: count}, "variants": {variant: {"tokenizer": label,
"normalize_newlines": bool, "chunk_size": int}}, "out": path}``, reads each folder
with the original Zephon's own reader (``Dataset.from_path``), runs
``decode_text(normalize_newlines=...)`` and tokenizes the ``text`` field with its
public ``Pipeline.tokenize``
(``special_tokens="eos"``: the Qwen tokenizer has no BOS, and zephon-vl's `Tokenize`
appends EOS and no BOS by default), and writes ``{"version": ...,
"split_special_tokens": ..., "ids": {variant: {name: {doc id: [token ids]}}}}`` to
``out``. Each document carries an ``id`` field (kept with
``preserve_upstream_payload``), so the mapping never depends on the order the
pipeline delivers documents in. Only the public API of ``zephon`` is used here.
"""

from __future__ import annotations

import json
import sys


def tokenize_folder(name: str, folder: str, tokenizers: dict[str, str], expected: int,
                    variant: dict) -> dict[str, list[int]]:
    """Every document of `folder` it delivers, keyed by its ``id`` field, as zephon
    0.2.0 tokenizes it."""
    from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource

    # chunk_size: the default (16384) refuses a dataset smaller than one chunk.
    ws = StaticMixtureWorkSource(datasets=[Dataset.from_path(name, folder)],
                                 mixture=MixtureSpec({name: 1.0}), seed=0,
                                 chunk_size=variant["chunk_size"], shuffle_shards=False,
                                 stop_after_passes=1)
    pipeline = (Pipeline(ws).decode_text(normalize_newlines=variant["normalize_newlines"])
                .tokenize(tokenizer_id=tokenizers[variant["tokenizer"]], field="text",
                          special_tokens="eos", add_attention_mask=False,
                          preserve_upstream_payload=True))
    out: dict[str, list[int]] = {}
    for seen, record in enumerate(pipeline):
        payload = record.payload
        out[str(payload["id"])] = [int(t) for t in payload["input_ids"]]
        # A dataset that repeats (an exhaustion policy other than stopping) would
        # never end: stop once every document has come back, or after a second pass.
        if len(out) == expected or seen > 2 * expected:
            break
    return out


def main() -> None:
    job = json.loads(open(sys.argv[1], encoding="utf-8").read())
    import zephon
    from transformers import AutoTokenizer

    # What zephon's tokenize op gets from `tokenizer_id`: the same call it makes.
    split = {label: bool(getattr(AutoTokenizer.from_pretrained(path, use_fast=True),
                                 "split_special_tokens", False))
             for label, path in job["tokenizers"].items()}
    result = {"version": zephon.__version__, "split_special_tokens": split,
              "ids": {v: {name: tokenize_folder(name, folder, job["tokenizers"],
                                                job["expected"][name], variant)
                          for name, folder in job["datasets"].items()}
                      for v, variant in job["variants"].items()}}
    with open(job["out"], "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
