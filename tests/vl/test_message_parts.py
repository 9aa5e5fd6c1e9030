"""Issue 37, item 2: chats as API logs write them.

OpenAI's ``data:`` URLs (images and videos) in ``image_url``, xtuner's/Qwen's
``video_url``, the Responses API's ``input_image``/``input_text`` and Anthropic's
``image`` parts with a ``base64`` or ``url`` source each give the sample of the same
media named as a file (same tokens, same pixels, same digests); a malformed part is a
drop whose detail names the part and never holds its payload, the same at D = 1 and 2;
decoding is bounded by ``max_image_bytes``/``max_video_bytes`` before any byte is
decoded, and strict base64.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.formats import photos, recipe_toml
from zephon_core import BadSampleError, qwen_tokenizer_dir
from zephon_core.data.formats import DatasetSpec, dataset_reader
from zephon_vl.cli.main import main
from zephon_vl.media.image import ImageSettings
from zephon_vl.ops.multimodal import DecodeVision, TokenizeMultimodal

IMAGE = ImageSettings(max_pixels=50176)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{b64(data)}"


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, Any]:
    """Three photos and one clip under one folder, and their bytes."""
    from zephon_vl.testing.video import encode_test_video

    folder = tmp_path_factory.mktemp("parts") / "media"
    folder.mkdir()
    files = {}
    for k, (_, jpeg, _) in enumerate(photos(3, seed=5)):
        (folder / f"p{k}.jpg").write_bytes(jpeg)
        files[f"p{k}.jpg"] = jpeg
    frames = [np.full((64, 96, 3), 25 * k, dtype=np.uint8) for k in range(8)]
    clip = encode_test_video(frames, fps=4)
    (folder / "clip.mp4").write_bytes(clip)
    files["clip.mp4"] = clip
    return {"folder": folder, "files": files}


def image_part(form: str, name: str, files: dict[str, bytes]) -> dict:
    """The image `name` as a content part of the given form."""
    data = files[name]
    return {
        "file": {"type": "image", "image": name},
        "image_url": {"type": "image_url", "image_url": {"url": data_url("image/jpeg", data),
                                                         "detail": "auto"}},
        "input_image": {"type": "input_image", "image_url": data_url("image/jpeg", data),
                        "detail": "high"},
        "anthropic": {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                                  "data": b64(data)}},
        "anthropic_url": {"type": "image", "source": {"type": "url", "url": name}},
    }[form]


def video_part(form: str, files: dict[str, bytes]) -> dict:
    return {
        "file": {"type": "video", "video": "clip.mp4"},
        "video_url": {"type": "video_url", "video_url": {"url": "clip.mp4"}},
        "video_url_data": {"type": "video_url",
                           "video_url": {"url": data_url("video/mp4", files["clip.mp4"])}},
        "video_data": {"type": "video", "video": data_url("video/mp4", files["clip.mp4"])},
    }[form]


def text_part(form: str, text: str) -> dict:
    return {"type": "input_text" if form == "input_image" else "text", "text": text}


def chats(form: str, files: dict[str, bytes], count: int = 8) -> list[dict]:
    """`count` chats with one or two images each, every image in `form`."""
    out = []
    for i in range(count):
        content = [image_part(form, f"p{i % 3}.jpg", files),
                   text_part(form, f"What is in picture {i}?")]
        if i % 2:
            content.append(image_part(form, f"p{(i + 1) % 3}.jpg", files))
        answer = {"type": "output_text" if form == "input_image" else "text",
                  "text": f"Answer {i}."}
        out.append({"id": f"c{i}", "messages": [
            {"role": "user", "content": content},
            {"role": "assistant", "content": [answer]}]})
    return out


def video_chats(form: str, files: dict[str, bytes]) -> list[dict]:
    return [{"id": f"v{i}", "messages": [
        {"role": "user", "content": [video_part(form, files),
                                     {"type": "text", "text": f"What happens ({i})?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "It brightens."}]}]}
        for i in range(2)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def reader_of(path: Path, folder: Path, **options: Any):
    return dataset_reader(DatasetSpec([str(path)], "messages", {},
                                      {"image_folder": str(folder), **options}))


def processed(reader, count: int) -> list[dict]:
    """Each record's tokens, targets and vision inputs as the pipeline makes them."""
    decode = DecodeVision(IMAGE)
    tok = TokenizeMultimodal(qwen_tokenizer_dir(), IMAGE.merge_size, 1 << 16)
    tok.setup()
    out = []
    for i in range(count):
        doc = decode.decode(reader.read(0, i))
        ids = tok.tokenize(doc)
        out.append({"tokens": ids["tokens"].tolist(), "targets": ids["targets"].tolist(),
                    "grid": [vp.grid_thw.tolist() for vp in doc["vision"]],
                    "pixels": [vp.pixel_values for vp in doc["vision"]],
                    "video": doc["video"]})
    return out


