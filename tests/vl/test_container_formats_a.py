"""Formats ``arrow`` and ``lance`` (issue 37, item 1): containers written by their own
libraries read as the same samples as a LLaVA JSON with an image folder.

The LLaVA records of `write_llava` (single, shared and two-image records, text-only
ones, bad ones) are written four ways: with ``datasets`` as a ``save_to_disk`` folder
(images embedded as the ``Image`` struct, renamed columns, three files) and as
Hub-cache Arrow files (``load_dataset("json")`` with small record batches; a
``messages`` chat column naming images under ``image_folder``), and with ``pylance``
as Lance datasets of both tables. Each gives identical digests at D = 1, 2, 4 and
across a resume on another D, delivers every record once or drops it with the reason
the LLaVA JSON gives, and each sample has the tokens and pixels of the same LLaVA
record.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.formats import (
    digest_lines,
    digests_across_d_and_resume,
    recipe_toml,
    write_llava,
)
from tests.helpers.vl import run_epoch
from zephon_core import (
    CheckpointError,
    ConfigError,
    DatasetSpec,
    Execution,
    Loader,
    batch_digest,
    load_recipe,
    qwen_tokenizer_dir,
)
from zephon_core.data.formats import dataset_reader
from zephon_core.ops.pack import FILLER_ORIGIN
from zephon_vl.cli.main import main
from zephon_vl.media.image import ImageSettings
from zephon_vl.ops.multimodal import DecodeVision, TokenizeMultimodal
from zephon_vl.recipes import vlm_recipe

datasets = pytest.importorskip("datasets")
INLINE = Execution(runner="inline", prefetch_steps=0)
IMAGE = ImageSettings(max_pixels=50176)
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
NAMES = ["arrow-embedded", "arrow-chat", "lance-embedded", "lance-chat"]


def image_list(rec: dict) -> list[str]:
    raw = rec.get("image")
    return [] if raw is None else [raw] if isinstance(raw, str) else list(raw)


def embedded_table(records: list[dict], folder: Path):
    """The records with their images embedded (``datasets.Image``), under renamed columns
    ``uid``/``pictures``/``dialogue``; a record whose image is missing is left out (a
    ``save_to_disk`` would read the file to embed it)."""
    def image(path: str) -> dict:
        return {"bytes": (folder / path).read_bytes(), "path": path}

    records = [r for r in records if all((folder / p).is_file() for p in image_list(r))]

    features = datasets.Features({
        "uid": datasets.Value("string"),
        "pictures": datasets.Sequence(datasets.Image()),
        "dialogue": [{"from": datasets.Value("string"), "value": datasets.Value("string")}],
    })
    return datasets.Dataset.from_dict({
        "uid": [r["id"] for r in records],
        "pictures": [[image(p) for p in image_list(r)] for r in records],
        "dialogue": [r["conversations"] for r in records]}, features=features)


def chat_rows(records: list[dict]) -> list[dict]:
    """The records as a ``messages`` chat column (string contents with ``<image>``) and an
    ``images`` list of paths; media without a placeholder open the first user turn."""
    rows = []
    for r in records:
        images = image_list(r)
        placed = any("<image>" in t["value"] for t in r["conversations"])
        messages, first = [], True
        for t in r["conversations"]:
            value = t["value"]
            if images and not placed and first and t["from"] == "human":
                value, first = "<image>" * len(images) + value, False
            messages.append({"role": ROLES.get(t["from"], t["from"]), "content": value})
        rows.append({"id": r["id"], "images": images, "messages": messages})
    return rows


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    lance = pytest.importorskip("lance")
    root = tmp_path_factory.mktemp("containers")
    llava, folder, drops = write_llava(root / "llava")
    records = json.loads(llava.read_text())
    embedded = embedded_table(records, folder)
    embedded.save_to_disk(str(root / "saved"), num_shards=3)
    jsonl = root / "chat.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in chat_rows(records)))
    hub = datasets.load_dataset("json", data_files=str(jsonl), split="train",
                                cache_dir=str(root / "hub"), writer_batch_size=8)
    hub_files = sorted(c["filename"] for c in hub.cache_files)
    lance.write_dataset(embedded.data.table, str(root / "embedded.lance"), max_rows_per_file=16)
    lance.write_dataset(hub.data.table, str(root / "chat.lance"), max_rows_per_file=16)
    renamed = {"id": "uid", "images": "pictures", "conversations": "dialogue"}
    tables = {
        "arrow-embedded": {"format": "arrow", "files": [str(root / "saved")],
                           "fields": renamed},
        "arrow-chat": {"format": "arrow", "files": hub_files},
        "lance-embedded": {"format": "lance", "files": [str(root / "embedded.lance")],
                           "fields": renamed},
        "lance-chat": {"format": "lance", "files": [str(root / "chat.lance")]},
    }
    for name, table in tables.items():  # the chats name their images under the folder
        table["name"] = name.replace("-", "_")
        if name.endswith("-chat"):
            table["image_folder"] = str(folder)
    embedded_drops = {k: v for k, v in drops.items() if v != "missing_media"}
    return {"tables": tables, "records": records, "folder": folder,
            "drops": {n: drops if n.endswith("-chat") else embedded_drops for n in NAMES},
            "llava": {"name": "llava", "format": "llava", "files": [str(llava)],
                      "image_folder": str(folder)}, "root": root}


def spec_of(table: dict) -> DatasetSpec:
    options = {k: v for k, v in table.items() if k.endswith("_folder")}
    return DatasetSpec(table["files"], table["format"], table.get("fields", {}), options)


def test_containers_are_what_their_libraries_wrote(data) -> None:
    """The test data has the layouts the formats are for: several files and batches."""
    arrow = dataset_reader(spec_of(data["tables"]["arrow-embedded"]))
    assert arrow.num_shards == 3 and sum(map(arrow.shard_len, range(3))) == 43
    hub = dataset_reader(spec_of(data["tables"]["arrow-chat"]))
    assert len(hub.records.index[0].rows) > 4  # record batches of 8 rows
    lance = dataset_reader(spec_of(data["tables"]["lance-embedded"]))
    assert lance.num_shards == 3 and lance.shard_len(0) == 16


@pytest.mark.parametrize("name", NAMES)
def test_digests_agree_across_d_and_resume(name, data, capsys, tmp_path) -> None:
    toml = recipe_toml(tmp_path / f"{name}.toml", [data["tables"][name]])
    # D = 2 in worker processes (the readers travel pickled), for one of each format
    pool = ["--runner", "auto", "--default-workers", "2"] if name.endswith("-chat") else []
    first = digests_across_d_and_resume(capsys, toml, pool)
    assert all(r["rows"] == 8 for r in first)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dp", [1, 2])
def test_every_record_is_delivered_once_or_dropped_with_its_reason(name, dp, data) -> None:
    table = data["tables"][name]
    recipe = vlm_recipe({table["name"]: spec_of(table)}, qwen_tokenizer_dir(), seq_len=1024,
                        global_batch_size=4, num_lanes=4, image=IMAGE, pack={"max_images": 6},
                        shuffle_buffer=4, epochs=1)
    reader = recipe.datasets[0].reader
    delivered, drops = [], []
    for rank in range(dp):
        ep = run_epoch(Loader(recipe, rank, dp, INLINE))
        delivered += [(o.shard, o.index) for o in ep.origins() if o != FILLER_ORIGIN]
        drops += ep.drops()
    everything = [(s, i) for s in range(reader.num_shards) for i in range(reader.shard_len(s))]
    assert sorted(delivered + [(o.shard, o.index) for o, _ in drops]) == everything
    by_key = {reader.key(o.shard, o.index).split(":", 1)[1]: r for o, r in drops}
    assert by_key == data["drops"][name]


def by_id(reader) -> dict[str, tuple[int, int]]:
    return {reader.key(s, i).split(":", 1)[1]: (s, i)
            for s in range(reader.num_shards) for i in range(reader.shard_len(s))}


def assert_same(got, want, where: str) -> None:
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), where
        for g, w in zip(got, want, strict=True):
            assert_same(g, w, where)
    else:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=where)


@pytest.mark.parametrize("name", NAMES)
def test_samples_have_the_tokens_and_pixels_of_the_llava_record(name, data) -> None:
    llava = dataset_reader(spec_of(data["llava"]))
    ours = dataset_reader(spec_of(data["tables"][name]))
    decode = DecodeVision(IMAGE)
    tok = TokenizeMultimodal(qwen_tokenizer_dir(), IMAGE.merge_size, 1 << 16)
    tok.setup()
    theirs, mine = by_id(llava), by_id(ours)
    drops = data["drops"][name]
    assert sorted(mine) == sorted(k for k in theirs if k in drops or k not in data["drops"][
        "arrow-chat"])  # the embedded tables leave out the record whose image is missing
    checked = images = 0
    for key, (s, i) in sorted(theirs.items()):
        if key in data["drops"]["arrow-chat"]:
            continue
        want = decode.decode(llava.read(s, i))
        got = decode.decode(ours.read(*mine[key]))
        assert len(got["vision"]) == len(want["vision"]), f"{name} {key}"
        for x, y in zip(want["vision"], got["vision"], strict=True):
            np.testing.assert_array_equal(y.pixel_values, x.pixel_values)
            np.testing.assert_array_equal(y.grid_thw, x.grid_thw)
            images += 1
        want, got = tok.tokenize(want), tok.tokenize(got)
        assert sorted(got) == sorted(want) and {"tokens", "targets"} <= set(want)
        for field in want:
            assert_same(got[field], want[field], f"{name} {key} {field}")
        checked += 1
    assert checked == len(theirs) - len(data["drops"]["arrow-chat"]) and images >= 30


def resume_after(toml: Path, change) -> None:
    """Two steps, a checkpoint, `change()` the data, then a restore from it."""
    with Loader(load_recipe(str(toml)), 0, 1, INLINE) as loader:
        for _ in range(2):
            batch_digest(loader.recipe.collate(loader.next_rows()))
        state = loader.state_dict()
    change()
    with Loader(load_recipe(str(toml)), 0, 1, INLINE) as loader:
        loader.load_state_dict(state)


def test_a_rewritten_arrow_dataset_refuses_the_old_checkpoint(data, tmp_path) -> None:
    folder = tmp_path / "saved"
    records = data["records"]
    embedded_table(records, data["folder"]).save_to_disk(str(folder), num_shards=3)
    table = {**data["tables"]["arrow-embedded"], "files": [str(folder)]}
    toml = recipe_toml(tmp_path / "r.toml", [table])

    def rewrite() -> None:
        changed = [{**r, "conversations": [{**t, "value": t["value"] + "!"}
                                           for t in r["conversations"]]} for r in records]
        shutil.rmtree(folder)
        embedded_table(changed, data["folder"]).save_to_disk(str(folder), num_shards=3)

    with pytest.raises(CheckpointError, match="data-0000"):
        resume_after(toml, rewrite)


def test_a_new_lance_version_refuses_the_old_checkpoint(data, tmp_path) -> None:
    import lance

    path = tmp_path / "chat.lance"
    shutil.copytree(data["tables"]["lance-chat"]["files"][0], path)
    table = {**data["tables"]["lance-chat"], "files": [str(path)]}
    toml = recipe_toml(tmp_path / "r.toml", [table])
    first = lance.dataset(str(path))

    def rewrite() -> None:  # the same rows and fragments, one caption changed
        import pyarrow as pa

        rows = first.to_table().to_pylist()
        rows[5]["messages"][-1]["content"] += "!"
        lance.write_dataset(pa.Table.from_pylist(rows, first.schema), str(path),
                            mode="overwrite", max_rows_per_file=16)

    with pytest.raises(CheckpointError, match=r"\.(fragment|version) \(lance_chat"):
        resume_after(toml, rewrite)
    # the recipe can pin the version it was built with: the old checkpoint restores
    pinned = recipe_toml(tmp_path / "p.toml", [{**table, "version": first.version}])
    with Loader(load_recipe(str(pinned)), 0, 1, INLINE) as loader:
        assert loader.recipe.datasets[0].reader.records.versions == [first.version]


def test_arrow_through_s3_gives_the_local_digests(data, tmp_path, capsys) -> None:
    """A ``save_to_disk`` folder on S3 (moto on 127.0.0.1), named by its URL: its
    ``state.json`` lists the files, whose batches are found once and cached."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from zephon_vl.testing.storage_servers import s3_server

    table = data["tables"]["arrow-embedded"]
    local = recipe_toml(tmp_path / "local.toml", [table])
    args = ["--steps", "3", "--dp", "2"]
    want = [r["sha256"] for r in digest_lines(capsys, ["--recipe", str(local), *args])]
    folder = Path(table["files"][0])
    with s3_server() as server:
        server.upload("zephon-arrow", sorted(str(p) for p in folder.iterdir()))
        remote = recipe_toml(tmp_path / "remote.toml",
                             [{**table, "files": ["s3://zephon-arrow/data"]}],
                             index_cache=str(tmp_path / "cache"))
        got = [r["sha256"] for r in digest_lines(capsys, ["--recipe", str(remote), *args])]
        again = [r["sha256"] for r in digest_lines(capsys, ["--recipe", str(remote), *args,
                                                            "--save-at", "1",
                                                            "--resume-dp", "1"])]
    assert got == want and len(want) == 3
    assert again[-2:] == want[1:]
    assert len(list((tmp_path / "cache").glob("*.zbatches.json"))) == 3


