"""Dataset formats (issue 21): users' data read as it is, through ``format = "..."``.

LLaVA JSON with an image folder, the_cauldron's Parquet (written with `datasets`'
own ``Image`` feature), OBELICS documents and role/content-part messages give
batches through ``zephon-vl digest --recipe FILE.toml`` with the same digests at
every D and across a resume on another D; every record is delivered once or
dropped with the reason that names its fault; and each converted sample has the
token ids of `transformers`' ``apply_chat_template`` with the family's
placeholder expansion.
"""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from tests.helpers.formats import (
    digest_lines,
    digests_across_d_and_resume,
    format_datasets,
    photos,
    recipe_toml,
)
from tests.helpers.vl import hf_image_processor, run_epoch
from zephon_core import ConfigError, Execution, Loader, load_recipe, qwen_tokenizer_dir
from zephon_core.data.formats import DatasetSpec, dataset_reader, known_formats
from zephon_core.ops.pack import FILLER_ORIGIN
from zephon_core.records import Origin
from zephon_vl import patch_rows
from zephon_vl.cli.main import main
from zephon_vl.media.image import ImageSettings
from zephon_vl.ops.multimodal import DecodeVision, TokenizeMultimodal
from zephon_vl.recipes import vlm_recipe

INLINE = Execution(runner="inline", prefetch_steps=0)
IMAGE = ImageSettings(max_pixels=50176)

#: Qwen's ChatML with image parts as Qwen2-VL's template writes them, without the default
#: system prompt that template adds (zephon adds none; docs/data-formats.md says so)
CHATML = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{%- if m['content'] is string -%}{{ m['content'] }}"
    "{%- else -%}{%- for p in m['content'] -%}"
    "{%- if p['type'] == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- else -%}{{ p['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    return format_datasets(tmp_path_factory.mktemp("formats"))


def spec_of(table: dict) -> DatasetSpec:
    options = {k: v for k, v in table.items() if k.endswith("_folder")}
    return DatasetSpec(table["files"], table["format"], table.get("fields", {}), options)


@pytest.mark.parametrize("name", ["llava", "parquet", "obelics"])
def test_format_recipe_digests_agree_across_d_and_resume(name, data, capsys, tmp_path) -> None:
    table, _ = data[name]
    toml = recipe_toml(tmp_path / f"{name}.toml", [table])
    # D = 2 in worker processes (the readers travel pickled), for one format
    pool = ["--runner", "auto", "--default-workers", "2"] if name == "parquet" else []
    first = digests_across_d_and_resume(capsys, toml, pool)
    assert all(r["rows"] == 8 for r in first)


def keys_of(reader, origins) -> list[str]:
    return [reader.read(o.shard, o.index)["__key__"] for o in origins]


@pytest.mark.parametrize("name", ["llava", "parquet", "obelics", "messages"])
@pytest.mark.parametrize("dp", [1, 2])
def test_every_record_is_delivered_once_or_dropped_with_its_reason(name, dp, data) -> None:
    table, expected_drops = data[name]
    recipe = vlm_recipe({table["name"]: spec_of(table)}, qwen_tokenizer_dir(), seq_len=1024,
                        global_batch_size=4, num_lanes=4, image=IMAGE, pack={"max_images": 6},
                        shuffle_buffer=4, epochs=1)
    reader = recipe.datasets[0].reader
    total = reader.shard_len(0)
    delivered, drops = [], []
    for rank in range(dp):
        ep = run_epoch(Loader(recipe, rank, dp, INLINE))
        delivered += [o for o in ep.origins() if o != FILLER_ORIGIN]
        drops += ep.drops()
    seen = sorted([o.index for o in delivered] + [o.index for o, _ in drops])
    assert seen == list(range(total))  # each record exactly once
    by_key = {}
    for o, reason in drops:
        rec = reader.records.read(o.shard, o.index)
        by_key[str(rec.get("id", o.index))] = reason
    assert by_key == expected_drops


def expand(ids: list[int], runs: list[int], pad: int) -> list[int]:
    """Each single image pad of a chat template's output -> that image's run of pads."""
    out, k = [], 0
    for t in ids:
        if t == pad:
            out += [pad] * runs[k]
            k += 1
        else:
            out.append(t)
    assert k == len(runs)
    return out


def llava_messages(rec: dict) -> list[dict]:
    """A LLaVA record as HF chat messages, by the documented rule: each <image> an image
    part where it stands, or all images before the first human turn's text."""
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    msgs = []
    placed = any("<image>" in t["value"] for t in rec["conversations"])
    images = rec.get("image")
    count = 0 if images is None else (len(images) if isinstance(images, list) else 1)
    for t in rec["conversations"]:
        parts: list[dict] = []
        for j, chunk in enumerate(t["value"].split("<image>")):
            if j:
                parts.append({"type": "image"})
            parts.append({"type": "text", "text": chunk})
        if not placed and count and t["from"] == "human":
            parts = [{"type": "image"}] * count + parts
            placed = True
        msgs.append({"role": roles[t["from"]], "content": parts})
    return msgs