def assert_same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        for key in ("tokens", "targets", "grid", "video"):
            assert g[key] == w[key], f"record {k}: {key}"
        assert len(g["pixels"]) == len(w["pixels"]) >= 1
        for a, b in zip(g["pixels"], w["pixels"], strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b), f"record {k}: pixels"


@pytest.mark.parametrize("form", ["image_url", "input_image", "anthropic", "anthropic_url"])
def test_an_inline_image_part_gives_the_sample_of_its_file(form, media, tmp_path) -> None:
    folder, files = media["folder"], media["files"]
    want = processed(reader_of(write_jsonl(tmp_path / "file.jsonl", chats("file", files)),
                               folder), 8)
    got = processed(reader_of(write_jsonl(tmp_path / f"{form}.jsonl", chats(form, files)),
                              folder), 8)
    assert_same(got, want)


@pytest.mark.parametrize("form", ["video_url", "video_url_data", "video_data"])
def test_a_video_url_or_video_data_url_gives_the_sample_of_its_file(form, media,
                                                                    tmp_path) -> None:
    folder, files = media["folder"], media["files"]
    want = processed(reader_of(write_jsonl(tmp_path / "file.jsonl",
                                           video_chats("file", files)), folder), 2)
    got = processed(reader_of(write_jsonl(tmp_path / f"{form}.jsonl",
                                          video_chats(form, files)), folder), 2)
    assert want[0]["video"] == [True]
    assert_same(got, want)


def digests(capsys, toml: Path, dp: int) -> list[str]:
    capsys.readouterr()
    assert main(["digest", "--recipe", str(toml), "--dp", str(dp), "--steps", "3",
                 "--runner", "inline"]) == 0
    return [json.loads(line)["sha256"] for line in capsys.readouterr().out.splitlines() if line]


def test_inline_parts_give_the_digests_of_file_references(media, tmp_path, capsys) -> None:
    """A chat file whose images are data URLs, Anthropic sources and ``input_image``
    parts (mixed, record by record) trains on the batches of the same chats naming files."""
    folder, files = media["folder"], media["files"]
    forms = ["image_url", "input_image", "anthropic", "anthropic_url"]
    inline = [chats(forms[i % 4], files, 12)[i] for i in range(12)]
    tables = {}
    for name, records in (("file", chats("file", files, 12)), ("inline", inline)):
        path = write_jsonl(tmp_path / name / "chat.jsonl", records)
        tables[name] = recipe_toml(tmp_path / f"{name}.toml", [
            {"name": "chat", "format": "messages", "files": [str(path)],
             "image_folder": str(folder)}], tokenizer=str(qwen_tokenizer_dir()),
            num_lanes=2, global_batch_size=2)
    want = digests(capsys, tables["file"], 1)
    assert len(want) == 3
    assert digests(capsys, tables["inline"], 1) == want
    assert digests(capsys, tables["inline"], 2) == want


#: a distinctive stretch of base64 text that must never reach a ledger or a message
MARK = "QUFBQUFB"


