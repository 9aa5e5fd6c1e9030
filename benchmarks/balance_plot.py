"""Per-step max/mean over ranks of vision patches, plain packing vs balanced, as a PNG.

    zephon-vl balance --recipe vlm-mix-demo --lanes 8 --dp 8 --steps 30 --json before.json
    zephon-vl balance --recipe vlm-mix-demo-balanced --lanes 8 --dp 8 --steps 30 --json after.json
    python -m zephon_bench.balance_plot before.json after.json     # writes docs/balance.png

It reads only the two reports of `zephon-vl balance`; the numbers in
docs/torchtitan.md come from the same two files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from zephon_bench.portable import ROOT


def plot(before: dict, after: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, key, title in ((axes[0], "max_over_mean_vision_patches", "vision patches"),
                           (axes[1], "max_over_mean_cost", "estimated cost")):
        for report, style in ((before, "o-"), (after, "s-")):
            ys = [s[key] for s in report["per_step"]]
            label = (f"{report['recipe']} (worst {max(ys):.2f}, fill {report['fill']:.3f})")
            ax.plot(range(len(ys)), ys, style, ms=3, label=label)
        ax.axhline(1.10, color="grey", ls="--", lw=0.8)
        ax.set_title(f"max/mean over ranks of {title}, per step")
        ax.set_xlabel("step")
        ax.set_ylim(bottom=1.0)
        ax.legend(fontsize=8)
    fig.suptitle(f"L={before['lanes']}, D={before['dp']}, {before['steps']} steps "
                 "(dashed: 1.10)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--out", default=str(ROOT / "docs" / "balance.png"))
    args = p.parse_args()
    plot(json.loads(Path(args.before).read_text()), json.loads(Path(args.after).read_text()),
         Path(args.out))
    print(args.out)


if __name__ == "__main__":
    main()
