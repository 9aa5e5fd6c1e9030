"""`zephon-vl check-batches --config NAME`: would the model accept every micro-batch?

Builds the TorchTitan config's ``ZephonDataLoader`` as the Trainer would and
runs the model family's forward-side input checks on every micro-batch of
every rank of each rank count of ``--dp``, all cut from one pass of the
pipeline (:mod:`zephon_vl.titan.check`). ``--steps 0``
(the default) walks one full pass of the recipe. Exit 0 when every
micro-batch passes, 1 naming the first one the model would refuse.
"""

from __future__ import annotations

import argparse
import json

from zephon_vl.cli.registry import command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True,
                   help="a ready config, e.g. zephon_qwen35_debug (as TorchTitan's --config)")
    p.add_argument("--module", default="zephon_vl.titan",
                   help="the module that holds it (as TorchTitan's --module)")
    p.add_argument("--recipe", default="", help="another recipe than the config's")
    p.add_argument("--dp", default="1,2,8",
                   help="rank counts to check, comma-separated (each must divide num_lanes)")
    p.add_argument("--steps", type=int, default=0, help="steps per rank count (0: one full pass)")
    p.add_argument("--local-batch-size", type=int, default=0,
                   help="rows per micro-batch (0: the config's training.local_batch_size)")
    p.add_argument("--video-mode", default="", choices=["", "merge", "split"],
                   help="the dataloader's video_mode (default: the config's)")
    p.add_argument("--runner", default="", help="execution runner (never changes a batch)")
    p.add_argument("--json", default="", metavar="PATH", help="write the reports as JSON")


@command("check-batches", "run a TorchTitan model's own input checks over zephon's batches",
         _args)
def cmd_check_batches(args: argparse.Namespace) -> int:
    from zephon_vl.cli.progress import Progress
    from zephon_vl.titan.check import BatchRefused, check_titan_passes, load_titan_config

    config = load_titan_config(args.config, args.module)
    overrides = {k: v for k, v in (("recipe", args.recipe), ("runner", args.runner),
                                   ("video_mode", args.video_mode)) if v}
    dps = [int(d) for d in args.dp.split(",")]
    sizes = dict.fromkeys(dps, args.local_batch_size)
    try:
        with Progress("zephon-vl check-batches", args.steps or None, "steps") as progress:
            reports = check_titan_passes(config, dps, args.steps or None, sizes,
                                         lambda k: progress.update(k, f"D={args.dp}"),
                                         **overrides)
    except BatchRefused as exc:
        print(f"REFUSED {exc}")
        return 1
    for report in reports:
        print(f"D={report.dp}: {report.recipe} as {report.model_format}: {report.steps} steps, "
              f"{report.micro_batches} micro-batches, {report.rows} rows, "
              f"{report.vision_items} vision items, "
              f"{report.micro_batches_without_vision} micro-batches without vision: accepted")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.report() for r in reports], f, indent=1)
    return 0