def cauldron_messages(rec: dict) -> list[dict]:
    msgs = []
    for k, ex in enumerate(rec["texts"]):
        parts = [{"type": "image"}] * (len(rec["images"]) if k == 0 else 0)
        msgs += [{"role": "user", "content": [*parts, {"type": "text", "text": ex["user"]}]},
                 {"role": "assistant", "content": ex["assistant"]}]
    return msgs


def plain_messages(rec: dict) -> list[dict]:
    return [{"role": m["role"], "content": [{"type": p["type"], "text": p.get("text", "")}
                                            for p in m["content"]]} for m in rec["messages"]]


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))


@pytest.mark.parametrize("name", ["llava", "parquet", "messages", "obelics"])
def test_converted_samples_equal_the_chat_template(name, data, hf_tokenizer) -> None:
    table, expected_drops = data[name]
    reader = dataset_reader(spec_of(table))
    decode = DecodeVision(IMAGE)
    tok = TokenizeMultimodal(qwen_tokenizer_dir(), IMAGE.merge_size, 1 << 16)
    tok.setup()
    pad = hf_tokenizer.convert_tokens_to_ids("<|image_pad|>")
    eos = hf_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    checked = 0
    for i in range(reader.shard_len(0)):
        rec = reader.records.read(0, i)
        if str(rec.get("id", i)) in expected_drops:
            continue
        out = tok.tokenize(decode.decode(reader.read(0, i)))
        runs = [int(np.prod(g)) // IMAGE.merge_size ** 2 for g in out["grid_thw"]]
        if name == "obelics":
            text = "".join(t if t is not None else "<|vision_start|><|image_pad|><|vision_end|>"
                           for t in rec["texts"])
            ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            msgs = {"llava": llava_messages, "parquet": cauldron_messages,
                    "messages": plain_messages}[name](rec)
            text = hf_tokenizer.apply_chat_template(msgs, chat_template=CHATML, tokenize=False)
            ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
        want = expand(ids, runs, pad) + [eos]
        assert out["tokens"].tolist() == want, f"{name} record {i}"
        trained = hf_tokenizer.decode(out["tokens"][out["targets"]].tolist())
        if name == "obelics":
            assert trained == "".join(t for t in rec["texts"] if t) + "<|endoftext|>"
        else:
            answers = [m["content"] if isinstance(m["content"], str) else
                       "".join(p["text"] for p in m["content"] if p["type"] == "text")
                       for m in msgs if m["role"] == "assistant"]
            assert trained == "".join(a + "<|im_end|>\n" for a in answers) + "<|endoftext|>"
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("name", ["llava", "parquet", "messages", "obelics"])
def test_converted_samples_have_the_hf_image_processors_pixels(name, data) -> None:
    """Each image of each converted record, as the pipeline decodes it, equals what
    transformers' Qwen2-VL image processor makes of the record's own image bytes."""
    table, expected_drops = data[name]
    reader = dataset_reader(spec_of(table))
    settings = replace(IMAGE, normalize="worker")
    decode = DecodeVision(settings)
    processor = hf_image_processor(settings)
    checked = 0
    for i in range(reader.shard_len(0)):
        rec = reader.records.read(0, i)
        if str(rec.get("id", i)) in expected_drops:
            continue
        sample = reader.read(0, i)
        doc = decode.decode(sample)
        for m, vp in zip(sample["media"], doc["vision"], strict=True):
            assert not m["video"]
            ref = processor(Image.open(io.BytesIO(m["data"])), return_tensors="np")
            np.testing.assert_array_equal(vp.grid_thw, np.asarray(ref["image_grid_thw"])[0])
            ours = patch_rows([vp.pixel_values], settings).astype(np.float64)
            assert ours.shape == np.asarray(ref["pixel_values"]).shape, f"{name} record {i}"
            assert np.abs(ours - np.asarray(ref["pixel_values"])).max() <= 1e-5, \
                f"{name} record {i}"
            checked += 1
    assert checked >= 10


def test_llava_images_sit_where_their_placeholders_are(data) -> None:
    table, _ = data["llava"]
    reader = dataset_reader(spec_of(table))
    i, rec = next((i, r) for i in range(reader.shard_len(0))
                  if isinstance((r := reader.records.read(0, i)).get("image"), list))
    sample = reader.read(0, i)
    first = sample["turns"][0]["content"]
    assert first[:4] == ["First ", None, " then ", None]
    assert [m["name"] for m in sample["media"]] == rec["image"]
    records = [reader.records.read(0, k) for k in range(reader.shard_len(0))]
    j = next(k for k, r in enumerate(records)
             if r["conversations"][0]["from"] == "system" and r.get("image"))
    turns = reader.read(0, j)["turns"]
    assert turns[0]["content"] == ["Answer briefly."]  # the system turn keeps its text
    assert turns[1]["content"][0] is None  # the image opens the first human turn


def test_llava_records_share_images_and_read_videos(tmp_path) -> None:
    from zephon_vl.testing.video import encode_test_video

    (tmp_path / "img").mkdir()
    (tmp_path / "vid").mkdir()
    _, jpeg, _ = photos(1)[0]
    (tmp_path / "img" / "a.jpg").write_bytes(jpeg)
    frames = [np.full((64, 96, 3), 20 * k, dtype=np.uint8) for k in range(8)]
    (tmp_path / "vid" / "clip.mp4").write_bytes(encode_test_video(frames, fps=4))
    recs = [{"id": f"r{i}", "image": "a.jpg", "conversations": [
        {"from": "human", "value": f"<image>\nquestion {i}"}, {"from": "gpt", "value": "a"}]}
        for i in range(3)]
    recs.append({"id": "v", "video": "clip.mp4", "conversations": [
        {"from": "human", "value": "<video>\nWhat happens?"},
        {"from": "gpt", "value": "It pans."}]})
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs))
    spec = DatasetSpec([str(path)], "llava", options={"image_folder": str(tmp_path / "img"),
                                                      "video_folder": str(tmp_path / "vid")})
    reader = dataset_reader(spec)
    decode = DecodeVision(IMAGE)
    docs = [decode.decode(reader.read(0, i)) for i in range(4)]
    assert all(d["video"] == [False] for d in docs[:3])
    assert docs[3]["video"] == [True] and docs[3]["vision"][0].grid_thw[0] >= 1
    assert all(np.array_equal(d["vision"][0].pixel_values, docs[0]["vision"][0].pixel_values)
               for d in docs[:3])


