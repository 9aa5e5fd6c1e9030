"""Data sets in users' formats (LLaVA JSON, the_cauldron Parquet, OBELICS, messages),
made from skimage's real photos, and the recipe files that read them."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from zephon_vl.demo.samples import PHOTOS

#: the records of each data set that must be dropped, by key, with the reason
Drops = dict[str, str]


def photos(count: int, seed: int = 0) -> list[tuple[str, bytes, list[tuple[str, str]]]]:
    """`count` JPEG crops of skimage photos: (file stem, bytes, the photo's Q&A pairs)."""
    import skimage.data
    from PIL import Image

    folder = Path(skimage.data.__file__).parent
    rng = np.random.default_rng(seed)
    out = []
    usable = [p for p in PHOTOS if (folder / p.file).is_file()]
    for k in range(count):
        p = usable[k % len(usable)]
        with Image.open(folder / p.file) as im:
            im = im.convert("RGB")
            w, h = im.size
            cw, ch = int(w * rng.uniform(0.4, 1.0)), int(h * rng.uniform(0.4, 1.0))
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            crop = im.crop((x, y, x + cw, y + ch))
            crop.thumbnail((320, 320))
            buf = io.BytesIO()
            crop.save(buf, "JPEG", quality=85)
        out.append((f"{p.name}-{k}", buf.getvalue(), [tuple(qa) for qa in p.qa]))
    return out


def write_images(folder: Path, count: int, seed: int = 0) -> list[tuple[str, list]]:
    """`count` photos under `folder` as ``<stem>.jpg``: (relative path, Q&A pairs)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for stem, data, qa in photos(count, seed):
        (folder / f"{stem}.jpg").write_bytes(data)
        out.append((f"{stem}.jpg", qa))
    return out


def write_llava(root: Path, records: int = 40) -> tuple[Path, Path, Drops]:
    """A LLaVA JSON list with its image folder: single images, shared images, two-image
    records, records without a placeholder, text-only ones, and a few bad records."""
    images = write_images(root / "images", 12)
    out: list[dict[str, Any]] = []
    drops: Drops = {}
    for i in range(records):
        path, qa = images[i % len(images)]  # several records share each image
        q, a = qa[i % len(qa)]
        rid = f"rec{i:03d}"
        kind = i % 5
        if kind == 0:
            conv = [{"from": "human", "value": f"<image>\n{q}"}, {"from": "gpt", "value": a}]
            out.append({"id": rid, "image": path, "conversations": conv})
        elif kind == 1:  # no placeholder: the image goes before the first human turn
            conv = [{"from": "system", "value": "Answer briefly."},
                    {"from": "human", "value": q}, {"from": "gpt", "value": a},
                    {"from": "human", "value": "Anything else?"},
                    {"from": "gpt", "value": "No."}]
            out.append({"id": rid, "image": path, "conversations": conv})
        elif kind == 2:  # two images, placed where their placeholders are
            other, _ = images[(i + 5) % len(images)]
            conv = [{"from": "human", "value": f"First <image> then <image>. {q}"},
                    {"from": "gpt", "value": a}]
            out.append({"id": rid, "image": [path, other], "conversations": conv})
        elif kind == 3:  # text only
            out.append({"id": rid, "conversations": [{"from": "human", "value": q},
                                                     {"from": "gpt", "value": a}]})
        else:
            conv = [{"from": "human", "value": f"<image>{q}"}, {"from": "gpt", "value": a},
                    {"from": "human", "value": "And the colours?"},
                    {"from": "gpt", "value": "Natural ones."}]
            out.append({"id": rid, "image": path, "conversations": conv})
    bad = [
        ({"id": "bad-count", "image": images[0][0], "conversations": [
            {"from": "human", "value": "<image><image> two?"},
            {"from": "gpt", "value": "one"}]}, "placeholder_mismatch"),
        ({"id": "bad-file", "image": "nowhere/missing.jpg", "conversations": [
            {"from": "human", "value": "<image> what?"}, {"from": "gpt", "value": "x"}]},
         "missing_media"),
        ({"id": "bad-role", "conversations": [
            {"from": "narrator", "value": "hi"}, {"from": "gpt", "value": "x"}]}, "bad_role"),
        ({"id": "bad-noanswer", "conversations": [{"from": "human", "value": "hi"}]},
         "no_assistant_turn"),
    ]
    for k, (rec, reason) in enumerate(bad):
        out.insert(3 + 7 * k, rec)
        drops[rec["id"]] = reason
    path = root / "llava.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False))
    return path, root / "images", drops


def write_cauldron(root: Path, rows: int = 40, row_group: int = 8) -> tuple[Path, Drops]:
    """the_cauldron's layout through `datasets` itself: ``images`` a ``Sequence(Image())``,
    ``texts`` a list of ``{user, assistant, source}``; small row groups. Row 9 lacks its
    answer (a ``bad_record`` drop, named by its row)."""
    import datasets

    pics = photos(10, seed=1)
    images, texts = [], []
    for i in range(rows):
        n = 1 + i % 3 if i % 7 else 0  # 0 to 3 images a row
        chosen = [pics[(i + j) % len(pics)] for j in range(n)]
        images.append([{"bytes": data, "path": f"{stem}.jpg"} for stem, data, _ in chosen])
        qa = (chosen[0][2] if chosen else pics[i % len(pics)][2])
        texts.append([{"user": q, "assistant": None if i == 9 else a, "source": "skimage"}
                      for q, a in qa[: 1 + i % 2]])
    features = datasets.Features({
        "images": datasets.Sequence(datasets.Image()),
        "texts": [{"user": datasets.Value("string"), "assistant": datasets.Value("string"),
                   "source": datasets.Value("string")}],
    })
    ds = datasets.Dataset.from_dict({"images": images, "texts": texts}, features=features)
    path = root / "cauldron.parquet"
    ds.to_parquet(str(path), batch_size=row_group)
    return path, {"9": "bad_record"}


def write_obelics(root: Path, docs: int = 30) -> tuple[Path, Path, Drops]:
    """OBELICS's own ``texts``/``images`` parallel lists, one document a JSON line;
    document 5 has a position with neither text nor image (``bad_record``)."""
    images = write_images(root / "web", 8, seed=2)
    lines = []
    for i in range(docs):
        texts: list[str | None] = [f"Document {i} opens with a short paragraph."]
        refs: list[str | None] = [None]
        for j in range(i % 3):
            path, qa = images[(i + j) % len(images)]
            texts += [None, qa[0][1]]
            refs += [path, None]
        if i == 5:
            texts.append(None)
            refs.append(None)
        lines.append(json.dumps({"texts": texts, "images": refs, "url": f"https://e/{i}"}))
    path = root / "obelics.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, root / "web", {"5": "bad_record"}


def write_messages(root: Path, records: int = 20) -> tuple[Path, Path]:
    """Chats as role/content-part lists with image parts naming their files."""
    images = write_images(root / "pics", 6, seed=3)
    lines = []
    for i in range(records):
        path, qa = images[i % len(images)]
        q, a = qa[0]
        content: list[dict] = [{"type": "image", "image": path}, {"type": "text", "text": q}]
        if i % 2:
            content.append({"type": "image", "image": images[(i + 1) % len(images)][0]})
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": content},
            {"role": "assistant", "content": [{"type": "text", "text": a}]}]}))
    path = root / "messages.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, root / "pics"


def format_datasets(root: Path) -> dict[str, tuple[dict[str, Any], Drops]]:
    """Each record format's test data under `root`, as a ``[[datasets]]`` table (name,
    format, files, image folder) with the drops its bad records must give."""
    llava, images, drops = write_llava(root / "llava")
    cauldron, cauldron_drops = write_cauldron(root / "cauldron")
    obelics, web, obelics_drops = write_obelics(root / "obelics")
    messages, pics = write_messages(root / "messages")
    return {
        "llava": ({"name": "llava", "format": "llava", "files": [str(llava)],
                   "image_folder": str(images)}, drops),
        "parquet": ({"name": "cauldron", "format": "parquet", "files": [str(cauldron)]},
                    cauldron_drops),
        "obelics": ({"name": "web", "format": "obelics", "files": [str(obelics)],
                     "image_folder": str(web)}, obelics_drops),
        "messages": ({"name": "chat", "format": "messages", "files": [str(messages)],
                      "image_folder": str(pics)}, {}),
    }


def recipe_toml(path: Path, datasets: list[dict[str, Any]], **keys: Any) -> Path:
    """A ``kind = "vlm"`` recipe file over `datasets` (tables of [[datasets]])."""
    top = {"kind": "vlm", "seq_len": 1024, "global_batch_size": 8, "num_lanes": 4,
           "max_images": 6, "shuffle_buffer": 8, **keys}
    lines = [f"{k} = {json.dumps(v)}" for k, v in top.items()]
    lines += ["[image]", "max_pixels = 50176"]
    for d in datasets:
        lines.append("[[datasets]]")
        for k, v in d.items():
            if isinstance(v, dict):
                lines.append(f"{k} = {{ " + ", ".join(f"{a} = {json.dumps(b)}"
                                                      for a, b in v.items()) + " }")
            else:
                lines.append(f"{k} = {json.dumps(v)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def damage_row_group(path: Path, group: int, how: str = "header", column: int = 1) -> None:
    """Overwrite bytes inside row group `group`'s column chunk `column` of a Parquet file,
    footer untouched: ``header`` garbles its first page header (pyarrow: "Couldn't
    deserialize thrift"), ``data`` 16 bytes in the middle of its pages (a string column:
    "Invalid or truncated PLAIN-encoded BYTE_ARRAY data", or invalid UTF-8). The other row
    groups still decode, and the footer still reads: the damage is that group's alone."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    chunk = meta.row_group(group).column(column)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    at = start if how == "header" else start + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[at:at + (8 if how == "header" else 16)] = b"\xff" * (8 if how == "header" else 16)
    path.write_bytes(bytes(data))
    pf = pq.ParquetFile(path)
    assert pf.metadata.num_row_groups == meta.num_row_groups, "the footer must stay intact"
    for g in range(meta.num_row_groups):
        if g != group:
            pf.read_row_group(g).validate(full=True)