def _bad_cases(files: dict[str, bytes]) -> dict[str, tuple[dict, str, str]]:
    """key -> (the part, the drop reason, the part's label in the detail)."""
    jpeg = files["p0.jpg"]
    good = b64(jpeg)
    marked = b64(b"AAAAAA" * 40)  # "QUFBQUFB..." : valid base64, not an image
    big = b64(b"\xff" * 150_000)
    anth = {"type": "base64", "media_type": "image/jpeg"}
    return {
        "bad-base64": ({"type": "image_url", "image_url": {
            "url": "data:image/jpeg;base64," + marked[:40] + "!!" + marked[42:]}},
            "bad_data_url", "part 0 (image_url)"),
        "cut-short": ({"type": "image_url", "image_url": {
            "url": "data:image/jpeg;base64," + good[:-1]}}, "bad_data_url",
            "part 0 (image_url)"),
        "line-breaks": ({"type": "image_url", "image_url": {
            "url": "data:image/jpeg;base64," + good[:76] + "\n" + good[76:]}},
            "bad_data_url", "part 0 (image_url)"),
        "no-media-type": ({"type": "image_url", "image_url": {"url": "data:;base64," + marked}},
                          "bad_data_url", "part 0 (image_url)"),
        "no-comma": ({"type": "input_image", "image_url": "data:image/jpeg;base64" + marked},
                     "bad_data_url", "part 0 (input_image)"),
        "html": ({"type": "image_url", "image_url": {"url": "data:text/html;base64," + marked}},
                 "unsupported_data_url", "part 0 (image_url)"),
        "percent-encoded": ({"type": "image_url", "image_url": {
            "url": "data:image/jpeg,%FF%D8%FF" + marked}}, "unsupported_data_url",
            "part 0 (image_url)"),
        "image-as-video": ({"type": "video_url", "video_url": {
            "url": data_url("image/jpeg", jpeg)}}, "unsupported_data_url",
            "part 0 (video_url)"),
        "too-large": ({"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,"
                                                          + big}},
                      "media_too_large", "part 0 (image_url)"),
        "anthropic-no-data": ({"type": "image", "source": anth}, "bad_message_part",
                              "part 0 (image)"),
        "anthropic-file": ({"type": "image", "source": {"type": "file", "file_id": "file_01"}},
                           "bad_message_part", "part 0 (image)"),
        "anthropic-no-media-type": ({"type": "image", "source": {"type": "base64",
                                                                 "data": marked}},
                                    "bad_message_part", "part 0 (image)"),
        "anthropic-html": ({"type": "image", "source": {**anth, "media_type": "text/html",
                                                        "data": marked}},
                           "unsupported_data_url", "part 0 (image)"),
        "anthropic-bad-base64": ({"type": "image", "source": {**anth, "data": marked + "*"}},
                                 "bad_data_url", "part 0 (image)"),
        "anthropic-outside": ({"type": "image", "source": {"type": "url",
                                                           "url": "../outside.jpg"}},
                              "reference_outside_folder", ""),
        "anthropic-foreign": ({"type": "image", "source": {
            "type": "url", "url": "https://images.invalid/x.jpg"}},
            "reference_outside_folder", ""),
        "input-image-file-id": ({"type": "input_image", "file_id": "file-abc"},
                                "bad_message_part", "part 0 (input_image)"),
        "video-url-empty": ({"type": "video_url", "video_url": {}}, "bad_message_part",
                            "part 0 (video_url)"),
        "unknown": ({"type": "input_audio", "input_audio": {"data": marked,
                                                             "format": "wav"}},
                    "bad_message_part", "part 0 (input_audio)"),
        "text-not-str": ({"type": "text", "text": {"value": marked}}, "bad_message_part",
                         "part 0 (text)"),
    }


def _bad_record(key: str, part: dict) -> dict:
    return {"id": key, "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [part, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A thing."}]}]}


def ledger_drops(tmp_path: Path, toml: Path, dp: int, capsys) -> tuple[dict, str]:
    """``key -> (reason, detail)`` of every drop in 12 steps at `dp` ranks, and the text of
    the ledger and of the output."""
    path = tmp_path / f"ledger-d{dp}.jsonl"
    capsys.readouterr()
    assert main(["digest", "--recipe", str(toml), "--dp", str(dp), "--steps", "12",
                 "--runner", "inline", "--ledger", str(path)]) == 0
    text = path.read_text()
    steps = [json.loads(line) for line in text.splitlines()[1:]]
    drops = {d["key"].partition(":")[2]: (d["reason"], d.get("detail", ""))
             for s in steps for d in s.get("drops", [])}
    return drops, text + capsys.readouterr().out