def test_llava_reads_an_images_list_as_image(tmp_path) -> None:
    """``images`` (LLaVA-OneVision and ShareGPT4V write the list under that name) is read
    when a record has no ``image``; a record with both is a drop naming them."""
    (tmp_path / "img").mkdir()
    for k, (_, jpeg, _) in enumerate(photos(2)):
        (tmp_path / "img" / f"{k}.jpg").write_bytes(jpeg)
    conv = [{"from": "human", "value": "<image> or <image>?"}, {"from": "gpt", "value": "b"}]
    recs = [{"id": "a", "images": ["0.jpg", "1.jpg"], "conversations": conv},
            {"id": "b", "image": ["0.jpg", "1.jpg"], "conversations": conv},
            {"id": "c", "image": "0.jpg", "images": ["1.jpg"], "conversations": conv}]
    path = tmp_path / "data.json"
    path.write_text(json.dumps(recs))
    reader = dataset_reader(DatasetSpec([str(path)], "llava",
                                        options={"image_folder": str(tmp_path / "img")}))
    first, second = reader.read(0, 0), reader.read(0, 1)
    assert [m["name"] for m in first["media"]] == ["0.jpg", "1.jpg"]
    assert first["turns"] == second["turns"]
    from zephon_core import BadSampleError
    with pytest.raises(BadSampleError, match="both 'image' and 'images'"):
        reader.read(0, 2)


def test_json_offset_index_is_built_once_and_cached(tmp_path) -> None:
    from zephon_vl.formats.records import OFFSETS_SUFFIX, RecordFiles

    recs = [{"id": i, "text": "é" * i, "conversations": []} for i in range(50)]
    path = tmp_path / "list.json"
    path.write_text(json.dumps(recs, ensure_ascii=False, indent=2))
    files = RecordFiles([str(path)])
    cached = path.with_name(path.name + OFFSETS_SUFFIX)
    assert cached.is_file()
    assert [files.read(0, i) for i in range(50)] == recs
    blob = json.loads(cached.read_text())
    blob["starts"] = [0] * 50  # a cache that still matches size and mtime is used as it is
    cached.write_text(json.dumps(blob))
    assert RecordFiles([str(path)]).offsets[0][0].tolist() == [0] * 50
    path.write_text(json.dumps(recs[:10], ensure_ascii=False))  # a changed file: rebuilt
    assert [RecordFiles([str(path)]).read(0, i) for i in range(10)] == recs[:10]


def test_parquet_row_group_cache_is_bounded(data) -> None:
    table, _ = data["parquet"]
    reader = dataset_reader(DatasetSpec(table["files"], "parquet",
                                        options={"row_group_cache": 2}))
    groups = len(reader.records.group_starts[0]) - 1
    assert groups >= 4
    rows = [reader.records.read(0, i) for i in reversed(range(reader.shard_len(0)))]
    assert len(reader.records._groups) == 2  # noqa: SLF001 - the bound itself
    assert len(rows) == reader.shard_len(0)


