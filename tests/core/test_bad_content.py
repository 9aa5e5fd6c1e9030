"""Issue 10: a sample whose own content breaks an operator is a bad sample, found exactly.

Under ``drop`` it is recorded with its reason and location, and which samples
are dropped never depends on the grouping, runner or rank count; under
``raise`` the error names the culprit, not the first sample of its group.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers.core import (
    DataSpec,
    Spec,
    World,
    build_recipe,
    malformed_content,
    reference_digests,
)
from zephon_core import BadSampleError, Execution, JsonlReader, Loader
from zephon_core.common.jsontext import MAX_DEPTH, loads_sample

SPEC = Spec(datasets=(DataSpec((12, 7, 20), data_seed=1),), map_fn=malformed_content,
            on_error="drop", use_filter=False)


def _bad_ids() -> set[int]:
    return {d for d in range(30_000) if d % 9 in (4, 6)}


def test_content_errors_are_dropped_naming_each_culprit() -> None:
    with Loader(build_recipe(SPEC), 0, 1, Execution(runner="inline", group_size=8)) as loader:
        drops = []
        for _ in range(6):
            next(loader)
            drops += loader.last_meta.drops
    assert drops, "the data has malformed documents in the first steps"
    readers = build_recipe(SPEC).datasets[0].reader
    for origin, reason in drops:
        assert reason == "bad_content"
        assert readers.read(origin.shard, origin.index)["id"] in _bad_ids()


@pytest.mark.parametrize(("D", "execution"), [
    (1, Execution(runner="inline", group_size=1)),
    (2, Execution(runner="threads", default_workers=2, group_size=5)),
    (4, Execution(runner="processes", default_workers=2, group_size=3)),
])
def test_drops_do_not_depend_on_grouping_runner_or_ranks(D, execution) -> None:
    with World(SPEC, D, execution) as w:
        assert w.digests(5) == reference_digests(SPEC, 5)


def test_raise_names_the_culprit_not_the_group() -> None:
    spec = SPEC.but(on_error="raise")
    with pytest.raises(BadSampleError) as info:
        with Loader(build_recipe(spec), 0, 1, Execution(runner="inline", group_size=8)) as ld:
            for _ in range(6):
                next(ld)
    err = info.value
    assert err.reason == "bad_content"
    found = re.search(r"dataset (\d+) shard (\d+) index (\d+)", err.where)
    assert found, err.where
    _, shard, index = (int(x) for x in found.groups())
    culprit = build_recipe(spec).datasets[0].reader.read(shard, index)
    assert culprit["id"] in _bad_ids(), f"{err.where} names a good document {culprit}"
    assert "TypeError" in str(err) or "KeyError" in str(err), str(err)
    assert "tokens" in str(err) and "on_error='drop'" in str(err)


def test_deep_json_is_a_bad_sample_whatever_the_stack(tmp_path) -> None:
    path = tmp_path / "docs.jsonl"
    lines = [json.dumps({"text": "fine"}), "[" * 200_000 + "]" * 200_000,
             json.dumps({"text": "x", "deep": json.loads("[" * (MAX_DEPTH + 1) + "]" *
                                                         (MAX_DEPTH + 1))})]
    path.write_text("\n".join(lines) + "\n")
    reader = JsonlReader([path])
    assert reader.read(0, 0) == {"text": "fine"}
    for i in (1, 2):
        with pytest.raises(BadSampleError) as info:
            reader.read(0, i)
        assert info.value.reason == "corrupt_json" and "nested deeper" in str(info.value)
    with pytest.raises(BadSampleError, match="nested deeper"):
        loads_sample("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "here")


def _text_parquet(path, rows: int = 24, group: int = 8):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"document {i}: " + "words " * (5 + i % 7) for i in range(rows)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=group)
    return path


def _garble_group(path, g: int) -> None:
    """Overwrite the first page header of row group `g`'s column; the footer stays."""
    import pyarrow.parquet as pq

    chunk = pq.ParquetFile(path).metadata.row_group(g).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start:start + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))


def test_text_parquet_damage_is_refused_or_a_corrupt_row_group(tmp_path) -> None:
    """The ``text`` format's Parquet reader (issue 34): a file without a Parquet footer is
    refused at build naming it; a row group that does not decode is, row by row,
    ``corrupt_row_group`` (dropped under ``drop``; under ``raise`` the run stops naming
    file, row group and fix), where pyarrow's traceback named nothing."""
    from zephon_core import ConfigError, text_recipe

    good = _text_parquet(tmp_path / "good.parquet")
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[:100])
    with pytest.raises(ConfigError, match=r"cut\.parquet: is not a Parquet file .*re-create"):
        text_recipe([str(good), str(cut)], None, num_lanes=2, global_batch_size=2)
    damaged = _text_parquet(tmp_path / "damaged.parquet")
    _garble_group(damaged, 1)
    recipe = text_recipe([str(damaged)], None, seq_len=64, num_lanes=2, global_batch_size=2,
                         epochs=1, on_error="drop")
    dropped = []
    with Loader(recipe, 0, 1, Execution(runner="inline")) as loader:
        while loader.next_rows() is not None:
            dropped += loader.last_meta.drops
        dropped += loader.drain().drops
    assert sorted((o.index, why) for o, why in dropped) == \
        [(i, "corrupt_row_group") for i in range(8, 16)]
    raising = text_recipe([str(damaged)], None, seq_len=64, num_lanes=2, global_batch_size=2,
                          epochs=1)
    with pytest.raises(BadSampleError) as info, \
            Loader(raising, 0, 1, Execution(runner="inline")) as loader:
        while loader.next_rows() is not None:
            pass
    message = str(info.value)
    for part in ("corrupt_row_group", "damaged.parquet", "row group 1 (rows 8-15)",
                 "re-create", "on_error='drop'"):
        assert part in message, message
