"""Write the MDS and LitData test datasets of tests/vl/test_container_formats_b.py.

The readers of formats ``mds`` and ``litdata`` are zephon's own; their test data
are written by the libraries themselves, so the tests read what those write.
Neither library installs beside zephon's pinned torch, so run this in a plain
virtual environment of its own and commit what it writes::

    python -m venv /tmp/fixtures-venv
    /tmp/fixtures-venv/bin/pip install mosaicml-streaming litdata pillow numpy
    /tmp/fixtures-venv/bin/python scripts/make_container_fixtures.py

It (re)writes tests/vl/fixtures/containers/: ``images/`` (tiny synthetic images,
JPEG and PNG), ``llava.json`` (every record as a LLaVA record naming those
files: the reference the tests compare with) and one dataset folder per case:

- ``mds-jpeg``: ``id`` str, ``image`` jpeg, ``conversations`` json (LLaVA turns);
- ``mds-png``: ``key`` str, ``picture`` png, ``chat`` str (JSON messages), renamed;
- ``mds-pil``: ``id`` str, ``images`` list[pil] (raw pixels), ``conversations`` json;
- ``mds-bytes``: ``id`` str, ``image`` bytes, ``conversations`` str;
- ``mds-path``: ``id`` str, ``image`` str (a path under ``images/``), ``conversations`` json;
- ``litdata-jpeg``: a dict of ``id``, ``image`` (a JPEG image), ``conversations`` (str);
- ``litdata-chat``: a dict of ``id``, ``image`` (a PNG image: raw pixels),
  ``messages`` (str, JSON messages).

Shards are small (several per dataset) so that lanes and ranks split them.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image

OUT = Path(__file__).resolve().parents[1] / "tests" / "vl" / "fixtures" / "containers"
RECORDS = 16
#: shard size limits small enough for several shards a dataset
LIMITS = {"jpeg": 3000, "path": 1000}
IMAGES = 6


def make_images(folder: Path) -> list[str]:
    """`IMAGES` synthetic 28x24 images, odd ones JPEG, even ones PNG: their file names."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(7)
    names = []
    for k in range(IMAGES):
        y, x = np.mgrid[0:24, 0:28]
        base = np.stack([x * 6 + 20 * k, y * 7, (x + y) * 3 + 40 * k], axis=-1) % 256
        noise = rng.integers(0, 6, size=base.shape)
        image = Image.fromarray(((base + noise) % 256).astype(np.uint8), "RGB")
        name = f"img-{k}.{'jpg' if k % 2 else 'png'}"
        image.save(folder / name, quality=90) if k % 2 else image.save(folder / name)
        names.append(name)
    return names


def conversation(i: int) -> list[dict]:
    """LLaVA turns of record `i`: placeholders, none, several turns, and bad ones."""
    q, a = f"What pattern is in picture {i}?", f"Stripes, number {i}."
    kind = i % 4
    if i == 5:  # two placeholders, one image
        return [{"from": "human", "value": "<image><image> two?"}, {"from": "gpt", "value": a}]
    if i == 9:
        return [{"from": "narrator", "value": q}, {"from": "gpt", "value": a}]
    if i == 13:
        return [{"from": "human", "value": f"<image>{q}"}]
    if kind == 0:
        return [{"from": "human", "value": f"<image>\n{q}"}, {"from": "gpt", "value": a}]
    if kind == 1:  # no placeholder: the image goes before the first human text
        return [{"from": "system", "value": "Answer briefly."}, {"from": "human", "value": q},
                {"from": "gpt", "value": a}]
    if kind == 2:
        return [{"from": "human", "value": f"<image>{q}"}, {"from": "gpt", "value": a},
                {"from": "human", "value": "And the colours?"},
                {"from": "gpt", "value": "Warm ones."}]
    return [{"from": "human", "value": f"Look: <image> {q}"}, {"from": "gpt", "value": a}]


