"""`zephon-vl demo` reports the rate of delivered batches with the digest hashing off the clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zephon_vl.cli.demo as demo
from zephon_core import batch_digest
from zephon_vl.cli.main import main


@pytest.mark.slow
@pytest.mark.heavy  # 30 s on 2 cores: what `make demo` measures, not what it delivers
def test_demo_rate_leaves_digest_hashing_outside_the_clock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each digest costs 1000 s of a fake clock: a rate over 1/1000 steps/s proves the clock
    never ran while a digest was hashed, and the digests still agree across resumes."""
    offset = [0.0]
    real = demo.time.perf_counter

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            return real() + offset[0]

    def slow_digest(batch: dict) -> str:
        offset[0] += 1000.0
        return batch_digest(batch)

    monkeypatch.setenv("ZEPHON_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(demo, "time", Clock)
    monkeypatch.setattr(demo, "batch_digest", slow_digest)
    out = tmp_path / "demo.json"
    rc = main(["demo", "--samples", "240", "--steps", "3", "--save-at", "1", "--lanes", "2",
               "--dp", "1", "--resume-dp", "2", "--runner", "inline", "--json", str(out)])
    summary = json.loads(out.read_text())
    assert rc == 0 and summary["ok"]
    assert offset[0] >= 3000.0  # every step of the uninterrupted run was hashed
    assert 0.001 < summary["steps_per_s"] and summary["samples_per_s"] > 0.1
    assert len({d["D=1"] for d in summary["digests"].values()}) == 3
