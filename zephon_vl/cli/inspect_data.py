"""`zephon-vl inspect-data --recipe R`: does my data get in, and as what?

Reads the first ``--samples`` samples of every dataset of the recipe (in the
order training draws them) through the recipe's own transforms
(`zephon_core.internals.probe_dataset`) and reports, per dataset: how it is read, how
many samples are kept and dropped by reason (with a few sample keys and
details each), tokens and trained tokens per sample, images per sample,
image sizes after the resize and vision tokens. It warns when a dataset
trains no tokens (e.g. chat roles the format does not map, so no turn is an
assistant turn) or drops most of its samples. ``--png DIR`` writes one chart
of histograms per dataset; ``--json PATH`` the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zephon_vl.cli.registry import command

#: drops kept as examples per reason
EXAMPLES = 3


@dataclass
class DataReport:
    """What `inspect_data` found in one dataset's first samples."""

    dataset: int
    name: str
    #: the dataset's format (``llava``, ``parquet``...), else its reader's class name
    format: str
    shards: int
    read: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    trained: list[int] = field(default_factory=list)
    images: list[int] = field(default_factory=list)
    vision_tokens: list[int] = field(default_factory=list)
    #: (height, width) in pixels after the resize, one per image
    sizes: list[tuple[int, int]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def inspect_data(recipe: Any, samples: int) -> list[DataReport]:
    from zephon_core.internals import probe_dataset

    image = getattr(recipe.collate, "image", None)
    patch = getattr(image, "patch_size", None)
    from zephon_vl.cli.progress import Progress

    reports = []
    progress = Progress("zephon-vl inspect-data", len(recipe.datasets) * samples, "samples")
    for j, ds in enumerate(recipe.datasets):
        rep = DataReport(j, ds.name, ds.format or type(ds.reader).__name__,
                         ds.reader.num_shards)
        for got in probe_dataset(recipe, j, samples):
            rep.read += 1
            progress.update(j * samples + rep.read, ds.name)
            if got.dropped is not None:
                reason = got.dropped.reason
                rep.dropped[reason] = rep.dropped.get(reason, 0) + 1
                if len(rep.examples.setdefault(reason, [])) < EXAMPLES:
                    where = got.key or got.origin.where()
                    rep.examples[reason].append(f"{where}: {got.dropped.detail}".rstrip(": "))
                continue
            rep.kept += 1
            _measure(rep, got.payload, patch)
        _warn(rep)
        reports.append(rep)
    progress.close()
    return reports


def _measure(rep: DataReport, payload: Any, patch: int | None) -> None:
    tokens = np.asarray(payload["tokens"])
    targets = payload.get("targets")
    rep.tokens.append(int(tokens.size))
    rep.trained.append(int(np.asarray(targets, dtype=bool).sum()) if targets is not None
                       else int(tokens.size))
    grids = payload.get("grid_thw") or []
    rep.images.append(len(grids))
    rep.vision_tokens.append(int((payload.get("costs") or {}).get("vision_tokens", 0)))
    if patch:
        rep.sizes += [(int(g[1]) * patch, int(g[2]) * patch) for g in grids]


def _warn(rep: DataReport) -> None:
    if rep.kept and max(rep.trained) <= 1:
        what = "no token" if not any(rep.trained) else "at most one token (the end of text)"
        rep.warnings.append(
            f"dataset {rep.name!r} trains {what} per sample in {rep.kept} kept samples: chat "
            "roles not mapped to user/assistant (e.g. LLaVA's human/gpt)? a format or field "
            "map that does not fit the records?")
    if rep.read and rep.kept < rep.read / 2:
        top = max(rep.dropped, key=rep.dropped.get)  # type: ignore[arg-type]
        rep.warnings.append(f"dataset {rep.name!r} drops {rep.read - rep.kept} of {rep.read} "
                            f"samples (mostly {top}): check the format and fields")


def _spread(values: list[int] | list[float]) -> str:
    if not values:
        return "-"
    a = np.asarray(values)
    return f"min {a.min():g}, median {np.median(a):g}, max {a.max():g}"


def describe(rep: DataReport) -> str:
    lines = [f"dataset {rep.dataset} {rep.name!r} (format {rep.format}, {rep.shards} shard(s)): "
             f"{rep.read} read, {rep.kept} kept, {rep.read - rep.kept} dropped"]
    for reason, n in sorted(rep.dropped.items(), key=lambda x: -x[1]):
        lines.append(f"  dropped {reason}: {n}, e.g. " + "; ".join(rep.examples[reason]))
    lines.append(f"  tokens per sample: {_spread(rep.tokens)}")
    lines.append(f"  trained tokens per sample: {_spread(rep.trained)}")
    if any(rep.images):
        counts = np.bincount(rep.images)
        lines.append("  images per sample: " + ", ".join(
            f"{k}: {c}" for k, c in enumerate(counts.tolist()) if c))
        lines.append(f"  vision tokens per sample: {_spread(rep.vision_tokens)}")
        if rep.sizes:
            px = [h * w for h, w in rep.sizes]
            h, w = rep.sizes[int(np.argsort(px)[len(px) // 2])]
            lines.append(f"  image size after resize: median {w}x{h} px, pixels "
                         f"{_spread(px)}")
    lines += [f"  WARNING: {w}" for w in rep.warnings]
    return "\n".join(lines)


def plot(rep: DataReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("tokens per sample", rep.tokens), ("trained tokens per sample", rep.trained),
              ("images per sample", rep.images), ("vision tokens per sample", rep.vision_tokens)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    for ax, (title, values) in zip(axes, panels, strict=True):
        ax.hist(values or [0], bins=min(30, max(1, len(set(values)))), color="#4a7ab7")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("samples")
    fig.suptitle(f"dataset {rep.dataset} {rep.name!r}: {rep.kept} kept of {rep.read} read")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", required=True, help="a built-in recipe name or a TOML file")
    p.add_argument("--samples", type=int, default=64, help="samples read per dataset")
    p.add_argument("--png", default="", metavar="DIR", help="write one PNG of histograms "
                   "per dataset into DIR")
    p.add_argument("--json", default="", metavar="PATH", help="write the numbers as JSON")


@command("inspect-data", "read a few samples of each dataset of a recipe and say what gets "
         "in: kept, dropped by reason, tokens, images", _args)
def cmd_inspect_data(args: argparse.Namespace) -> int:
    from zephon_core import load_recipe

    reports = inspect_data(load_recipe(args.recipe), args.samples)
    for rep in reports:
        print(describe(rep))
        for w in rep.warnings:
            print(f"zephon-vl inspect-data: warning: {w}", file=sys.stderr)
    if args.png:
        out = Path(args.png)
        out.mkdir(parents=True, exist_ok=True)
        for rep in reports:
            plot(rep, out / f"dataset-{rep.dataset}-{rep.name}.png")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in reports], indent=1))
    return 0