def test_a_shuffled_group_reads_each_parquet_row_group_once(data, monkeypatch) -> None:
    """`read_many` (what the read stage calls with a lane's group) decodes each row group
    it touches once, where row-by-row reads with a cache of one decode a group per row;
    the samples are the ones `read` gives, in the group's order."""
    import pyarrow.parquet as pq

    table, _ = data["parquet"]
    spec = DatasetSpec(table["files"], "parquet", options={"row_group_cache": 1})
    n = dataset_reader(spec).shard_len(0)
    pointers = [(0, i) for i in np.random.default_rng(3).permutation(n)[:24].tolist()]
    decoded: list[int] = []
    read_row_group = pq.ParquetFile.read_row_group

    def counted(self, i, *args, **kwargs):
        decoded.append(i)
        return read_row_group(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
    one_by_one = dataset_reader(spec)
    want = [one_by_one.read(s, i) for s, i in pointers]
    by_row = len(decoded)
    decoded.clear()
    got = dataset_reader(spec).read_many(pointers)
    assert [g["__key__"] for g in got] == [w["__key__"] for w in want]
    assert [g["turns"] for g in got] == [w["turns"] for w in want]
    assert [[m["data"] for m in g["media"]] for g in got] == \
        [[m["data"] for m in w["media"]] for w in want]
    assert sorted(decoded) == sorted(set(decoded)) and len(decoded) < by_row


def test_every_format_through_s3_gives_the_local_digests(data, tmp_path, capsys) -> None:
    """The storage seam serves record files, their offset index and the images they
    name: Parquet, a LLaVA JSON, OBELICS documents and chat messages with their image
    folders on S3 (moto on 127.0.0.1): the local digests, with threads, and across a
    resume on another D."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from zephon_vl.testing.storage_servers import s3_server

    tables = [data[name][0] for name in ("parquet", "llava", "obelics", "messages")]
    local = recipe_toml(tmp_path / "local.toml", tables)
    args = ["--steps", "3", "--dp", "2"]
    want = [r["sha256"] for r in digest_lines(capsys, ["--recipe", str(local), *args])]
    with s3_server() as server:
        remote_tables = []
        for k, table in enumerate(tables):
            (url,) = server.upload(f"zephon-files-{k}", table["files"])
            moved = {**table, "files": [url]}
            if "image_folder" in table:
                images = sorted(str(p) for p in Path(table["image_folder"]).iterdir())
                server.upload(f"zephon-images-{k}", images)
                moved["image_folder"] = f"s3://zephon-images-{k}/data"
            remote_tables.append(moved)
        remote = recipe_toml(tmp_path / "remote.toml", remote_tables,
                             index_cache=str(tmp_path / "cache"))
        got = [r["sha256"] for r in digest_lines(capsys, ["--recipe", str(remote), *args])]
        threads = [r["sha256"] for r in digest_lines(capsys, [
            "--recipe", str(remote), *args, "--runner", "threads", "--default-workers", "3",
            "--group-size", "2"])]
        resumed = digest_lines(capsys, ["--recipe", str(remote), *args, "--save-at", "1",
                                        "--resume-dp", "1"])
    assert got == want and threads == want and len(want) == 3
    assert [r["sha256"] for r in resumed if r["phase"] != "run"] == want[1:]


def test_unknown_format_lists_the_known_ones(data, tmp_path) -> None:
    table, _ = data["llava"]
    toml = recipe_toml(tmp_path / "x.toml", [{**table, "format": "llama"}])
    known = ", ".join(known_formats())  # every registered format, llava among them
    assert "llava, " in known and known.endswith("webdataset")
    with pytest.raises(ConfigError, match=r"x\.toml: dataset 'llava': unknown dataset format "
                       rf"'llama'; known: {known} \(plugins loaded: zephon_vl;"):
        load_recipe(str(toml))


def test_bad_field_map_names_the_known_fields(data, tmp_path) -> None:
    table, _ = data["llava"]
    toml = recipe_toml(tmp_path / "x.toml", [{**table, "fields": {"convos": "turns"}}])
    with pytest.raises(ConfigError, match=r"unknown field 'convos' for format 'llava'; known: "
                       r"conversations, id, image, images, video"):
        load_recipe(str(toml))


def test_renamed_fields_are_read(tmp_path, data) -> None:
    table, _ = data["llava"]
    recs = json.loads(Path(table["files"][0]).read_text())
    renamed = [{"uid": r["id"], "picture": r.get("image"), "dialog": r["conversations"]}
               for r in recs]
    path = tmp_path / "renamed.json"
    path.write_text(json.dumps(renamed))
    fields = {"id": "uid", "image": "picture", "conversations": "dialog"}
    a = dataset_reader(spec_of(table))
    b = dataset_reader(DatasetSpec([str(path)], "llava", fields,
                                   {"image_folder": table["image_folder"]}))
    for i in range(0, a.shard_len(0), 5):
        try:
            want = a.read(0, i)
        except Exception as exc:  # noqa: BLE001 - the bad records fail alike
            with pytest.raises(type(exc)):
                b.read(0, i)
            continue
        got = b.read(0, i)
        assert {k: v for k, v in got.items() if k != "__shard__"} == \
            {k: v for k, v in want.items() if k != "__shard__"}


def test_a_file_that_does_not_fit_its_format_is_named_with_its_keys(data, tmp_path) -> None:
    table, _ = data["obelics"]
    toml = recipe_toml(tmp_path / "x.toml", [{**table, "format": "llava"}])
    with pytest.raises(ConfigError, match=r"obelics\.jsonl: its records do not fit format "
                       r"'llava': it needs 'conversations'; saw keys \['images', 'texts', "
                       r"'url'\]"):
        load_recipe(str(toml))
    cauldron, _ = data["parquet"]
    with pytest.raises(ConfigError, match=r"cauldron\.parquet: its records do not fit format "
                       r"'obelics': it needs 'captions'; saw keys \['images', 'texts'\]"):
        dataset_reader(DatasetSpec(cauldron["files"], "obelics",
                                   {"texts": "captions"}))


def test_unknown_option_and_text_kind_are_refused(data, tmp_path) -> None:
    table, _ = data["obelics"]
    with pytest.raises(ConfigError, match=r"unknown option 'video_dir' for a 'obelics' "
                       r"dataset; its options: image_folder, video_folder, row_group_cache"):
        dataset_reader(DatasetSpec(table["files"], "obelics", options={"video_dir": "x"}))
    toml = tmp_path / "t.toml"
    toml.write_text(f'kind = "text"\n[[datasets]]\nname = "web"\nformat = "obelics"\n'
                    f'files = {json.dumps(table["files"])}\n')
    with pytest.raises(ConfigError, match=r"format 'obelics' has images or videos; this recipe "
                       r"kind reads text only"):
        load_recipe(str(toml))


def test_webdataset_multi_image_conversations_are_read(tmp_path, hf_tokenizer) -> None:
    """Numbered images with a chat (LLaVA's from/value or role/content) become one
    conversation: images where their placeholders are, only assistant turns trained."""
    from zephon_vl.wds.writer import write_shards

    pics = photos(3)
    chat = {"conversations": [{"from": "human", "value": "<image> or <image>?"},
                              {"from": "gpt", "value": "The first."},
                              {"from": "human", "value": "And <image>?"},
                              {"from": "gpt", "value": "Neither."}]}
    sample = {"__key__": "s0", "0.jpg": pics[0][1], "1.jpg": pics[1][1],
              "2.jpg": pics[2][1], "json": chat}
    shards = write_shards([sample], tmp_path)
    reader = dataset_reader(DatasetSpec([str(p) for p in shards], "webdataset"))
    doc = DecodeVision(IMAGE).decode(reader.read(0, 0))
    assert doc["kind"] == "conversation" and len(doc["vision"]) == 3
    tok = TokenizeMultimodal(qwen_tokenizer_dir(), IMAGE.merge_size, 1 << 16)
    tok.setup()
    out = tok.tokenize(doc)
    rec = {"conversations": chat["conversations"], "image": ["a", "b", "c"]}
    text = hf_tokenizer.apply_chat_template(llava_messages(rec), chat_template=CHATML,
                                            tokenize=False)
    runs = [int(np.prod(g)) // IMAGE.merge_size ** 2 for g in out["grid_thw"]]
    pad = hf_tokenizer.convert_tokens_to_ids("<|image_pad|>")
    eos = hf_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    want = expand(hf_tokenizer(text, add_special_tokens=False)["input_ids"], runs, pad)
    assert out["tokens"].tolist() == want + [eos]
    trained = hf_tokenizer.decode(out["tokens"][out["targets"]].tolist())
    assert trained == "The first.<|im_end|>\nNeither.<|im_end|>\n<|endoftext|>"


@pytest.mark.parametrize("form, roles", [
    (("conversations", "from", "value"), ("human", "gpt")),
    (("messages", "role", "content"), ("human", "gpt")),
    (("messages", "role", "content"), ("user", "assistant"))])
def test_sharegpt_roles_in_text_records_train_the_answers(form, roles, hf_tokenizer) -> None:
    """A text record with ShareGPT's roles (human/gpt), under from/value or role/content
    keys, once trained only <|endoftext|>; its gpt turns are now the targets, and an
    unknown role is a drop (issue 21)."""
    from zephon_core import BadSampleError
    from zephon_vl.ops.multimodal import text_document

    key, role, text = form
    doc = text_document({key: [{role: roles[0], text: "hi"},
                               {role: roles[1], text: "hello there"}]})
    assert [t["role"] for t in doc["turns"]] == ["user", "assistant"]
    tok = TokenizeMultimodal(qwen_tokenizer_dir(), IMAGE.merge_size, 4096)
    tok.setup()
    out = tok.tokenize(doc)
    assert hf_tokenizer.decode(out["tokens"][out["targets"]].tolist()) == \
        "hello there<|im_end|>\n<|endoftext|>"
    with pytest.raises(BadSampleError, match="bad_role"):
        text_document({key: [{role: "narrator", text: "x"}]})


def test_ledger_drops_name_the_record(data, tmp_path, capsys) -> None:
    """A drop in the per-step ledger names the record (``file:id``) beside its reason."""
    table, expected = data["llava"]
    toml = recipe_toml(tmp_path / "l.toml", [table])
    ledger = tmp_path / "ledger.jsonl"
    digest_lines(capsys, ["--recipe", str(toml), "--steps", "3", "--ledger", str(ledger)])
    steps = [json.loads(line) for line in ledger.read_text().splitlines()[1:]]
    drops = [d for s in steps for d in s["drops"]]
    assert drops, "the bad records of the first epoch are drawn in three steps"
    for d in drops:
        file, _, key = d["key"].partition(":")
        assert file == "llava.json" and expected[key] == d["reason"]


def test_ledger_drop_details_say_why_and_agree_across_d_and_runners(data, tmp_path,
                                                                    capsys) -> None:
    """Each drop carries its detail (how many placeholders for how many images, which file
    is missing...), the same at D = 1 and 2, inline and in worker processes, and outside
    the ledger's digests (a ledger of the code before details has the same digests)."""
    from zephon_core.engine.ledger import lane_entries
    from zephon_core.ops.contract import Row

    table, expected = data["llava"]
    toml = recipe_toml(tmp_path / "l.toml", [table])
    ledgers = {}
    for name, extra in {"d1": ["--runner", "inline"],
                        "d2-processes": ["--dp", "2", "--runner", "processes",
                                         "--default-workers", "2"]}.items():
        path = tmp_path / f"{name}.jsonl"
        capsys.readouterr()
        assert main(["digest", "--recipe", str(toml), "--steps", "3", "--ledger", str(path),
                     *extra]) == 0
        ledgers[name] = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert ledgers["d1"] == ledgers["d2-processes"]
    drops = {d["key"].partition(":")[2]: d for s in ledgers["d1"] for d in s["drops"]}
    assert drops and all(expected[k] == d["reason"] for k, d in drops.items())
    want = {"bad-count": "2 <image> and 0 <video> placeholders for 1 image(s)",
            "bad-file": "missing.jpg", "bad-role": "'narrator'",
            "bad-noanswer": "nothing to train on"}
    for key, d in drops.items():
        assert want[key] in d["detail"], d
    # the digest of a lane's drops is the one it had before details were recorded
    o = Origin(0, 0, 0, 3, 0)
    plain, detailed = Row([], [(o, "bad_role")]), Row([], [(o, "bad_role")], ["why"])
    a, b = lane_entries([0], 1, [plain]), lane_entries([0], 1, [detailed])
    assert a[0]["digest"] == b[0]["digest"] and b[0]["drops"][0]["detail"] == "why"


def test_drop_details_mask_addresses_and_stay_short() -> None:
    from zephon_core.records import DETAIL_CHARS, drop_detail

    a = drop_detail("cannot identify image file <_io.BytesIO object at 0x7f3a1c2b9e50>")
    b = drop_detail("cannot identify image file <_io.BytesIO object at 0x7ffe00000010>")
    assert a == b == "cannot identify image file <_io.BytesIO object at 0x...>"
    assert len(drop_detail("x" * 1000)) == DETAIL_CHARS
    assert drop_detail("2 tokens > seq_len 1") == "2 tokens > seq_len 1"


def test_llava_next_parquet_layout_is_read(tmp_path, hf_tokenizer) -> None:
    """LLaVA-NeXT-Data's layout: one ``Image`` column and LLaVA ``conversations``."""
    import datasets

    pics = photos(4, seed=5)
    convs = [[{"from": "human", "value": f"<image>\n{qa[0][0]}"},
              {"from": "gpt", "value": qa[0][1]}] for _, _, qa in pics]
    convs[1] = [{"from": "human", "value": "Describe it."}, {"from": "gpt", "value": "Sure."}]
    features = datasets.Features({
        "id": datasets.Value("string"), "image": datasets.Image(),
        "conversations": [{"from": datasets.Value("string"),
                           "value": datasets.Value("string")}]})
    ds = datasets.Dataset.from_dict(
        {"id": [f"n{i}" for i in range(4)],
         "image": [{"bytes": data, "path": f"{stem}.jpg"} for stem, data, _ in pics],
         "conversations": convs}, features=features)
    path = tmp_path / "next.parquet"
    ds.to_parquet(str(path), batch_size=2)
    reader = dataset_reader(DatasetSpec([str(path)], "parquet"))
    tok = TokenizeMultimodal(qwen_tokenizer_dir(), IMAGE.merge_size, 1 << 16)
    tok.setup()
    pad = hf_tokenizer.convert_tokens_to_ids("<|image_pad|>")
    eos = hf_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    for i in range(4):
        sample = reader.read(0, i)
        assert sample["__key__"] == f"n{i}"
        out = tok.tokenize(DecodeVision(IMAGE).decode(sample))
        msgs = llava_messages({"conversations": convs[i], "image": "x.jpg"})
        text = hf_tokenizer.apply_chat_template(msgs, chat_template=CHATML, tokenize=False)
        runs = [int(np.prod(g)) // IMAGE.merge_size ** 2 for g in out["grid_thw"]]
        assert out["tokens"].tolist() == expand(
            hf_tokenizer(text, add_special_tokens=False)["input_ids"], runs, pad) + [eos]
    assert reader.key(0, 3) == "next.parquet:n3"


def test_a_bad_record_raises_naming_file_key_and_cause(data) -> None:
    from zephon_core import BadSampleError

    table, expected = data["llava"]
    reader = dataset_reader(spec_of(table))
    records = [reader.records.read(0, i) for i in range(reader.shard_len(0))]
    details = {}
    for i, rec in enumerate(records):
        if rec.get("id") in expected:
            with pytest.raises(BadSampleError) as info:
                reader.read(0, i)
            assert info.value.reason == expected[rec["id"]]
            assert info.value.where == f"llava.json:{rec['id']}"
            details[rec["id"]] = info.value.detail
    assert details["bad-count"] == ("2 <image> and 0 <video> placeholders for 1 image(s) and "
                                    "0 video(s)")
    assert "nowhere/missing.jpg does not exist" in details["bad-file"]
    assert "'narrator'" in details["bad-role"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=5), json_values, max_size=3), max_size=8),
       st.sampled_from([None, 0, 1, 2]), st.booleans(), st.sampled_from(["", " ", "\n  "]))
