"""Damaged record files (issue 34): a drop or a one-line error that names the place.

A JSON record nested thousands of levels deep once crashed the recipe build with
a `RecursionError` in the offset scan; a damaged ``.parquet`` (empty, not Parquet,
cut short, footer damaged) gave a pyarrow traceback naming no file; one corrupt
row group stopped the whole run with a `RuntimeError` even under
``on_error="drop"``. Now: the deep record is one ``bad_json`` drop named by its
file and position; a damaged file is refused at build naming it and what to do;
a corrupt row group's rows are ``corrupt_row_group`` drops naming the file and
the row group (the same at every D), or under ``"raise"`` the run stops naming
them and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.formats import damage_row_group, recipe_toml, write_cauldron, write_llava
from tests.helpers.vl import run_epoch
from zephon_core import BadSampleError, ConfigError, Execution, Loader, qwen_tokenizer_dir
from zephon_core.data.formats import DatasetSpec, dataset_reader
from zephon_core.ops.pack import FILLER_ORIGIN
from zephon_vl.cli.main import main
from zephon_vl.formats.records import json_offsets
from zephon_vl.recipes import vlm_recipe

INLINE = Execution(runner="inline", prefetch_steps=0)
DEEP = 5000  # far past the interpreter's recursion limit (1000)


def deep_value(depth: int) -> str:
    """A list `depth` levels deep whose innermost level holds brackets and quotes in strings,
    which a bracket counter must not count."""
    return "[" * depth + '"]]\\"[{", {"k": "}]"}' + "]" * depth


def recipe_of(spec: DatasetSpec, on_error: str = "drop"):
    return vlm_recipe({"d": spec}, qwen_tokenizer_dir(), seq_len=1024, global_batch_size=4,
                      num_lanes=4, image={"max_pixels": 50176}, pack={"max_images": 6},
                      shuffle_buffer=4, epochs=1, on_error=on_error)


def accounted(recipe, dp: int) -> tuple[list[int], dict[int, str]]:
    """Every record index delivered (sorted, once per delivery) and the drops by index,
    over all `dp` ranks run to the end of the data."""
    delivered, drops = [], {}
    for rank in range(dp):
        ep = run_epoch(Loader(recipe, rank, dp, INLINE))
        delivered += [o.index for o in ep.origins() if o != FILLER_ORIGIN]
        for o, reason in ep.drops():
            assert o.index not in drops, f"record {o.index} dropped twice"
            drops[o.index] = reason
    return sorted(set(delivered)), drops


# --- deep JSON --------------------------------------------------------------------------
def test_json_offsets_step_over_a_record_deeper_than_the_stack() -> None:
    records = ['{"a": 1}', '{"deep": ' + deep_value(100_000) + "}", '{"b": "é"}']
    data = ("[" + ",\n ".join(records) + "]").encode()
    offsets = json_offsets(data, "deep.json")
    assert [data[a:a + n].decode() for a, n in offsets.T] == records


@pytest.mark.parametrize("text", ["[" + "[" * DEEP + "]", "[" + "[" * DEEP + "}" * DEEP + "]",
                                  '[{"a": 1}, ' + "[" * DEEP + '"open'],
                         ids=["unclosed", "mismatched", "open-string"])
def test_a_deep_record_that_never_closes_is_refused_as_an_invalid_list(text) -> None:
    with pytest.raises(ConfigError, match=r"^bad\.json: not a valid JSON list"):
        json_offsets(text.encode(), "bad.json")


def write_deep_llava(root: Path, at: int) -> tuple[Path, Path, dict, int]:
    """`write_llava`'s list with a record nested `DEEP` levels inserted at position `at`."""
    path, images, drops = write_llava(root, 12)
    records = json.loads(path.read_text())
    texts = [json.dumps(r) for r in records]
    deep = ('{"id": "deep", "conversations": [{"from": "human", "value": "hi"}, '
            '{"from": "gpt", "value": "x", "extra": ' + deep_value(DEEP) + "}]}")
    texts.insert(at, deep)
    path.write_text("[\n" + ",\n".join(texts) + "\n]")
    return path, images, drops, len(texts)


