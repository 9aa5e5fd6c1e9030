"""Per-document token ids against the original Zephon (``zephon`` 0.2.0) on the same files.

Runs ``scripts/peer_zephon.py``, which builds the peer's own virtual environment once
under ``.cache/zephon-peer/`` (PyPI needed the first time; zephon 0.2.0 is never a
dependency), and checks every document of its JSONL and Parquet shards: equal ids
where both are configured alike, and exactly the differences docs/peer-zephon.md
names where they are not. Minutes on 2 cores, hence ``heavy``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_core import qwen_tokenizer_dir

# heavy: needs PyPI to build the peer's venv the first time (CI runs offline), then
# about 5 minutes on 2 cores for 297 documents x 2 formats x 4 peer configurations.
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[int, str]]:
    work = tmp_path_factory.mktemp("peer")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "peer_zephon.py"),
                           "--work", str(work), "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=1800)
    # Exit status 1 means "some document differs", which the tests below judge.
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    docs: dict[int, str] = {}
    for path in sorted((work / "data" / "jsonl").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            docs[record["id"]] = record["text"]
    return json.loads(proc.stdout.splitlines()[-1]), docs


def _differences(result: dict, variant: str, fmt: str) -> list[dict]:
    return [d for d in result["differences"] if d["variant"] == variant and d["format"] == fmt]


def test_the_documents_cover_what_the_comparison_is_for(run: tuple[dict, dict[int, str]]) -> None:
    result, docs = run
    assert result["peer_version"] == "0.2.0"
    assert len(docs) == result["documents"] >= 250
    assert "" in docs.values()
    assert max(len(t) for t in docs.values()) > 100_000
    assert any("<|im_end|>" in t for t in docs.values())
    assert any("\r\n" in t for t in docs.values())
    assert any("\u0301" in t for t in docs.values())  # a combining mark
    assert any("\U0001f600" in t for t in docs.values())  # an emoji


def test_zephon_vl_equals_transformers_on_every_document(
        run: tuple[dict, dict[int, str]]) -> None:
    assert run[0]["differ_from_transformers"] == []


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_configured_alike_every_document_is_equal(run: tuple[dict, dict[int, str]],
                                                  fmt: str) -> None:
    result, docs = run
    assert result["peer_split_special_tokens"] == {"split": True, "as_shipped": False}
    assert result["counts"][f"raw/{fmt}"] == {"documents": len(docs), "equal": len(docs),
                                              "delivered": len(docs)}
    assert _differences(result, "raw", fmt) == []


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_readme_decode_text_differs_exactly_on_carriage_returns(
        run: tuple[dict, dict[int, str]], fmt: str) -> None:
    result, docs = run
    diffs = _differences(result, "readme", fmt)
    assert {d["cause"] for d in diffs} == {"normalize_newlines"}
    assert {d["doc"] for d in diffs} == {i for i, t in docs.items() if "\r" in t}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_tokenizer_as_shipped_parses_control_tokens_in_text(
        run: tuple[dict, dict[int, str]], fmt: str) -> None:
    result, docs = run
    tokenizer = json.loads((qwen_tokenizer_dir() / "tokenizer.json").read_text())
    added = [t["content"] for t in tokenizer["added_tokens"]]
    diffs = _differences(result, "as_shipped", fmt)
    assert {d["cause"] for d in diffs} == {"control_tokens_parsed"}
    assert {d["doc"] for d in diffs} == {i for i, t in docs.items()
                                         if any(a in t for a in added)}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_one_pass_of_16_sample_chunks_leaves_the_partial_chunk_out(
        run: tuple[dict, dict[int, str]], fmt: str) -> None:
    result, docs = run
    counts = result["counts"][f"chunk16/{fmt}"]
    assert counts["delivered"] == counts["equal"] == len(docs) // 16 * 16
    diffs = _differences(result, "chunk16", fmt)
    assert {d["cause"] for d in diffs} == {"not_delivered"}
    assert len(diffs) == len(docs) % 16
