"""Formats ``mds`` and ``litdata`` (issue 37): MDS folders and LitData chunks, as
``streaming.MDSWriter`` and ``litdata.optimize`` write them, read by zephon's own readers.

The datasets under tests/vl/fixtures/containers were written by the libraries
themselves (scripts/make_container_fixtures.py says how to regenerate them); each
record there is also a record of ``llava.json`` naming its image in ``images/``.
Each dataset gives the same digests at D = 1, 2, 4 and across a resume on another
D; every record is delivered once or dropped with the reason its LLaVA twin gets;
each sample's tokens and pixels are its LLaVA twin's; damaged shards are refused or
dropped naming the shard.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.formats import digests_across_d_and_resume, recipe_toml
from tests.helpers.vl import run_epoch
from zephon_core import BadSampleError, ConfigError, Execution, Loader, qwen_tokenizer_dir
from zephon_core.data.formats import DatasetSpec, dataset_reader
from zephon_core.ops.pack import FILLER_ORIGIN
from zephon_vl.cli.inspect_data import inspect_data
from zephon_vl.media.image import ImageSettings
from zephon_vl.ops.multimodal import DecodeVision, TokenizeMultimodal
from zephon_vl.recipes import vlm_recipe

FIXTURES = Path(__file__).parent / "fixtures" / "containers"
INLINE = Execution(runner="inline", prefetch_steps=0)
IMAGE = ImageSettings(max_pixels=50176)

#: each dataset: its format, renamed fields and options
CASES: dict[str, dict] = {
    "mds-jpeg": {"format": "mds"},
    "mds-png": {"format": "mds", "fields": {"id": "key", "image": "picture",
                                           "messages": "chat"}},
    "mds-pil": {"format": "mds"},
    "mds-bytes": {"format": "mds"},
    "mds-path": {"format": "mds", "image_folder": "images"},  # under the copy's root
    "litdata-jpeg": {"format": "litdata"},
    "litdata-chat": {"format": "litdata"},
}
#: a dataset with embedded images and one with a chat column, of each format
DIGEST_CASES = ["mds-jpeg", "mds-png", "litdata-jpeg", "litdata-chat"]


@pytest.fixture(scope="module", autouse=True)
def root(tmp_path_factory) -> Path:
    """A copy of the fixtures: reading writes offset and media caches beside the files."""
    global ROOT
    ROOT = tmp_path_factory.mktemp("containers") / "data"
    shutil.copytree(FIXTURES, ROOT)
    return ROOT


ROOT = FIXTURES


def table(name: str) -> dict:
    t = {"name": name.replace("-", "_"), "files": [str(ROOT / name)], **CASES[name]}
    if "image_folder" in t:
        t["image_folder"] = str(ROOT / t["image_folder"])
    return t


def spec_of(t: dict) -> DatasetSpec:
    options = {k: v for k, v in t.items() if k.endswith("_folder")}
    return DatasetSpec(t["files"], t["format"], t.get("fields", {}), options)


def llava_spec() -> DatasetSpec:
    return DatasetSpec([str(ROOT / "llava.json")], "llava", {},
                       {"image_folder": str(ROOT / "images")})


def record_id(reader, shard: int, index: int) -> str:
    return reader.key(shard, index).split(":", 1)[1]


def llava_twins() -> tuple[object, dict[str, int], dict[str, str]]:
    """The LLaVA reader, the index of each id, and the drop reason of each bad id."""
    reader = dataset_reader(llava_spec())
    index, drops = {}, {}
    for i in range(reader.shard_len(0)):
        rid = record_id(reader, 0, i)
        index[rid] = i
        try:
            reader.read(0, i)
        except BadSampleError as exc:
            drops[rid] = exc.reason
    return reader, index, drops


def test_fixtures_are_several_shards_written_by_the_libraries() -> None:
    for name in CASES:
        index = json.loads((FIXTURES / name / "index.json").read_text())
        shards = index["shards"] if name.startswith("mds") else index["chunks"]
        assert len(shards) >= 2, name
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert total < 200_000


@pytest.mark.parametrize("name", DIGEST_CASES)
def test_digests_agree_across_d_and_resume(name, capsys, tmp_path) -> None:
    toml = recipe_toml(tmp_path / f"{name}.toml", [table(name)], seq_len=256,
                       global_batch_size=4)
    pool = ["--runner", "auto", "--default-workers", "2"] if name == "litdata-chat" else []
    digests_across_d_and_resume(capsys, toml, pool)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dp", [1, 2])
def test_every_record_is_delivered_once_or_dropped_with_its_llava_reason(name, dp) -> None:
    t = table(name)
    recipe = vlm_recipe({t["name"]: spec_of(t)}, qwen_tokenizer_dir(), seq_len=1024,
                        global_batch_size=4, num_lanes=4, image=IMAGE, pack={"max_images": 6},
                        shuffle_buffer=4, epochs=1)
    reader = recipe.datasets[0].reader
    delivered, drops = [], []
    for rank in range(dp):
        ep = run_epoch(Loader(recipe, rank, dp, INLINE))
        delivered += [o for o in ep.origins() if o != FILLER_ORIGIN]
        drops += ep.drops()
    seen = sorted([(o.shard, o.index) for o in delivered] + [(o.shard, o.index) for o, _ in drops])
    assert seen == [(s, i) for s in range(reader.num_shards) for i in range(reader.shard_len(s))]
    _, _, llava_drops = llava_twins()
    ids = {record_id(reader, s, i) for s, i in seen}
    got = {record_id(reader, o.shard, o.index): reason for o, reason in drops}
    assert got == {k: v for k, v in llava_drops.items() if k in ids}
    assert got, "each dataset holds records its LLaVA twin drops"


@pytest.mark.parametrize("name", list(CASES))
def test_samples_have_the_tokens_and_pixels_of_their_llava_twin(name) -> None:
    reader = dataset_reader(spec_of(table(name)))
    twin, twin_index, llava_drops = llava_twins()
    decode = DecodeVision(IMAGE)
    tok = TokenizeMultimodal(qwen_tokenizer_dir(), IMAGE.merge_size, 1 << 16)
    tok.setup()
    checked = 0
    for s in range(reader.num_shards):
        for i in range(reader.shard_len(s)):
            rid = record_id(reader, s, i)
            if rid in llava_drops:
                continue
            ours = decode.decode(reader.read(s, i))
            theirs = decode.decode(twin.read(0, twin_index[rid]))
            a, b = tok.tokenize(ours), tok.tokenize(theirs)
            assert a["tokens"].tolist() == b["tokens"].tolist(), f"{name} {rid}"
            assert a["targets"].tolist() == b["targets"].tolist(), f"{name} {rid}"
            assert len(ours["vision"]) == len(theirs["vision"]) == 1
            for x, y in zip(ours["vision"], theirs["vision"], strict=True):
                np.testing.assert_array_equal(x.grid_thw, y.grid_thw)
                np.testing.assert_array_equal(np.asarray(x.pixel_values),
                                              np.asarray(y.pixel_values))
            checked += 1
    assert checked >= 4


def copy_case(name: str, tmp_path: Path) -> tuple[Path, list[Path]]:
    folder = tmp_path / name
    shutil.copytree(ROOT / name, folder)
    index = json.loads((folder / "index.json").read_text())
    entries = index["shards"] if name.startswith("mds") else index["chunks"]
    names = [e["raw_data"]["basename"] if "raw_data" in e else e["filename"] for e in entries]
    return folder, [folder / n for n in names]


@pytest.mark.parametrize("name", ["mds-jpeg", "litdata-jpeg"])
def test_a_truncated_shard_is_refused_naming_it(name, tmp_path) -> None:
    folder, shards = copy_case(name, tmp_path)
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) - 7])
    with pytest.raises(ConfigError, match=rf"{shards[1].name} has {len(data) - 7} bytes.*"
                                          "truncated"):
        dataset_reader(spec_of({**table(name), "files": [str(folder)]}))


@pytest.mark.parametrize("name", ["mds-jpeg", "litdata-jpeg"])
def test_bad_offsets_drop_their_samples_naming_the_shard(name, tmp_path) -> None:
    folder, shards = copy_case(name, tmp_path)
    data = bytearray(shards[1].read_bytes())
    n = int(np.frombuffer(bytes(data[:4]), "<u4")[0])
    data[8:12] = np.array([len(data) + 100], "<u4").tobytes()  # sample 0 ends past the end
    shards[1].write_bytes(bytes(data))
    reader = dataset_reader(spec_of({**table(name), "files": [str(folder)]}))
    for i in (0, 1):  # offsets[1] is sample 0's end and sample 1's start
        with pytest.raises(BadSampleError, match=rf"sample {i} of {shards[1].name} .*offset"):
            reader.read(1, i)
    for i in range(2, n):
        reader.records.read(1, i)  # the other samples still read
    data[0:4] = np.array([n + 1], "<u4").tobytes()  # a count its index does not say
    shards[1].write_bytes(bytes(data))
    reader = dataset_reader(spec_of({**table(name), "files": [str(folder)]}))
    with pytest.raises(BadSampleError) as caught:
        reader.read(1, n - 1)
    assert caught.value.reason == "corrupt_shard" and shards[1].name in str(caught.value)
    reader.read(0, 0)  # the first shard is intact


def test_damaged_samples_are_dropped_once_at_every_d(tmp_path) -> None:
    folder, shards = copy_case("mds-jpeg", tmp_path)
    data = bytearray(shards[0].read_bytes())
    data[8:12] = np.array([3], "<u4").tobytes()  # sample 0 ends (1 starts) in the table
    shards[0].write_bytes(bytes(data))
    t = {**table("mds-jpeg"), "files": [str(folder)]}
    got = {}
    for dp in (1, 2):
        recipe = vlm_recipe({"d": spec_of(t)}, qwen_tokenizer_dir(), seq_len=1024,
                            global_batch_size=4, num_lanes=4, image=IMAGE,
                            pack={"max_images": 6}, shuffle_buffer=4, epochs=1)
        drops = []
        for rank in range(dp):
            drops += run_epoch(Loader(recipe, rank, dp, INLINE)).drops()
        got[dp] = sorted((o.shard, o.index, r) for o, r in drops if r == "corrupt_sample")
    assert got[1] == got[2] == [(0, 0, "corrupt_sample"), (0, 1, "corrupt_sample")]


def test_the_fingerprint_covers_each_shards_size_and_index_hashes(tmp_path) -> None:
    folder, _ = copy_case("mds-jpeg", tmp_path)
    t = {**table("mds-jpeg"), "files": [str(folder)]}
    before = dataset_reader(spec_of(t)).shard_identity(1)
    assert before["bytes"] > 0 and before["samples"] > 0
    index = json.loads((folder / "index.json").read_text())
    assert index["shards"][1]["raw_data"]["hashes"]  # the writer recorded them
    index["shards"][1]["raw_data"]["hashes"]["sha1"] = "0" * 40
    (folder / "index.json").write_text(json.dumps(index))
    after = dataset_reader(spec_of(t)).shard_identity(1)
    assert after != before and after["bytes"] == before["bytes"]


def test_a_pickle_column_named_by_a_field_is_refused(tmp_path) -> None:
    folder, _ = copy_case("mds-jpeg", tmp_path)
    index = json.loads((folder / "index.json").read_text())
    for shard in index["shards"]:
        shard["column_encodings"][shard["column_names"].index("conversations")] = "pkl"
    (folder / "index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match="'conversations' is 'pkl'"):
        dataset_reader(spec_of({**table("mds-jpeg"), "files": [str(folder)]}))


def test_a_folder_without_an_index_is_refused(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="index.json does not exist"):
        dataset_reader(DatasetSpec([str(tmp_path / "empty")], "litdata"))


def test_inspect_data_reports_the_formats(tmp_path) -> None:
    from zephon_core import load_recipe

    toml = recipe_toml(tmp_path / "r.toml", [table("mds-png"), table("litdata-jpeg")])
    reports = inspect_data(load_recipe(str(toml)), 6)
    assert [r.format for r in reports] == ["mds", "litdata"]
    assert all(r.shards >= 2 and r.kept >= 4 and r.images for r in reports)


def test_s3_folders_give_the_local_samples() -> None:
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from zephon_vl.testing.storage_servers import s3_server

    with s3_server() as server:
        server.upload("zephon-containers", [])
        for name in ("mds-png", "litdata-chat"):
            for path in sorted((FIXTURES / name).iterdir()):  # the committed files only
                server.put(f"s3://zephon-containers/{name}/{path.name}", path.read_bytes())
            local = dataset_reader(spec_of(table(name)))
            remote = dataset_reader(spec_of({**table(name),
                                             "files": [f"s3://zephon-containers/{name}"]}))
            assert remote.num_shards == local.num_shards
            for s in range(local.num_shards):
                for i in range(local.shard_len(s)):
                    try:
                        want = local.read(s, i)
                    except BadSampleError as exc:
                        with pytest.raises(BadSampleError, match=exc.reason):
                            remote.read(s, i)
                        continue
                    got = remote.read(s, i)
                    assert got["media"] == want["media"] and got["turns"] == want["turns"]


@pytest.mark.parametrize("name", ["mds-jpeg", "litdata-jpeg"])
def test_a_resume_on_rewritten_data_is_refused_naming_the_shard(name, tmp_path) -> None:
    """The same sizes, other contents (the writer's index says so): a checkpoint of the old
    data is refused, naming the shard, not resumed on other samples."""
    from zephon_core import CheckpointError, batch_digest, load_recipe

    folder, shards = copy_case(name, tmp_path)
    toml = recipe_toml(tmp_path / "r.toml", [{**table(name), "files": [str(folder)]}],
                       seq_len=256, global_batch_size=4)
    with Loader(load_recipe(str(toml)), 0, 1, INLINE) as loader:
        for _ in range(2):
            batch_digest(loader.recipe.collate(loader.next_rows()))
        state = loader.state_dict()
    index = json.loads((folder / "index.json").read_text())
    if name.startswith("mds"):  # a rewrite with the same byte count: other hashes
        index["shards"][1]["raw_data"]["hashes"]["sha1"] = "0" * 40
    else:  # litdata records no hashes: another layout of the same bytes
        index["config"]["data_format"][0] = "text"
    (folder / "index.json").write_text(json.dumps(index))
    with Loader(load_recipe(str(toml)), 0, 1, INLINE) as loader:
        with pytest.raises(CheckpointError, match=shards[1].name if name.startswith("mds")
                           else shards[0].name):
            loader.load_state_dict(state)


def test_compressed_shards_are_refused_saying_how_to_write_them(tmp_path) -> None:
    folder, _ = copy_case("mds-jpeg", tmp_path)
    index = json.loads((folder / "index.json").read_text())
    index["shards"][0]["compression"] = "zstd:7"
    (folder / "index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match="compressed with 'zstd:7'.*compression=None"):
        dataset_reader(spec_of({**table("mds-jpeg"), "files": [str(folder)]}))