@pytest.mark.parametrize("at", [5, 0])
def test_a_deeply_nested_llava_record_is_dropped_naming_its_place(tmp_path, at) -> None:
    """Anywhere in the file, first record included (the format check reads the first
    record that parses): one ``bad_json`` drop named ``file:position``; every other
    record delivered once or dropped for its own fault, the same at D = 1 and 2."""
    path, images, want, total = write_deep_llava(tmp_path, at)
    spec = DatasetSpec([str(path)], "llava", options={"image_folder": str(images)})
    recipe = recipe_of(spec)
    reader = recipe.datasets[0].reader
    with pytest.raises(BadSampleError) as info:
        reader.read(0, at)
    assert info.value.reason == "bad_json"
    assert "nested deeper than 100 levels" in info.value.detail
    assert reader.key(0, at) == f"llava.json:{at}"
    ids = {reader.records.read(0, i)["id"]: i for i in range(total) if i != at}
    expected = {ids[k]: reason for k, reason in want.items()} | {at: "bad_json"}
    for dp in (1, 2):
        delivered, drops = accounted(recipe, dp)
        assert drops == expected, f"D={dp}"
        assert delivered == sorted(set(range(total)) - set(expected)), f"D={dp}"


def test_inspect_data_and_the_ledger_name_a_deep_record(tmp_path, capsys) -> None:
    path, images, _, _ = write_deep_llava(tmp_path, 3)
    toml = recipe_toml(tmp_path / "r.toml", [{"name": "l", "format": "llava",
                                              "files": [str(path)],
                                              "image_folder": str(images)}], epochs=1,
                       global_batch_size=2, num_lanes=2, shuffle_buffer=0)
    assert main(["inspect-data", "--recipe", str(toml), "--samples", "20"]) == 0
    out = capsys.readouterr().out
    assert "dropped bad_json: 1, e.g. llava.json:3: JSON nested deeper than 100 levels" in out
    ledger = tmp_path / "ledger.jsonl"
    assert main(["digest", "--recipe", str(toml), "--runner", "inline", "--steps", "8",
                 "--ledger", str(ledger)]) == 0
    drops = [d for line in ledger.read_text().splitlines()[1:]
             for d in json.loads(line).get("drops", [])]
    assert {"key": "llava.json:3", "reason": "bad_json"}.items() <= \
        next(d for d in drops if d["index"] == 3).items()


# --- damaged Parquet files ---------------------------------------------------------------
@pytest.fixture(scope="module")
def cauldron(tmp_path_factory) -> tuple[Path, dict]:
    path, drops = write_cauldron(tmp_path_factory.mktemp("cauldron"), 40, 8)
    return path, drops