def test_malformed_parts_are_drops_naming_the_part_never_its_payload(media, tmp_path,
                                                                     capsys) -> None:
    folder, files = media["folder"], media["files"]
    (folder.parent / "outside.jpg").write_bytes(files["p0.jpg"])
    cases = _bad_cases(files)
    records = [_bad_record(k, part) for k, (part, _, _) in cases.items()]
    records += chats("anthropic", files, 4)
    path = write_jsonl(tmp_path / "bad" / "chat.jsonl", records)
    toml = recipe_toml(tmp_path / "bad.toml", [
        {"name": "chat", "format": "messages", "files": [str(path)],
         "image_folder": str(folder), "max_image_bytes": 100_000}],
        tokenizer=str(qwen_tokenizer_dir()), num_lanes=2, global_batch_size=2)
    drops, text = ledger_drops(tmp_path, toml, 1, capsys)
    assert {k: r for k, (r, _) in drops.items()} == {k: r for k, (_, r, _) in cases.items()}
    for key, (_, _, label) in cases.items():
        if label:
            assert f"message 1, {label}" in drops[key][1], (key, drops[key])
    assert "150,000 bytes, over max_image_bytes 100,000" in drops["too-large"][1]
    assert MARK not in text and b64(files["p0.jpg"])[100:140] not in text
    again, _ = ledger_drops(tmp_path, toml, 2, capsys)
    assert again == drops  # decisions of the lane: the same at every D


def test_the_decoded_size_is_bounded_before_any_byte_is_decoded(media, tmp_path,
                                                               monkeypatch) -> None:
    """The size a base64 text decodes to is known from its length: a data URL over
    ``max_image_bytes`` is refused without decoding it; one of exactly the bound is read."""
    folder, files = media["folder"], media["files"]
    jpeg = files["p1.jpg"]
    records = [_bad_record("a", {"type": "image_url",
                                 "image_url": {"url": data_url("image/jpeg", jpeg)}}),
               _bad_record("b", {"type": "image", "source": {
                   "type": "base64", "media_type": "image/jpeg", "data": b64(jpeg)}})]
    path = write_jsonl(tmp_path / "chat.jsonl", records)
    fits = reader_of(path, folder, max_image_bytes=len(jpeg))
    assert [fits.read(0, i)["media"][0]["data"] for i in (0, 1)] == [jpeg, jpeg]
    small = reader_of(path, folder, max_image_bytes=len(jpeg) - 1)

    def refuse(*args, **kwargs):
        raise AssertionError("decoded although over the bound")

    monkeypatch.setattr(base64, "b64decode", refuse)
    for i in (0, 1):
        with pytest.raises(BadSampleError) as info:
            small.read(0, i)
        assert info.value.reason == "media_too_large"
        assert f"{len(jpeg):,} bytes, over max_image_bytes {len(jpeg) - 1:,}" \
            in info.value.detail


def test_video_data_urls_are_bounded_by_max_video_bytes(media, tmp_path) -> None:
    folder, files = media["folder"], media["files"]
    clip = files["clip.mp4"]
    path = write_jsonl(tmp_path / "v.jsonl", video_chats("video_url_data", files))
    assert reader_of(path, folder, max_video_bytes=len(clip)).read(0, 0)["media"][0][
        "data"] == clip
    with pytest.raises(BadSampleError) as info:
        reader_of(path, folder, max_video_bytes=len(clip) - 1,
                  max_image_bytes=len(clip) * 2).read(0, 0)
    assert info.value.reason == "media_too_large"
    assert "max_video_bytes" in info.value.detail