def test_inspect_data_reports_the_containers(data, tmp_path, capsys) -> None:
    tables = [data["tables"][n] for n in NAMES]
    toml = recipe_toml(tmp_path / "all.toml", tables)
    report = tmp_path / "report.json"
    capsys.readouterr()
    assert main(["inspect-data", "--recipe", str(toml), "--samples", "12", "--json",
                 str(report)]) == 0
    found = json.loads(report.read_text())
    rows = found if isinstance(found, list) else found["datasets"]
    assert [(r["format"], r["shards"]) for r in rows] == [
        ("arrow", 3), ("arrow", 1), ("lance", 3), ("lance", 3)]
    assert all(r["kept"] > 0 and r["images"] for r in rows)


def test_folders_the_formats_cannot_read_are_refused(data, tmp_path) -> None:
    saved = tmp_path / "dict"
    datasets.DatasetDict({"train": embedded_table(data["records"][:4], data["folder"])}
                         ).save_to_disk(str(saved))
    with pytest.raises(ConfigError, match="DatasetDict.*train"):
        dataset_reader({"files": [str(saved)], "format": "arrow"})
    with pytest.raises(ConfigError, match="local Lance folders only"):
        dataset_reader({"files": ["s3://bucket/x.lance"], "format": "lance"})
    with pytest.raises(ConfigError, match="is a folder"):  # other formats still refuse
        dataset_reader({"files": [str(saved)], "format": "parquet"})
