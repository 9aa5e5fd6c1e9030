"""`zephon-vl bench`: the throughput benchmark against Grain, torch DataLoader and the raw limit.

The harness is the `zephon_bench` package (the repository's ``benchmarks/``
folder, installed with zephon-vl); Grain and psutil come with the ``bench``
extra.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from zephon_core import ZephonError
from zephon_vl.cli.registry import command


def _harness() -> ModuleType:
    try:
        return importlib.import_module("zephon_bench.vlm_bench")
    except ImportError as exc:
        raise ZephonError(f"the benchmark harness cannot be imported ({exc}); install the "
                          "bench extra: pip install 'zephon-vl[bench]'") from None


def _configure(p: argparse.ArgumentParser) -> None:
    try:
        _harness().add_arguments(p)
    except ZephonError as exc:
        p.description = f"{p.description} (unavailable: {exc})"


@command("bench", "throughput against Grain, torch DataLoader and the raw limit "
         "(samples/s, tokens/s, CPU, memory, time to first batch)", _configure)
def cmd_bench(args: argparse.Namespace) -> int:
    return _harness().run(args)