def test_other_formats_decode_data_urls_the_same_way(media, tmp_path) -> None:
    """LLaVA and OBELICS records share the media path: a data URL there is the same
    image as its file, and a bad one the same drop (named as the record's image)."""
    from zephon_vl.formats.media_identity import record_refs

    folder, files = media["folder"], media["files"]
    jpeg = files["p2.jpg"]
    conv = [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "That."}]
    llava = tmp_path / "llava.json"
    llava.write_text(json.dumps([
        {"id": "file", "image": "p2.jpg", "conversations": conv},
        {"id": "inline", "image": data_url("image/jpeg", jpeg), "conversations": conv},
        {"id": "html", "image": "data:text/html;base64," + b64(b"<p>x</p>"),
         "conversations": conv}]))
    obelics = write_jsonl(tmp_path / "obelics.jsonl", [
        {"texts": ["Some text.", None], "images": [None, "p2.jpg"]},
        {"texts": ["Some text.", None], "images": [None, data_url("image/png", jpeg)]}])
    for fmt, path in (("llava", llava), ("obelics", obelics)):
        reader = dataset_reader(DatasetSpec([str(path)], fmt, {},
                                            {"image_folder": str(folder)}))
        a, b = reader.read(0, 0), reader.read(0, 1)
        assert a["media"][0]["data"] == b["media"][0]["data"] == jpeg
        decode = DecodeVision(IMAGE)
        assert np.array_equal(decode.decode(a)["vision"][0].pixel_values,
                              decode.decode(b)["vision"][0].pixel_values)
        # the media listing of the checkpoint fingerprint holds files, not base64 text
        assert all(not str(ref).startswith("data:") for ref, _ in record_refs(reader, 0))
    with pytest.raises(BadSampleError) as info:
        dataset_reader(DatasetSpec([str(llava)], "llava", {},
                                   {"image_folder": str(folder)})).read(0, 2)
    assert info.value.reason == "unsupported_data_url"
    assert "text/html" in info.value.detail and "PHA+" not in info.value.detail


def test_parquet_parts_with_null_fields_read_as_their_json(media, tmp_path) -> None:
    """In Parquet every part of a column has every field (``source``, ``image_url``,
    ``text``... null where a part has none): a null field is absent, so a plain image
    part is not read as an Anthropic one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder, files = media["folder"], media["files"]
    records = []
    for i, form in enumerate(["file", "anthropic", "image_url", "file"]):
        record = chats(form, files, 4)[i]
        records.append(record)
    jsonl = write_jsonl(tmp_path / "chat.jsonl", records)
    table = pa.Table.from_pylist(records)
    part = table.schema.field("messages").type.value_type.field("content").type.value_type
    assert {"source", "image", "image_url", "text"} <= {f.name for f in part}
    pq.write_table(table, tmp_path / "chat.parquet")
    want = processed(reader_of(jsonl, folder), 4)
    got = processed(reader_of(tmp_path / "chat.parquet", folder), 4)
    assert_same(got, want)


def test_inline_media_need_no_folder(media, tmp_path) -> None:
    """Records that carry their media (messages with data URLs and Anthropic sources, a
    Parquet ``Image`` whose path is a data URL) are read with no image_folder set."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = media["files"]
    jpeg = files["p0.jpg"]
    chat = write_jsonl(tmp_path / "chat.jsonl",
                       [chats("anthropic", files, 2)[0], chats("image_url", files, 2)[1]])
    reader = dataset_reader(DatasetSpec([str(chat)], "messages"))
    assert reader.read(0, 0)["media"][0]["data"] == jpeg
    assert [m["data"] for m in reader.read(0, 1)["media"]] == [files["p1.jpg"],
                                                                files["p2.jpg"]]
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    text = pa.struct([("user", pa.string()), ("assistant", pa.string())])
    schema = pa.schema([("images", pa.list_(image)), ("texts", pa.list_(text))])
    rows = [{"images": [{"bytes": None, "path": data_url("image/jpeg", jpeg)}],
             "texts": [{"user": "What is it?", "assistant": "A photo."}]}]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "c.parquet")
    parquet = dataset_reader(DatasetSpec([str(tmp_path / "c.parquet")], "parquet"))
    assert parquet.read(0, 0)["media"][0]["data"] == jpeg