def damaged_copies(good: bytes) -> dict[str, tuple[bytes, str]]:
    """Damaged versions of a Parquet file's bytes, and what the refusal must say."""
    footer_len = int.from_bytes(good[-8:-4], "little")
    garbled = bytearray(good)
    mid = len(good) - 8 - footer_len // 2
    garbled[mid:mid + 24] = b"\xff" * 24
    return {
        "empty": (b"", "is empty (0 bytes)"),
        "not-parquet": (b"id,text\n1,a cat\n" * 20, "is not a Parquet file"),
        "truncated": (good[: len(good) // 2], "is not a Parquet file"),
        "footer-length": (good[:-8] + (10 ** 9).to_bytes(4, "little") + good[-4:],
                          "its footer is damaged"),
        "footer-bytes": (bytes(garbled), "its footer is damaged"),
    }


@pytest.mark.parametrize("case", ["empty", "not-parquet", "truncated", "footer-length",
                                  "footer-bytes"])
def test_a_damaged_parquet_file_is_refused_at_build_naming_it(tmp_path, cauldron, case,
                                                              capsys) -> None:
    good, _ = cauldron
    data, why = damaged_copies(good.read_bytes())[case]
    bad = tmp_path / f"{case}.parquet"
    bad.write_bytes(data)
    spec = DatasetSpec([str(good), str(bad)], "parquet")
    with pytest.raises(ConfigError) as info:
        dataset_reader(spec)
    message = str(info.value)
    assert message.startswith(f"{bad}: "), message
    assert why in message and "re-create" in message, message
    toml = recipe_toml(tmp_path / "r.toml", [{"name": "c", "format": "parquet",
                                              "files": [str(good), str(bad)]}])
    capsys.readouterr()
    assert main(["digest", "--recipe", str(toml), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{bad}: " in err and "Traceback" not in err, err


@pytest.mark.parametrize("how", ["header", "data"])
def test_a_corrupt_row_group_is_dropped_row_by_row_naming_it(tmp_path, cauldron, how) -> None:
    """Row group 2 (rows 16-23) does not decode: its eight rows are ``corrupt_row_group``
    drops whose detail names the file and the group; every other row is delivered once
    (row 9 is the data set's own ``bad_record``), the same at D = 1, 2 and 4."""
    good, want = cauldron
    path = tmp_path / "cauldron.parquet"
    path.write_bytes(good.read_bytes())
    damage_row_group(path, 2, how)
    spec = DatasetSpec([str(path)], "parquet")
    reader = dataset_reader(spec)
    for i in (16, 23):
        with pytest.raises(BadSampleError) as info:
            reader.read(0, i)
        assert info.value.reason == "corrupt_row_group"
        assert info.value.where == f"cauldron.parquet:{i}"
        assert "row group 2 (rows 16-23) of cauldron.parquet" in info.value.detail
        assert reader.key(0, i) == f"cauldron.parquet:{i}"
    assert reader.read(0, 15)["__key__"] == "15" and reader.read(0, 24)["__key__"] == "24"
    recipe = recipe_of(spec)
    expected = {int(k): r for k, r in want.items()} | {i: "corrupt_row_group"
                                                       for i in range(16, 24)}
    for dp in (1, 2, 4):
        delivered, drops = accounted(recipe, dp)
        assert drops == expected, f"D={dp}"
        assert delivered == sorted(set(range(40)) - set(expected)), f"D={dp}"


def test_a_corrupt_row_group_under_raise_stops_naming_file_group_and_fix(tmp_path,
                                                                         cauldron) -> None:
    good, _ = cauldron
    path = tmp_path / "cauldron.parquet"
    path.write_bytes(good.read_bytes())
    damage_row_group(path, 1, "header")
    recipe = recipe_of(DatasetSpec([str(path)], "parquet"), on_error="raise")
    with pytest.raises(BadSampleError) as info, Loader(recipe, 0, 1, INLINE) as loader:
        for _ in range(20):
            loader.next_rows()
    message = str(info.value)
    assert info.value.reason == "corrupt_row_group", message
    for part in ("cauldron.parquet", "row group 1 (rows 8-15)", "re-create",
                 "on_error='drop'"):
        assert part in message, message


def test_a_page_checksum_mismatch_is_a_corrupt_row_group(tmp_path, cauldron) -> None:
    """Damage inside image bytes decodes without complaint; a file written with page
    checksums (``write_page_checksum=True``) has it found: its row group is corrupt."""
    import pyarrow.parquet as pq

    good, _ = cauldron
    path = tmp_path / "checked.parquet"
    pq.write_table(pq.read_table(good), path, row_group_size=8, write_page_checksum=True)
    damage_row_group(path, 3, "data", column=0)
    reader = dataset_reader(DatasetSpec([str(path)], "parquet"))
    with pytest.raises(BadSampleError) as info:
        reader.read(0, 25)
    assert info.value.reason == "corrupt_row_group"
    assert "row group 3 (rows 24-31) of checked.parquet" in info.value.detail
    assert reader.read(0, 32)["__key__"] == "32"
