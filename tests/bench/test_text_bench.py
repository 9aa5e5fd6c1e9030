"""The text workload of the benchmark (issue 39): its data, its raw limit at a tiny size,
and the whole run with the original Zephon (heavy: builds the peer's environment)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import threading
import zlib

import numpy as np
import pytest

pytest.importorskip("psutil")

from zephon_bench import text_bench
from zephon_bench.measure import Series
from zephon_bench.text_data import build_text_data

from zephon_core import Tokenize, load_tokenizer, qwen_tokenizer_dir


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
    assert result["workers"] == 1 and result["arrangement"] == "1 processes (fork)"
    assert sum(e[1] for e in events) >= 32
    assert all(e[1] == text_bench.BATCH_ROWS for e in events)
    # best fit into 4 open rows of 2048 tokens: rows are nearly full
    assert all(text_bench.BATCH_ROWS * 1800 < e[2] <= text_bench.BATCH_ROWS * 2048
               for e in events)
    assert events == sorted(events) and all(e[0] >= result["t_start"] for e in events)


@pytest.fixture(scope="module")
def every_document(data) -> tuple[list[int], int]:
    """Each prose document's tokens (the tokenizer's, EOS appended) as the sorted
    checksums `document_checksums` gives, and their number of tokens."""
    tok = load_tokenizer(qwen_tokenizer_dir())
    texts = [json.loads(line)["text"] for p in data.shards["prose"] for line in p.open()]
    ids = [t + [tok.eos_token_id] for t in tok(texts, add_special_tokens=False)["input_ids"]]
    return sorted(zlib.crc32(np.asarray(t, dtype=np.int64).tobytes()) for t in ids), \
        sum(map(len, ids))


@pytest.fixture(scope="module")
def loader_documents(data) -> set[int]:
    """The documents zephon's Loader delivered in its first 32 rows, as checksums."""
    result = text_bench.run_zephon(spec(data, "text", 32),
                                   {"execution": {"runner": "inline"}, "check": True})
    return set(result["documents"])


def _check_arrangement(data, params: dict, arrangement: str, every: tuple[list[int], int],
                       loader: set[int]) -> None:
    """Fewer documents than the rows need: every worker runs out and flushes its rows, so
    each document is delivered once, with the tokens the loader gives it."""
    result = text_bench.run_limit(spec(data, "text", 10**6),
                                  {**params, "documents": 80, "check": True})
    checksums, tokens = every
    assert result["arrangement"] == arrangement
    assert result["documents"] == checksums
    assert sum(e[2] for e in result["events"]) == tokens
    assert sum(e[1] for e in result["events"]) == result["rows_made"]
    assert loader <= set(checksums) and len(loader) > 10


@pytest.mark.parametrize("params, arrangement", [({"processes": 2}, "2 processes (fork)"),
                                                 ({"threads": 2}, "2 threads")])
def test_each_limit_arrangement_delivers_the_loaders_tokens(
        data, every_document, loader_documents, params: dict, arrangement: str) -> None:
    _check_arrangement(data, params, arrangement, every_document, loader_documents)


@pytest.mark.slow
def test_spawned_limit_processes_deliver_the_loaders_tokens(
        data, every_document, loader_documents) -> None:
    _check_arrangement(data, {"processes": 2, "start_method": "spawn"},
                       "2 processes (spawn)", every_document, loader_documents)


@pytest.mark.parametrize("params", [{"processes": 2}, {"threads": 2}])
def test_the_limit_workers_stop_together_and_are_timed_while_all_run(data, params) -> None:
    """A shared quota: the workers stop once the rows are made (none goes on with a share
    of its own); the events end at the first worker's last batch."""
    result = text_bench.run_limit(spec(data, "text-mix", 40), params)
    rows = sum(e[1] for e in result["events"])
    assert 40 <= result["rows_made"] < 40 + 2 * text_bench.BATCH_ROWS
    assert 0 < rows <= result["rows_made"]


@pytest.mark.parametrize("params, where", [({"processes": 2}, "raw-limit process 1"),
                                           ({"threads": 2}, "raw-limit thread 1")])
def test_a_failing_limit_worker_stops_the_run_with_its_traceback(
        data, monkeypatch: pytest.MonkeyPatch, params: dict, where: str) -> None:
    real = Tokenize.process_many

    def broken(self, elements):
        if threading.current_thread().name.endswith("-1") or \
                multiprocessing.current_process().name.endswith("-1"):
            raise ValueError("document cannot be tokenized")
        return real(self, elements)

    monkeypatch.setattr(Tokenize, "process_many", broken)  # the forked workers inherit it
    with pytest.raises(RuntimeError, match=where) as err:
        text_bench.run_limit(spec(data, "text", 10**6), {**params, "documents": 80})
    assert "document cannot be tokenized" in str(err.value)
    assert "Traceback" in str(err.value)


@pytest.mark.parametrize("code", [3, 0])
def test_a_limit_process_that_dies_without_a_word_stops_the_run(data, monkeypatch,
                                                                code: int) -> None:
    monkeypatch.setattr(Tokenize, "process_many", lambda self, elements: os._exit(code))
    with pytest.raises(RuntimeError, match=f"died without a word: text-limit-0 exit {code}"):
        text_bench.run_limit(spec(data, "text", 10**6), {"processes": 2, "documents": 80})


def test_the_limit_is_the_best_of_its_arrangements() -> None:
    names = [c["name"] for c in text_bench.configurations(True, 2, {"limit"}, None)]
    assert names == ["raw limit 2 processes", "raw limit 2 spawned processes",
                     "raw limit 2 threads"]
    med = {"zephon-vl default": {"tokens_per_s": 750.0},
           "zephon-vl threads": {"tokens_per_s": 500.0},
           "raw limit 2 processes": {"tokens_per_s": 800.0},
           "raw limit 2 spawned processes": {"tokens_per_s": 700.0},
           "raw limit 2 threads": {"tokens_per_s": None},
           "zephon 0.2.0 threads x2": {"tokens_per_s": 400.0}}
    r = text_bench.ratios({"medians": med})
    assert r["limit_best"] == "raw limit 2 processes"
    assert r["default_to_limit"] == pytest.approx(750 / 800)
    assert r["peer_best"] == "zephon 0.2.0 threads x2"
    assert "above_limit" not in r  # 750 passes one arrangement (700), not the limit
    med["zephon-vl default"]["tokens_per_s"] = 820.0
    assert text_bench.ratios({"medians": med})["above_limit"] == ["zephon-vl default"]


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
        assert "zephon-vl default" in medians
        assert {"processes", "spawned processes", "threads"} == \
            {k.split(" ", 3)[3] for k in medians if k.startswith("raw limit ")}
        assert report["scenarios"][scenario]["ratios"]["limit_best"].startswith("raw limit")
        assert any(k.startswith("zephon 0.2.0") for k in medians)
        assert all(m["runs"] == 1 and m["tokens_per_s"] > 0 for m in medians.values())
