"""Smoke test of the benchmark harness's plumbing (not a timed test: no figure is checked).

Every loader family runs on a tiny data set (zephon inline, Grain and torch
without worker processes or with one, SPDL with one process, Megatron-Energon
with two workers when it is installed, the raw limit in forked processes), at
the worker stage and as delivered (collated) batches, and all must deliver the
same samples, tokens, checksum and, for batches, the same patch rows bit for
bit; the metrics, the markdown tables, the charts
and the `bench` command's arguments are exercised on synthetic numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("grain")
pytest.importorskip("psutil")

from zephon_bench import e2e, loaders, measure, report
from zephon_bench.vlm_bench import (
    METRICS,
    check_tallies,
    configurations,
    e2e_configurations,
    have_energon,
    have_spdl,
    summarize,
)
from zephon_bench.workload import Work, WorkSpec

from tests.helpers.bench import tiny_spec


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> WorkSpec:
    return tiny_spec(tmp_path_factory.mktemp("bench-data"))


def test_every_loader_delivers_the_same_samples_and_tokens(spec: WorkSpec) -> None:
    traces = {
        "zephon": loaders.run_zephon(spec, {"execution": {"runner": "inline"}}),
        "grain": loaders.run_grain(spec, {"workers": 0, "threads": 1}),
        "torch": loaders.run_torch(spec, {"workers": 0, "batch_size": 4}),
        "limit": loaders.run_limit(spec, {"processes": 1}),
    }
    n = len(Work.build(spec).pointers)
    tallies = {k: t.tally for k, t in traces.items()}
    ref = tallies["limit"]
    assert ref.samples + ref.dropped == n == 15 and ref.tokens > 0 and ref.images >= 14
    for name, t in tallies.items():
        assert (t.samples, t.tokens, t.images, t.dropped, t.checksum) == \
            (ref.samples, ref.tokens, ref.images, ref.dropped, ref.checksum), name
    for name, tr in traces.items():
        assert sum(p[1] for p in tr.produced) == n, name  # every sample produced once
        assert tr.t_end is not None and tr.t_end >= tr.t_start, name
        json.dumps(tr.report())
    assert traces["zephon"].extra["plan"] == ["read+decode+tokenize:inlinex1"]


def test_every_loader_delivers_the_same_collated_batches(spec: WorkSpec) -> None:
    """Delivered batches: the same samples, tokens, images, patch rows and pixel values
    (an exact sum) for every loader, however each packs; the same samples as the worker
    stage."""
    runs = {
        "zephon": ({"execution": {"runner": "inline"}}),
        "grain": ({"workers": 1, "threads": 1}),
        "torch": ({"workers": 2}),
        "limit": ({"processes": 2}),
    }
    if have_spdl():
        runs["spdl"] = {"workers": 1}
    if have_energon():  # a packing buffer of 4: several buffers per worker, each flushed
        runs["energon"] = {"workers": 2, "packing_buffer": 4}
    traces = {k: e2e.RUNNERS[k](spec, {**v, "pixels": True}) for k, v in runs.items()}
    ref = traces["limit"].tally
    worker = loaders.run_limit(spec, {"processes": 1}).tally
    assert (ref.samples, ref.tokens, ref.dropped, ref.checksum) == \
        (worker.samples, worker.tokens, worker.dropped, worker.checksum)
    assert ref.patches > 0 and ref.pixel_sum > 0 and ref.images == worker.images
    for name, tr in traces.items():
        t = tr.tally
        assert (t.samples, t.tokens, t.images, t.dropped, t.checksum, t.patches, t.pixel_sum) \
            == (ref.samples, ref.tokens, ref.images, ref.dropped, ref.checksum, ref.patches,
                ref.pixel_sum), name
        assert sum(e[1] for e in tr.events) == ref.samples, name
        assert tr.t_first is not None and tr.t_end >= tr.t_first, name
        json.dumps(tr.report())
    # the harness's check names a run that differs
    runs_out = {f"e2e: {k}": [{"rep": 0, "tally": tr.tally.report()}]
                for k, tr in traces.items()}
    assert check_tallies(runs_out) == []
    runs_out["e2e: grain"][0]["tally"] = {**runs_out["e2e: grain"][0]["tally"], "pixel_sum": 1}
    assert len(bad := check_tallies(runs_out)) == 1 and bad[0].startswith("e2e: grain rep 0")


def test_energon_packs_on_a_copy_and_counts_what_the_packer_refuses(
        spec: WorkSpec, tmp_path: Path) -> None:
    """`energon prepare` runs on a copy (the shards' own folder stays as it was); with rows
    too short for some documents, Energon's packing hooks deliver the same samples and
    record the same drops as the raw limit."""
    pytest.importorskip("megatron.energon", reason="megatron-energon is not installed "
                        "(pip install megatron-energon==7.4.1, or the `bench` extra)")
    from zephon_bench.energon_e2e import prepare

    src = Path(spec.shards[0]).parent
    before = sorted(p.name for p in src.iterdir())
    short = dataclasses.replace(spec, seq_len=300)
    data = prepare(short, tmp_path / "energon")
    assert sorted(p.name for p in src.iterdir()) == before
    assert (data / ".nv-meta" / "dataset.yaml").read_text().count("CrudeWebdataset") == 1
    got = e2e.RUNNERS["energon"](short, {"workers": 1, "packing_buffer": 5, "data": str(data),
                                         "pixels": True}).tally
    ref = e2e.RUNNERS["limit"](short, {"processes": 1, "pixels": True}).tally
    assert ref.dropped > 0 and ref.samples + ref.dropped == 15
    assert dataclasses.replace(got, rows=0) == dataclasses.replace(ref, rows=0)


def test_metrics_on_a_synthetic_run() -> None:
    produced = [[10.0 + i, 10, 1000, 12] for i in range(11)]  # 10 samples/s from t=10 to 20
    result = {"t_start": 8.0, "t_first": 11.5, "t_end": 21.0, "produced": produced,
              "events": [[11.5, 40, 4000, 48], [20.5, 70, 7000, 62]],
              "tally": {"samples": 110}, "extra": {}}
    s = measure.Series()
    for t in (7.0, 15.0, 25.0):  # 2 cores busy for the tree, 0.5 more for the machine
        s.t.append(t)
        s.tree_cpu.append(2 * t)
        s.root_cpu.append(0.1 * t)
        s.tree_rss.append(1e9)
        s.tree_pss.append(6e8 if t == 15.0 else 5e8)
        s.shm.append(2e8)
        s.machine_busy.append(2.5 * t)
        s.self_cpu.append(0.0)
    m = measure.metrics(result, s)
    assert m["samples_per_s"] == pytest.approx(10.0)
    assert m["tokens_per_s"] == pytest.approx(1000.0)
    assert m["ttfb_s"] == pytest.approx(3.5)
    assert m["cpu_s_per_sample"] == pytest.approx(0.2)
    assert m["cores_used"] == pytest.approx(2.0)
    assert m["outside_load"] == pytest.approx(0.5 / measure.NCPU)
    assert m["peak_mem_mb"] == pytest.approx(6e8 / 2**20)
    assert set(METRICS) <= set(m)


def test_best_is_a_median_of_repeated_runs() -> None:
    """One lucky single run never outranks the re-measured configuration's median."""
    def runs(*rates: float) -> list[dict]:
        return [{"disturbed": False, **{k: 1.0 for k in METRICS}, "samples_per_s": r}
                for r in rates]

    rep = {"settings": {}, "configs": [
        {"name": "zephon default", "family": "zephon", "scaling": 2, "runs": runs(300, 310, 290)},
        {"name": "zephon lucky", "family": "zephon", "scaling": None, "runs": runs(400)},
        {"name": "grain a", "family": "grain", "scaling": 2, "runs": runs(200, 210, 190)},
        {"name": "raw", "family": "limit", "scaling": 2, "runs": runs(350, 360, 340)},
    ]}
    out = summarize(rep)
    assert out["best"]["zephon"] == "zephon default"
    assert out["ratio_vs_limit"] == pytest.approx(300 / 350)
    assert out["ratio_vs_grain"] == pytest.approx(300 / 200)


def test_e2e_ratios_against_targets(tmp_path: Path) -> None:
    """zephon's default against each loader's best delivered rate, and its worker stage."""
    def runs(rate: float, pss: float = 1000.0, n: int = 3) -> list[dict]:
        return [{"disturbed": False, **{k: 1.0 for k in METRICS}, "samples_per_s": rate,
                 "peak_mem_mb": pss}] * n

    def cfg(name: str, family: str, rs: list[dict], mode: str = "e2e") -> dict:
        return {"name": name, "family": family, "scaling": None, "mode": mode, "runs": rs}

    rep = {"settings": {}, "scaling": {}, "configs": [
        cfg("zephon default", "zephon", runs(400), "worker")], "e2e_configs": [
        cfg("zephon default", "zephon", runs(380, 900)),
        cfg("zephon lucky", "zephon", runs(500, n=1)),
        cfg("grain a", "grain", runs(250, 1200)), cfg("grain b", "grain", runs(300, 1000)),
        cfg("torch", "torch", runs(200)), cfg("spdl", "spdl", runs(190)),
        cfg("energon", "energon", runs(95)),
        cfg("raw", "limit", runs(400, 500))]}
    out = summarize(rep)["e2e"]
    assert out["best"] == {"zephon": "zephon default", "grain": "grain b", "torch": "torch",
                           "spdl": "spdl", "energon": "energon", "limit": "raw"}
    assert out["ratio_vs_grain"] == pytest.approx(380 / 300)
    assert out["ratio_vs_limit"] == pytest.approx(380 / 400)
    assert out["ratio_vs_torch"] == pytest.approx(380 / 200)
    assert out["ratio_vs_spdl"] == pytest.approx(380 / 190)
    assert out["ratio_vs_energon"] == pytest.approx(380 / 95)
    assert out["peak_pss_vs_grain"] == pytest.approx(900 / 1000)
    assert rep["e2e_over_worker_stage"] == out["e2e_over_worker_stage"] == pytest.approx(0.95)
    rep.update(mode="quick", date="2025-01-01T00:00:00+00:00", reps=3, machine={
        "cpu_model": "cpu", "nproc": 2, "pillow_backend": "pillow-simd"})
    rep["settings"] = {"samples": 10, "images": 12, "seq_len": 2048, "batch_rows": 16,
                       "max_pixels": 401408, "draft": False, "normalize": "device"}
    md = report.markdown(rep)
    assert "Delivered training batches" in md and "| SPDL | **spdl** |" in md
    assert "| Megatron-Energon | **energon** |" in md and "`ratio_vs_energon`" in md
    assert "`ratio_vs_grain` (/ Grain best) | **1.27** | >= 1.25" in md
    report.e2e_chart(rep, tmp_path / "e.png")
    assert (tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG"


def test_grid_report_and_command(tmp_path: Path) -> None:
    cfgs = configurations(quick=True, ncpu=2, scaling=True)
    fams = {c["family"] for c in cfgs}
    assert fams == {"zephon", "grain", "torch", "limit"}
    assert {c["family"] for c in e2e_configurations(False, 2, spdl=True, energon=True)} == \
        {"zephon", "grain", "torch", "spdl", "energon", "limit"}
    assert {c["family"] for c in e2e_configurations(True, 2, spdl=False, energon=False)} == \
        {"zephon", "grain", "torch", "limit"}
    assert {c["mode"] for c in e2e_configurations(True, 2, spdl=False)} == {"e2e"}
    assert sorted(c["scaling"] for c in cfgs if c["family"] == "limit") == [1, 2, 4]
    med = {k: 1.0 for k in METRICS}
    rep = {
        "mode": "quick", "date": "2025-01-01T00:00:00+00:00", "reps": 1,
        "machine": {"cpu_model": "cpu", "nproc": 2, "pillow_backend": "pillow-simd"},
        "settings": {"samples": 10, "images": 12, "seq_len": 2048, "batch_rows": 16,
                     "max_pixels": 401408, "draft": False},
        "configs": [{**c, "median": {**med, "samples_per_s": 10.0 + i}, "runs_ok": 1,
                     "runs_disturbed": 0} for i, c in enumerate(cfgs)],
        "best": {"zephon": cfgs[0]["name"]}, "ratio_vs_grain": 1.1, "ratio_vs_limit": 0.9,
        "scaling": {"processes": [1, 2, 4], "samples_per_s": {"limit": [1.0, 2.0, None]}},
        "breakdown": {"samples": 3, "total_ms_per_sample": 9.0, "ms_per_sample": {"read": 1.0},
                      "share": {"read": 0.1}},
    }
    md = report.markdown(rep)
    assert "ratio_vs_grain = 1.10" in md and "| raw limit |" in md
    report.chart(rep, tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"

    import zephon_vl.cli.bench  # noqa: F401  (registers the command)
    from zephon_vl.cli.registry import COMMANDS

    help_text, configure, _ = COMMANDS["bench"]
    p = argparse.ArgumentParser()
    configure(p)
    args = p.parse_args(["--quick", "--json", str(tmp_path / "x.json"), "--samples", "50"])
    assert args.quick and args.samples == 50 and args.json.endswith("x.json")