def messages(turns: list[dict]) -> list[dict]:
    """LLaVA turns as role/content-part messages, ``<image>`` an image part (or, where
    no turn has one, an image part opening the first human turn, as LLaVA reads it)."""
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    out = []
    placed = any("<image>" in t["value"] for t in turns)  # else before the first human text
    for t in turns:
        parts: list[dict] = []
        if not placed and t["from"] == "human":
            parts.append({"type": "image"})
            placed = True
        for j, chunk in enumerate(t["value"].split("<image>")):
            if j:
                parts.append({"type": "image"})
            if chunk:
                parts.append({"type": "text", "text": chunk})
        out.append({"role": roles.get(t["from"], t["from"]), "content": parts})
    return out


def records(names: list[str]) -> list[dict]:
    return [{"id": f"rec{i:02d}", "image": names[i % len(names)],
             "conversations": conversation(i)} for i in range(RECORDS)]


def write_mds(recs: list[dict], folder: Path) -> None:
    from streaming import MDSWriter

    images = folder / "images"
    cases = {
        "mds-jpeg": ({"id": "str", "image": "jpeg", "conversations": "json"}, "jpeg"),
        "mds-png": ({"key": "str", "picture": "png", "chat": "str"}, "png"),
        "mds-pil": ({"id": "str", "images": "list[pil]", "conversations": "json"}, "pil"),
        "mds-bytes": ({"id": "str", "image": "bytes", "conversations": "str"}, "bytes"),
        "mds-path": ({"id": "str", "image": "str", "conversations": "json"}, "path"),
    }
    for name, (columns, kind) in cases.items():
        limit = LIMITS.get(kind, 1 << 13)
        with MDSWriter(out=str(folder / name), columns=columns, size_limit=limit,
                       hashes=["sha1", "xxh64"]) as out:
            for r in recs:
                if kind == "jpeg" and not r["image"].endswith(".jpg"):
                    continue  # the jpeg encoding keeps a JPEG file's own bytes only
                out.write(mds_sample(name, kind, r, images / r["image"]))


def mds_sample(name: str, kind: str, r: dict, path: Path) -> dict:
    if kind == "bytes":
        value: object = path.read_bytes()
    elif kind == "path":
        value = r["image"]
    elif kind == "pil":
        value = Image.open(path).convert("RGB")
    else:
        value = Image.open(path)
    if name == "mds-png":
        return {"key": r["id"], "picture": value,
                "chat": json.dumps(messages(r["conversations"]))}
    turns = r["conversations"]
    if kind == "pil":
        return {"id": r["id"], "images": [value], "conversations": turns}
    return {"id": r["id"], "image": value,
            "conversations": json.dumps(turns) if kind == "bytes" else turns}


def litdata_item(case: str) -> object:
    """The `optimize` function of a LitData case (a module-level function: it is pickled)."""
    def item(r: dict) -> dict:
        path = OUT / "images" / r["image"]
        if case == "litdata-jpeg":
            return {"id": r["id"], "image": Image.open(path),
                    "conversations": json.dumps(r["conversations"])}
        return {"id": r["id"], "image": Image.open(path).convert("RGB"),
                "messages": json.dumps(messages(r["conversations"]))}
    return item


def jpeg_item(r: dict) -> dict:
    return litdata_item("litdata-jpeg")(r)


def chat_item(r: dict) -> dict:
    return litdata_item("litdata-chat")(r)


def write_litdata(recs: list[dict], folder: Path) -> None:
    import litdata

    for name, fn, want in (("litdata-jpeg", jpeg_item, ".jpg"),
                           ("litdata-chat", chat_item, "")):
        inputs = [r for r in recs if r["image"].endswith(want)]
        litdata.optimize(fn=fn, inputs=inputs, output_dir=str(folder / name), chunk_size=3,
                         num_workers=1, mode="overwrite")


def main() -> int:
    if OUT.exists():
        shutil.rmtree(OUT)
    names = make_images(OUT / "images")
    recs = records(names)
    (OUT / "llava.json").write_text(json.dumps(recs, indent=1) + "\n")
    write_mds(recs, OUT)
    write_litdata(recs, OUT)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({total} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
