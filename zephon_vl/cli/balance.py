"""`zephon-vl balance`: what each rank's micro-batches cost, step by step.

Per step and rank: rows, images, vision patches, text tokens and the
estimated cost (the cost model below); over the run, the worst step's
max/mean over ranks of vision patches and of cost, the fill, and how many
micro-batches hold no image, with the recipe's row filler (guarantee 10) and,
in a second run of the same recipe, without it.

Cost model (relative units, one per LLM token): every token of a row costs 1
(text and vision placeholders alike), every vision patch `patch_weight` (the
vision encoder's work per patch), and every document of `n` tokens adds
``n * n / seq_len`` for attention (quadratic in the document, as a
document-masked attention computes it). It ranks rows and ranks by work; it
is not a FLOP count.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_core import ConfigError
from zephon_vl.cli.common import positive_int
from zephon_vl.cli.registry import command
from zephon_vl.ops.collate import VLCollate

#: the vision encoder's cost of one patch, in units of one LLM token (see the module doc)
PATCH_WEIGHT = 1.0


@dataclass
class RowCost:
    """What one row holds, and its estimated cost."""

    images: int
    own_images: int
    vision_patches: int
    text_tokens: int
    tokens: int
    filler_tokens: int
    cost: float
    #: vision tokens of the row's own documents (no filler), the unit of a balance budget
    own_vision_tokens: int = 0


def row_cost(row: Any, seq_len: int, vision_ids: np.ndarray,
             patch_weight: float = PATCH_WEIGHT) -> RowCost:
    """`row` (a packed `Row` of a VLM recipe) under the cost model of this module."""
    images = own = patches = placeholders = tokens = filler = own_vt = 0
    attention = 0.0
    for seg in row.segments:
        n = seg.end - seg.start
        tokens += n
        if seg.origin.dataset < 0:
            filler += n
        grids = seg.payload.get("grid_thw") or []
        images += len(grids)
        own += 0 if seg.origin.dataset < 0 else len(grids)
        if seg.origin.dataset >= 0:
            own_vt += int((seg.payload.get("costs") or {}).get("vision_tokens", 0))
        patches += sum(int(np.prod(g)) for g in grids)
        toks = np.asarray(seg.payload["tokens"][seg.start:seg.end])
        placeholders += int(np.isin(toks, vision_ids).sum())
        attention += n * n / seq_len
    cost = tokens + patch_weight * patches + attention
    return RowCost(images, own, patches, tokens - placeholders, tokens, filler, cost, own_vt)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default="vlm-mix-demo", help="built-in VLM recipe or TOML file")
    p.add_argument("--lanes", type=positive_int, default=8, help="L")
    p.add_argument("--dp", type=positive_int, default=8, help="data-parallel ranks D")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--microbatches", type=int, default=1,
                   help="micro-batches per rank and step (gradient accumulation)")
    p.add_argument("--pack-mode", default=None,
                   help="override the recipe's pack mode (e.g. best_fit to compare)")
    p.add_argument("--json", default=None, help="write the report here")


def _run(args: argparse.Namespace, image_every_row: bool | None) -> dict:
    from zephon_core import Execution, SimulatedRanks, load_recipe
    from zephon_core.internals import Plan

    over: dict[str, Any] = {"num_lanes": args.lanes}
    if image_every_row is not None:
        over["image_every_row"] = image_every_row
    if args.pack_mode:
        over["pack_mode"] = args.pack_mode
    recipe = load_recipe(args.recipe, **over)
    collate = recipe.collate
    if not isinstance(collate, VLCollate):
        raise ConfigError(f"recipe {recipe.name!r} is text-only; balance reports on VLM recipes")
    vision_ids = np.asarray(collate.family.vision_token_ids(collate.special), dtype=np.int64)
    seq_len = collate.seq_len
    ex = Execution()
    runners = Plan(recipe.ops, ex).make_runners()
    steps: list[list[list[RowCost]]] = []
    try:
        sim = SimulatedRanks(recipe, args.dp, ex, runners)
        for _ in range(args.steps):
            ranks = [loader.next_rows() for loader in sim.loaders]
            if any(r is None for r in ranks):
                break
            steps.append([[row_cost(r, seq_len, vision_ids) for r in rows] for rows in ranks])
    finally:
        for runner in runners.values():
            runner.close()
    return _summary(steps, seq_len, args.microbatches)


def _summary(steps: list[list[list[RowCost]]], seq_len: int, microbatches: int) -> dict:
    per_step, zero_mb = [], 0
    worst_vp = worst_cost = 1.0
    tokens = rows = filler = bare = own_vt = 0
    ratios: dict[str, list[float]] = {"vision_patches": [], "cost": []}
    for t, ranks in enumerate(steps):
        entry = []
        for d, rows_ in enumerate(ranks):
            if len(rows_) % microbatches:
                raise ConfigError(f"{len(rows_)} rows per rank do not split into "
                                  f"{microbatches} micro-batches")
            k = len(rows_) // microbatches
            zero_mb += sum(1 for m in range(microbatches)
                           if sum(r.images for r in rows_[m * k:(m + 1) * k]) == 0)
            entry.append({"rank": d, "rows": len(rows_),
                          "images": sum(r.images for r in rows_),
                          "vision_patches": sum(r.vision_patches for r in rows_),
                          "text_tokens": sum(r.text_tokens for r in rows_),
                          "filler_tokens": sum(r.filler_tokens for r in rows_),
                          "cost": round(sum(r.cost for r in rows_), 1)})
            tokens += sum(r.tokens for r in rows_)
            filler += sum(r.filler_tokens for r in rows_)
            rows += len(rows_)
            bare += sum(1 for r in rows_ if r.own_images == 0)
            own_vt += sum(r.own_vision_tokens for r in rows_)
        for key in ("vision_patches", "cost"):
            values = [e[key] for e in entry]
            ratio = max(values) / max(np.mean(values), 1e-9)
            ratios[key].append(round(ratio, 4))
            if key == "vision_patches":
                worst_vp = max(worst_vp, ratio)
            else:
                worst_cost = max(worst_cost, ratio)
        per_step.append({"step": t, "ranks": entry,
                         "max_over_mean_vision_patches": ratios["vision_patches"][-1],
                         "max_over_mean_cost": ratios["cost"][-1]})
    return {"steps": len(steps), "zero_image_microbatches": zero_mb,
            "max_over_mean_vision_patches": round(worst_vp, 4),
            "max_over_mean_cost": round(worst_cost, 4),
            "median_max_over_mean_vision_patches":
                round(float(np.median(ratios["vision_patches"] or [1.0])), 4),
            "median_max_over_mean_cost": round(float(np.median(ratios["cost"] or [1.0])), 4),
            "mean_vision_tokens_per_row": round(own_vt / max(rows, 1), 2),
            "fill": round(tokens / max(rows * seq_len, 1), 4),
            "filler_token_share": round(filler / max(tokens, 1), 4),
            "rows_without_own_image": round(bare / max(rows, 1), 4),
            "per_step": per_step}


@command("balance", "per step and rank: rows, images, vision patches, text tokens and cost; "
         "micro-batches without an image, with and without the row filler", _args)
def cmd_balance(args: argparse.Namespace) -> int:
    guarded = _run(args, None)
    unguarded = _run(args, False)
    report = {"recipe": args.recipe, "lanes": args.lanes, "dp": args.dp,
              "microbatches": args.microbatches, "patch_weight": PATCH_WEIGHT,
              **{k: v for k, v in guarded.items() if k != "per_step"},
              "zero_image_microbatches_unguarded": unguarded["zero_image_microbatches"],
              "max_over_mean_vision_patches_unguarded":
                  unguarded["max_over_mean_vision_patches"],
              "fill_unguarded": unguarded["fill"],
              "per_step": guarded["per_step"]}
    summary = {k: v for k, v in report.items() if k != "per_step"}
    print(json.dumps(summary, indent=1), file=sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0