def digest_lines(capsys, args: list[str]) -> list[dict]:
    """`zephon-vl digest` (inline unless `args` say otherwise) run in process: its JSON lines."""
    from zephon_vl.cli.main import main

    capsys.readouterr()
    assert main(["digest", "--runner", "inline", *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]


def digests_across_d_and_resume(capsys, toml: Path, pool: list[str]) -> list[dict]:
    """The 4 steps of recipe file `toml` at D = 1, at D = 2 (with `pool`'s execution flags)
    and at D = 4 saved after step 2 and resumed at D = 2: asserts every run gives D = 1's
    digests; returns D = 1's lines."""
    runs = {1: digest_lines(capsys, ["--recipe", str(toml), "--steps", "4"])}
    runs[2] = digest_lines(capsys, ["--recipe", str(toml), "--dp", "2", "--steps", "4", *pool])
    resumed = digest_lines(capsys, ["--recipe", str(toml), "--dp", "4", "--steps", "4",
                                    "--save-at", "2", "--resume-dp", "2"])
    runs[4] = [r for r in resumed if r["phase"] == "run"]
    after = [r for r in resumed if r["phase"] != "run"]
    want = [r["sha256"] for r in runs[1]]
    assert len(want) == 4
    for d in (2, 4):
        assert [r["sha256"] for r in runs[d]] == want, f"D={d}"
    assert [r["step"] for r in after] == [2, 3]
    assert [r["sha256"] for r in after] == want[2:]
    return runs[1]
