"""The text workload of the benchmark (issue 39): its data, its raw limit at a tiny size,
and the whole run with the original Zephon (heavy: builds the peer's environment)."""

from __future__ import annotations

import argparse
import json

import pytest

pytest.importorskip("psutil")

from zephon_bench import text_bench
from zephon_bench.measure import Series
from zephon_bench.text_data import build_text_data

from zephon_core import load_tokenizer, qwen_tokenizer_dir


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return build_text_data(80, root=tmp_path_factory.mktemp("text-data"))


def spec(data, scenario: str, rows: int) -> text_bench.TextSpec:
    return text_bench.TextSpec({k: [str(p) for p in v] for k, v in data.shards.items()},
                               text_bench.SCENARIOS[scenario], str(qwen_tokenizer_dir()), rows)


@pytest.mark.slow
def test_the_data_is_deterministic_and_no_document_needs_more_than_a_row(data, tmp_path):
    again = build_text_data(80, root=tmp_path)
    for name, paths in data.shards.items():
        assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again.shards[name]]
    tok = load_tokenizer(qwen_tokenizer_dir())
    for name, paths in data.shards.items():
        docs = [json.loads(line)["text"] for p in paths for line in p.open()]
        assert len(docs) == 80 and len(set(docs)) == 80
        lengths = [len(ids) for ids in tok(docs, add_special_tokens=False)["input_ids"]]
        assert max(lengths) < text_bench.SEQ_LEN and min(lengths) > 20, name


def test_the_mixture_takes_the_datasets_in_the_proportion_of_the_weights(data) -> None:
    lines = text_bench.mixed_lines(spec(data, "text-mix", 10), 1000)
    assert sum(1 for d, _ in lines if d == 0) == 700
    assert text_bench.mixed_lines(spec(data, "text-mix", 10), 1000) == lines
    assert {d for d, _ in text_bench.mixed_lines(spec(data, "text", 10), 50)} == {0}


def test_the_raw_limit_packs_full_rows(data) -> None:
    result = text_bench.run_limit(spec(data, "text-mix", 32), {"processes": 1})
    events = result["events"]
    assert result["processes"] == 1
    assert sum(e[1] for e in events) >= 32
    assert all(e[1] == text_bench.BATCH_ROWS for e in events)
    # best fit into 4 open rows of 2048 tokens: rows are nearly full
    assert all(text_bench.BATCH_ROWS * 1800 < e[2] <= text_bench.BATCH_ROWS * 2048
               for e in events)
    assert events == sorted(events) and all(e[0] >= result["t_start"] for e in events)


def test_rates_and_cpu_are_taken_over_the_steady_window() -> None:
    events = [[10.0 + i, 16, 32000] for i in range(11)]  # a batch a second from t=10
    series = Series(t=[0.0, 100.0], tree_cpu=[0.0, 200.0], tree_pss=[1.0, 2**21],
                    root_cpu=[0.0, 50.0])
    m = text_bench.metrics({"t_start": 8.0, "events": events}, series)
    assert m["rows_per_s"] == pytest.approx(16) and m["tokens_per_s"] == pytest.approx(32000)
    assert m["cores_used"] == pytest.approx(2.0)
    assert m["cpu_s_per_1000_rows"] == pytest.approx(1000 * 2 / 16)
    assert m["cpu_us_per_token"] == pytest.approx(1e6 * 2 / 32000)
    assert m["main_cpu_s_per_1000_rows"] == pytest.approx(1000 * 0.5 / 16)
    assert m["ttfb_s"] == pytest.approx(2.0) and m["rows"] == 176


def test_text_workloads_are_named_on_their_own() -> None:
    assert text_bench.text_workloads("text,text-mix") == ["text", "text-mix"]
    assert text_bench.text_workloads("photos,video") == []
    with pytest.raises(SystemExit, match="command of their own"):
        text_bench.text_workloads("text,photos")


@pytest.mark.heavy
def test_the_whole_text_benchmark_with_the_original_zephon(tmp_path, monkeypatch) -> None:
    """Builds the peer's virtual environment once (needs PyPI), then every loader on both
    scenarios at a small size, into a relative output folder as the command's default
    (the peer's driver runs in another folder: it once got the relative path and failed)."""
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(workload="text,text-mix", quick=True, reps=1, samples=400,
                              rows=48, only=None, out="bench-out", json=None, timeout=600,
                              no_peer=False, peer_python=None)
    assert text_bench.run(args) == 0
    report = json.loads((tmp_path / "bench-out" / "text-bench.json").read_text())
    for scenario in ("text", "text-mix"):
        medians = report["scenarios"][scenario]["medians"]
        assert {"zephon-vl default", "raw limit"} < set(medians)
        assert any(k.startswith("zephon 0.2.0") for k in medians)
        assert all(m["runs"] == 1 and m["tokens_per_s"] > 0 for m in medians.values())
