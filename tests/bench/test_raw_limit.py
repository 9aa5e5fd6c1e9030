"""The raw limit of delivered batches (issue 39, item 4): its arrangements deliver what every
loader delivers, hand batches over without leaving files behind, fail loudly, and the report
says so when a loader passes the limit. Not a timed test: no rate is checked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("psutil")

from zephon_bench import e2e, raw_limit, report
from zephon_bench.vlm_bench import METRICS, e2e_configurations, summarize
from zephon_bench.workload import Work, WorkSpec

from tests.helpers.bench import tiny_spec


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> WorkSpec:
    return tiny_spec(tmp_path_factory.mktemp("limit-data"))


@pytest.fixture(scope="module")
def reference(spec: WorkSpec) -> tuple:
    """What zephon's Loader delivers (inline), as the order-free fields of its tally."""
    t = e2e.RUNNERS["zephon"](spec, {"execution": {"runner": "inline"}, "pixels": True}).tally
    return (t.samples, t.tokens, t.images, t.dropped, t.checksum, t.patches, t.pixel_sum)


def _leftovers() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(raw_limit.SHM_PREFIX)] \
        if os.path.isdir("/dev/shm") else []


def _check(trace: e2e.Trace, reference: tuple, arrangement: str) -> None:
    t = trace.tally
    assert (t.samples, t.tokens, t.images, t.dropped, t.checksum, t.patches, t.pixel_sum) \
        == reference
    assert t.samples + t.dropped == 15 and t.patches > 0 and t.pixel_sum > 0
    assert sum(e[1] for e in trace.events) == t.samples  # every batch delivered once
    assert trace.t_first is not None and trace.t_end >= trace.t_first >= trace.t_start
    assert trace.extra["arrangement"] == arrangement


@pytest.mark.parametrize("params, arrangement", [
    ({"processes": 2}, "2 processes (fork)"),
    ({"threads": 2}, "2 threads"),
])
def test_each_arrangement_delivers_what_zephon_delivers(
        spec: WorkSpec, reference: tuple, params: dict, arrangement: str) -> None:
    before = _leftovers()
    _check(e2e.RUNNERS["limit"](spec, {**params, "pixels": True}), reference, arrangement)
    assert _leftovers() == before  # the processes' shared-memory files are gone


@pytest.mark.slow
def test_spawned_processes_deliver_what_zephon_delivers(spec: WorkSpec,
                                                        reference: tuple) -> None:
    trace = e2e.RUNNERS["limit"](spec, {"processes": 2, "start_method": "spawn",
                                        "pixels": True})
    _check(trace, reference, "2 processes (spawn)")


@pytest.mark.parametrize("params, where", [({"processes": 2}, "raw-limit process"),
                                           ({"threads": 1}, "raw-limit thread")])
def test_a_failing_worker_stops_the_run_with_its_traceback(
        spec: WorkSpec, monkeypatch: pytest.MonkeyPatch, params: dict, where: str) -> None:
    def broken(self: Work, seq: int, p: object) -> None:
        raise ValueError(f"sample {seq} cannot be decoded")

    monkeypatch.setattr(Work, "process", broken)  # the forked workers inherit it
    before = _leftovers()
    with pytest.raises(RuntimeError, match=where) as err:
        e2e.RUNNERS["limit"](spec, params)
    assert "cannot be decoded" in str(err.value)
    assert _leftovers() == before


def test_the_grid_tries_processes_spawned_processes_and_threads() -> None:
    for quick in (True, False):
        limits = [c["params"] for c in e2e_configurations(quick, 2, spdl=False, energon=False)
                  if c["family"] == "limit"]
        assert limits == [{"processes": 2}, {"processes": 2, "start_method": "spawn"},
                          {"threads": 2}]


# --- the report: a loader above the limit ---------------------------------------------

def _runs(rate: float, cpu: float, n: int = 3, stage: float | None = None) -> list[dict]:
    return [{"disturbed": False, **{k: 1.0 for k in METRICS}, "samples_per_s": rate,
             "cpu_s_per_sample": cpu, "stage_samples_per_s": stage}] * n


def _cfg(name: str, family: str, runs: list[dict]) -> dict:
    return {"name": name, "family": family, "scaling": None, "mode": "e2e", "runs": runs}


def _report(zephon_rate: float, zephon_cpu: float) -> dict:
    configs = [_cfg("zephon default", "zephon", _runs(zephon_rate, zephon_cpu, stage=101.0)),
               _cfg("grain", "grain", _runs(90.0, 0.020)),
               _cfg("raw limit 2 processes", "limit", _runs(97.0, 0.0188)),
               _cfg("raw limit 2 threads", "limit", _runs(80.0, 0.0190))]
    return {"mode": "full", "date": "2026-12-07T00:00:00+00:00", "reps": 3,
            "machine": {"cpu_model": "cpu", "nproc": 2, "pillow_backend": "pillow-simd"},
            "settings": {"samples": 320, "images": 320, "seq_len": 2048, "batch_rows": 8,
                         "max_pixels": 401408, "draft": False, "normalize": "device"},
            "scaling": {}, "configs": [], "e2e_configs": configs,
            "workloads": {"fullsize": {"busy_neighbour": False, "e2e_configs": configs,
                                       "settings": {"samples": 320, "seq_len": 2048,
                                                    "batch_rows": 8}}}}


def test_a_loader_above_the_limit_is_flagged_in_the_json_tables_and_warnings() -> None:
    rep = summarize(_report(145.0, 0.0123))
    e = rep["workloads"]["fullsize"]["e2e"]
    assert e["best"]["limit"] == "raw limit 2 processes"
    assert e["above_limit"] == rep["e2e"]["above_limit"] == ["zephon default"]
    by_name = {c["name"]: c for c in rep["e2e_configs"]}
    assert by_name["zephon default"]["above_limit"] is True
    assert by_name["zephon default"]["vs_limit"] == pytest.approx(145.0 / 97.0)
    assert not by_name["grain"]["above_limit"] and not by_name["raw limit 2 threads"]["above_limit"]
    (warning,) = [w for w in rep["warnings"] if "raw limit" in w]
    assert warning.startswith("workload fullsize: the raw limit (raw limit 2 processes, 97.0")
    assert "zephon default 145.0 samples/s (1.49x; worker stage 101.0, CPU 12.3 ms" in warning
    assert "burst" in warning  # less CPU per sample than the limit: counted, not made, there
    md = report.markdown(rep)
    assert "| zephon-vl | **zephon default** | 145.0 | 1.49 **ABOVE** |" in md
    assert "| Grain | **grain** | 90.0 | 0.93 |" in md
    assert "**1.49** (limit passed: see the warning)" in md
    assert "| 1.49 (limit passed) |" in md  # the workloads' table
    assert f"- warning: {warning}" in md


def test_above_the_limit_with_as_much_cpu_names_the_limit_not_a_burst() -> None:
    rep = summarize(_report(100.0, 0.0190))
    (warning,) = [w for w in rep["warnings"] if "raw limit" in w]
    assert "burst" not in warning and "missed one" in warning


def test_below_the_limit_nothing_is_flagged(tmp_path: Path) -> None:
    rep = summarize(_report(95.0, 0.0190))
    assert rep["e2e"]["above_limit"] == []
    assert not any(c["above_limit"] for c in rep["e2e_configs"])
    assert not [w for w in rep["warnings"] if "raw limit" in w]
    md = report.markdown(rep)
    assert "ABOVE" not in md and "limit passed" not in md
    assert "| zephon-vl | **zephon default** | 95.0 | 0.98 |" in md
