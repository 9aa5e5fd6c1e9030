"""What a lane holds and what a restore recomputes, with pixels decoded before the packer
or after it: counted, not timed (the machine may be shared).

Three orders of work on the same recipe and data (the demo's real photos and clips):

- ``early``: every image decoded before the packer (``DecodeVision.plan = False``);
- ``tokenizer``: planned from headers, decoded by the tokenizer for a sample that fits
  (issue 38 stages 1-2: ``row_ops = []``, ``TokenizeMultimodal.decode_planned``);
- ``rows``: planned, decoded after the packer by the row transform `DecodePlanned`, for
  the rows made only (``decode_after_pack = true``).

For each: images and clips decoded over `--steps` steps; after each step the bytes of the
documents in the open packer bins (``bin_bytes``: finished and not yet in a row, told by a
`LaneHook`) and of all finished documents the lanes hold (``held_bytes``:
`LoaderMetrics.backlog_bytes`, bins and rows waiting for their step; pixels a row
transform makes are not documents); then a restore from the state after the last step:
the state's JSON size, the decodes the restore runs and the bytes the restored lanes
hold. For scale, the mean bytes of a
step's collated ``pixel_values`` (``rows`` holds the decoded pixels of the rows made
ahead of the consumer besides its documents: at most `prefetch_steps` + 1 steps of
them). The batches of all three are the same (checked). One rank, inline runner, so
every decode is counted in this process.
Run: ``python scripts/planned_restore_cost.py [--steps 12] [--samples 200]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import zephon_vl.media.image as image_mod
import zephon_vl.media.video as video_mod
from zephon_core import Execution, Loader, batch_digest
from zephon_core.extend import LaneHook
from zephon_vl import build_demo_dataset, vlm_recipe
from zephon_vl.families.registry import get_family

DECODES = [0]


def _counting(fn):
    def wrapped(*args, **kwargs):
        DECODES[0] += 1
        return fn(*args, **kwargs)
    return wrapped


# every decode of an image or a clip ends in `finish_patches` (a blank does not count)
image_mod.finish_patches = _counting(image_mod.finish_patches)
video_mod.finish_patches = _counting(video_mod.finish_patches)


def payload_bytes(obj: Any) -> int:
    """Bytes of the arrays a payload holds (a planned item's encoded bytes included)."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(payload_bytes(v) for v in obj)
    data = getattr(obj, "data", None)  # PlannedItem
    return data.nbytes if isinstance(data, np.ndarray) else 0


class BinBytes(LaneHook):
    """Bytes of the documents a lane has finished and not yet placed in a row: the open
    packer bins (and the few on their way to the packer), told by the lane's events."""

    hooks: list[BinBytes] = []

    def __init__(self) -> None:
        self.held: dict[Any, int] = {}
        BinBytes.hooks.append(self)

    def document(self, origin: Any, payload: Any) -> None:
        self.held[origin] = payload_bytes(payload)

    def refused(self, origin: Any) -> None:
        self.held.pop(origin, None)

    def dropped(self, origin: Any, reason: str) -> None:
        self.held.pop(origin, None)

    def row(self, lane: Any, row: Any) -> None:
        for s in row.segments:
            if s.end >= len(s.payload["tokens"]):
                self.held.pop(s.origin, None)

    @classmethod
    def total(cls) -> int:
        return sum(sum(h.held.values()) for h in cls.hooks)


def recipe_for(shards: list[str], mode: str):
    image = get_family("qwen3_5").image_settings(max_pixels=512 * 512)
    recipe = vlm_recipe(shards, None, seq_len=4096, global_batch_size=8, num_lanes=4,
                        image=image, shuffle_buffer=16,
                        pack={"max_open_bins": 8, "decode_after_pack": True})
    decode = next(o for o in recipe.ops if o.name == "decode")
    tokenize = next(o for o in recipe.ops if o.name == "tokenize")
    if mode == "rows":
        return recipe
    tokenize.decode_planned = True
    decode.plan = mode == "tokenizer"
    return dataclasses.replace(recipe, row_ops=[])


def measure(shards: list[str], mode: str, steps: int) -> dict:
    ex = Execution(runner="inline", prefetch_steps=1)
    DECODES[0] = 0
    held, bins, digests, pixels = [], [], [], []
    BinBytes.hooks = []
    with Loader(recipe_for(shards, mode), 0, 1, ex,
                lane_hooks=lambda lane: [BinBytes()]) as loader:
        for _ in range(steps):
            batch = next(loader)
            digests.append(batch_digest(batch))
            pixels.append(batch["pixel_values"].numel() * batch["pixel_values"].element_size())
            held.append(loader.metrics().backlog_bytes)
            bins.append(BinBytes.total())
        state = loader.state_dict()
    run_decodes = DECODES[0]
    DECODES[0] = 0
    BinBytes.hooks = []
    with Loader(recipe_for(shards, mode), 0, 1, ex,
                lane_hooks=lambda lane: [BinBytes()]) as loader:
        BinBytes.hooks = []  # the hooks of the lanes the restore builds
        loader.load_state_dict(state)
        restore_decodes = DECODES[0]
        restored_bytes = loader.metrics().backlog_bytes
        restored_bins = BinBytes.total()
        digests.append(batch_digest(next(loader)))
    return {"mode": mode, "decodes_in_run": run_decodes,
            "bin_bytes_mean": sum(bins) // len(bins), "bin_bytes_max": max(bins),
            "held_bytes_mean": sum(held) // len(held), "held_bytes_max": max(held),
            "batch_pixel_bytes_mean": sum(pixels) // len(pixels),
            "state_json_bytes": len(json.dumps(state)), "decodes_at_restore": restore_decodes,
            "held_bytes_after_restore": restored_bytes,
            "bin_bytes_after_restore": restored_bins, "digests": digests}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--samples", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        demo = build_demo_dataset(out_dir=Path(tmp) / "demo", num_samples=args.samples,
                                  seed=0, videos=max(1, args.samples // 25),
                                  samples_per_shard=50)
        shards = [str(s) for s in demo.shards]
        results = [measure(shards, mode, args.steps) for mode in ("early", "tokenizer", "rows")]
    same = len({tuple(r.pop("digests")) for r in results}) == 1
    for r in results:
        print(json.dumps(r))
    print(json.dumps({"same_batches": same, "steps": args.steps, "samples": args.samples}))
    if not same:
        raise SystemExit("the three orders of work made different batches")


if __name__ == "__main__":
    main()