def test_json_offsets_find_every_record(records, indent, ascii_only, pad) -> None:
    """Byte offsets of a JSON list's records, whatever its spacing and non-ASCII text,
    and of JSON Lines, slice out exactly the records."""
    from zephon_vl.formats.records import json_offsets

    text = pad + json.dumps(records, indent=indent, ensure_ascii=ascii_only) + pad
    data = text.encode()
    offsets = json_offsets(data, "t.json")
    assert [json.loads(data[a:a + n]) for a, n in offsets.T] == records
    lines = "".join(json.dumps(r, ensure_ascii=ascii_only) + "\n" for r in records).encode()
    offsets = json_offsets(lines, "t.jsonl")
    assert [json.loads(lines[a:a + n]) for a, n in offsets.T] == records


def test_recipe_file_dataset_keys_are_checked(data, tmp_path) -> None:
    table, _ = data["llava"]
    bad_fields = recipe_toml(tmp_path / "a.toml", [{**table, "fields": "id"}])
    with pytest.raises(ConfigError, match=r"\[\[datasets\]\] #1: fields must be a table"):
        load_recipe(str(bad_fields))
    bad_format = recipe_toml(tmp_path / "b.toml", [{**table, "format": 3}])
    with pytest.raises(ConfigError,
                       match=r"format must be a string, got 3; known: arrow, lance, "
                             r"litdata, llava, "):
        load_recipe(str(bad_format))
    bad_key = recipe_toml(tmp_path / "c.toml", [{**table, "image_dir": "x"}])
    with pytest.raises(ConfigError, match=r"unknown key 'image_dir' in \[\[datasets\]\] #1; "
                       r"known: .*format, fields, image_folder, video_folder"):
        load_recipe(str(bad_key))
    relative = tmp_path / "rel"
    relative.mkdir()
    toml = recipe_toml(relative / "d.toml", [{**table, "image_folder": "../imgs"}])
    reader = load_recipe(str(toml)).datasets[0].reader
    assert reader.folders["image_folder"] == str((tmp_path / "imgs").resolve())


