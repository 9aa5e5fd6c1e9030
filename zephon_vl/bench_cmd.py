"""`zephon-vl bench`: the throughput benchmark against Grain, torch DataLoader and the raw limit.

The harness lives in the source tree's ``benchmarks/`` folder (it is not part
of the installed packages); this command finds it next to ``zephon_vl``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

from zephon_core.errors import ZephonError

from .cli import command


def _harness() -> ModuleType:
    root = Path(__file__).resolve().parents[1]
    if not (root / "benchmarks" / "vlm_bench.py").is_file():
        raise ZephonError(
            f"the benchmark harness is not there ({root / 'benchmarks'}); run "
            "`zephon-vl bench` from a source checkout (pip install -e '.[bench]')")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    mod = importlib.import_module("benchmarks.vlm_bench")
    if Path(mod.__file__).resolve().parent != root / "benchmarks":
        raise ZephonError(f"another 'benchmarks' package shadows zephon's: {mod.__file__}")
    return mod


def _configure(p: argparse.ArgumentParser) -> None:
    try:
        _harness().add_arguments(p)
    except ZephonError as exc:
        p.description = f"{p.description} (unavailable: {exc})"


@command("bench", "throughput against Grain, torch DataLoader and the raw limit "
         "(samples/s, tokens/s, CPU, memory, time to first batch)", _configure)
def cmd_bench(args: argparse.Namespace) -> int:
    return _harness().run(args)