def test_a_json_list_without_a_format_is_refused_with_a_hint(data) -> None:
    """LLaVA's JSON given without ``format`` once became one corrupt_json drop per line."""
    table, _ = data["llava"]
    with pytest.raises(ConfigError, match=r"llava\.json: a JSON list, not JSON Lines: format "
                       r"'text' reads one record a line; name the list's format"):
        vlm_recipe({"llava": table["files"]}, qwen_tokenizer_dir(), num_lanes=4)


@pytest.mark.parametrize("fmt", [None, "llava", "webdataset"])
def test_a_folder_given_as_a_file_is_refused_naming_it(data, fmt) -> None:
    """A folder in ``files`` once gave "cannot read files with suffixes ['']" (or a
    format's own puzzling error): it is named, with what a dataset lists instead."""
    table, _ = data["llava"]
    folder = os.path.dirname(table["files"][0])
    spec = {"files": [folder]} if fmt is None else {"files": [folder], "format": fmt}
    with pytest.raises(ConfigError, match=re.escape(repr(folder)) + " is a folder; a "
                       "dataset lists its files"):
        vlm_recipe({"x": spec}, qwen_tokenizer_dir(), num_lanes=4)


def test_records_with_images_without_a_format_are_refused_with_a_hint(data) -> None:
    """The Hub's Parquet with embedded images once was read as text: every row dropped."""
    table, _ = data["parquet"]
    with pytest.raises(ConfigError, match=r"cauldron\.parquet: its records have 'images', "
                       r"which format 'text' would ignore; name their format"):
        vlm_recipe({"c": table["files"]}, qwen_tokenizer_dir(), num_lanes=4)


def test_webdataset_json_with_obelics_lists_is_an_interleaved_document(tmp_path,
                                                                       hf_tokenizer) -> None:
    """A tar sample whose json holds OBELICS's ``texts``/``images`` lists: its numbered
    images go where the non-null ``images`` entries are, all text is trained; a count that
    differs from the members, or a position with both a text and an image, is a drop."""
    from zephon_core import BadSampleError
    from zephon_vl.wds.writer import write_shards

    pics = photos(2)
    good = {"texts": ["A harbour at dawn.", None, " Boats leave", None, " before six."],
            "images": [None, "https://example.org/a.jpg", None, "b.jpg", None]}
    samples = [
        {"__key__": "d0", "0.jpg": pics[0][1], "1.jpg": pics[1][1], "json": good},
        {"__key__": "d1", "0.jpg": pics[0][1], "json": good},
        {"__key__": "d2", "0.jpg": pics[0][1],
         "json": {"texts": ["x", None], "images": ["a.jpg", "b.jpg"]}},
        {"__key__": "d3", "json": {"texts": ["only text"], "images": [None]}},
    ]
    shards = write_shards(samples, tmp_path)
    reader = dataset_reader(DatasetSpec([str(p) for p in shards], "webdataset"))
    decode = DecodeVision(IMAGE)
    tok = TokenizeMultimodal(qwen_tokenizer_dir(), IMAGE.merge_size, 1 << 16)
    tok.setup()
    by_key = {reader.read(0, i)["__key__"]: reader.read(0, i) for i in range(4)}
    doc = decode.decode(by_key["d0"])
    assert doc["kind"] == "interleaved" and len(doc["vision"]) == 2
    out = tok.tokenize(doc)
    runs = [int(np.prod(g)) // IMAGE.merge_size ** 2 for g in out["grid_thw"]]
    pad = hf_tokenizer.convert_tokens_to_ids("<|image_pad|>")
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    want = expand(hf_tokenizer("A harbour at dawn." + image, add_special_tokens=False)
                  ["input_ids"], runs[:1], pad)
    want += expand(hf_tokenizer(" Boats leave" + image, add_special_tokens=False)
                   ["input_ids"], runs[1:], pad)
    want += hf_tokenizer(" before six.<|endoftext|>", add_special_tokens=False)["input_ids"]
    assert out["tokens"].tolist() == want
    assert hf_tokenizer.decode(out["tokens"][out["targets"]].tolist()) == \
        "A harbour at dawn. Boats leave before six.<|endoftext|>"
    with pytest.raises(BadSampleError, match="placeholder_mismatch.*1 numbered image"):
        decode.decode(by_key["d1"])
    with pytest.raises(BadSampleError, match="bad_record.*position 0 holds both"):
        decode.decode(by_key["d2"])
    text_only = tok.tokenize(decode.decode(by_key["d3"]))
    assert hf_tokenizer.decode(text_only["tokens"].tolist()) == "only text<|endoftext|>"


def test_ledger_drop_details_survive_a_resume_on_another_d(data, tmp_path, capsys) -> None:
    """The resumed ledger's steps are the uninterrupted run's, details included (a drop
    pending in the checkpoint keeps its detail in the lane state)."""
    table, _ = data["llava"]
    toml = recipe_toml(tmp_path / "l.toml", [table])
    path = tmp_path / "run.jsonl"
    capsys.readouterr()
    assert main(["digest", "--runner", "inline", "--recipe", str(toml), "--steps", "6",
                 "--save-at", "2", "--resume-dp", "2", "--ledger", str(path)]) == 0
    whole = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    resumed = [json.loads(line) for line in
               (tmp_path / "run.resumed-d2.jsonl").read_text().splitlines()[1:]]
    assert [s["step"] for s in resumed] == [2, 3, 4, 5]
    assert resumed == whole[2:]
    assert any("detail" in d for s in resumed for d in s["drops"])
