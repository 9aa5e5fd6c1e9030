"""The samples of the demo data set: photos, crops, captions, conversations, videos.

Every sample draws its randomness from ``(seed, sample index)`` alone, so any
order or split of the work gives the same bytes (see `zephon_vl.demo.data`
for the sample kinds and the build).
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from zephon_core import ConfigError

log = logging.getLogger(__name__)

MIN_SIDE, MAX_SIDE, MAX_ASPECT = 256, 1024, 3.0
KIND_SHARES = {"caption": 0.7, "conversation": 0.2, "interleaved": 0.1}


@dataclass(frozen=True)
class Photo:
    """One skimage photo and what a person would say about it."""

    name: str
    file: str  # in skimage/data; the same pixels as ``skimage.data.<name>()``
    subject: str  # noun phrase: "a cup of coffee on a saucer"
    sentences: tuple[str, ...]
    qa: tuple[tuple[str, str], ...]


def _load_photos() -> tuple[Photo, ...]:
    """The photos and their hand-written descriptions, from ``captions.json`` beside this module."""
    raw = json.loads(resources.files(__package__).joinpath("captions.json").read_text("utf-8"))
    return tuple(Photo(p["name"], p["file"], p["subject"], tuple(p["sentences"]),
                       tuple((q, a) for q, a in p["qa"])) for p in raw)


PHOTOS: tuple[Photo, ...] = _load_photos()
# Colour photos large enough to pan and zoom over for the video samples.
VIDEO_PHOTOS = (
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "hubble_deep_field",
    "retina",
    "immunohistochemistry",
    "motorcycle_left",
)


@cache
def _pixels(photo: Photo) -> Any:
    """The photo as a PIL image (RGB or L), read from skimage's bundled files.

    Read with PIL rather than ``skimage.data.<name>()``: same pixels, without
    importing skimage.io and scipy (seconds per worker process).
    """
    import skimage.data
    from PIL import Image

    with Image.open(Path(skimage.data.__file__).parent / photo.file) as f:
        img = f.convert("RGB") if f.mode not in ("RGB", "L") else f
        if photo.name == "horse":  # skimage thresholds this clip-art silhouette to black/white
            img = img.convert("L").point(lambda v: 255 if v > 127 else 0)
        # Pixels only: an ICC profile or other info of the file would be copied into every JPEG.
        return Image.fromarray(np.asarray(img))


def _require_skimage() -> None:
    """The photos ship inside scikit-image, which comes with the `[demo]` extra."""
    try:
        import skimage.data  # noqa: F401
    except ImportError:
        raise ConfigError("the demo data set is made from scikit-image's photos: "
                          "pip install 'zephon-vl[demo]'") from None


@cache
def _available() -> tuple[Photo, ...]:
    """The photos this skimage install has offline (some need optional downloads)."""
    ok = []
    for p in PHOTOS:
        try:
            _pixels(p)
            ok.append(p)
        except Exception as e:  # a missing data file, not a bug of ours
            log.warning("skimage photo %s unavailable (%s); skipped", p.name, e)
    if not ok:
        raise RuntimeError("no skimage photo could be loaded; is scikit-image installed?")
    return tuple(ok)


def _rng(seed: int, index: int) -> np.random.Generator:
    # Randomness from (seed, sample) identity alone: any order or split gives the same bytes.
    return np.random.default_rng([seed, index])


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


# -- images -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Crop:
    photo: Photo
    src_w: int
    src_h: int
    box: tuple[float, float, float, float]
    w: int
    h: int

    @property
    def area_pct(self) -> int:
        x0, y0, x1, y1 = self.box
        return round(100 * (x1 - x0) * (y1 - y0) / (self.src_w * self.src_h))

    @property
    def scale(self) -> float:
        return self.w / (self.box[2] - self.box[0])

    @property
    def region(self) -> str:
        x0, y0, x1, y1 = self.box
        if self.area_pct >= 85:
            return "nearly all"
        cx, cy = (x0 + x1) / 2 / self.src_w, (y0 + y1) / 2 / self.src_h
        v = ("upper", "middle", "lower")[min(2, int(cy * 3))]
        h = ("left", "centre", "right")[min(2, int(cx * 3))]
        return {
            "middle centre": "centre",
            "middle left": "left side",
            "middle right": "right side",
            "upper centre": "top",
            "lower centre": "bottom",
        }.get(f"{v} {h}", f"{v} {h} part")


def _random_crop(rng: np.random.Generator, photo: Photo) -> _Crop:
    """Output size log-uniform per side in [256, 1024]; crop 30-100% of the largest fitting box."""
    src = _pixels(photo)
    sw, sh = src.size
    while True:
        w, h = (
            int(round(np.exp(rng.uniform(np.log(MIN_SIDE), np.log(MAX_SIDE))))) for _ in range(2)
        )
        if max(w, h) / min(w, h) <= MAX_ASPECT:
            break
    aspect = w / h
    bw = min(sw, sh * aspect)
    frac = np.sqrt(rng.uniform(0.3, 1.0))
    cw, ch = bw * frac, bw * frac / aspect
    x0 = rng.uniform(0, sw - cw)
    y0 = rng.uniform(0, sh - ch)
    return _Crop(photo, sw, sh, (x0, y0, x0 + cw, y0 + ch), w, h)


def _jpeg(crop: _Crop) -> bytes:
    from PIL import Image

    img = _pixels(crop.photo).resize((crop.w, crop.h), Image.Resampling.BICUBIC, box=crop.box)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _pick(rng: np.random.Generator, items: tuple[Any, ...] | list[Any], k: int) -> list[Any]:
    """k items in their original order (descriptions read better in order)."""
    idx = sorted(rng.choice(len(items), size=min(k, len(items)), replace=False))
    return [items[i] for i in idx]


def _crop_sentence(rng: np.random.Generator, c: _Crop) -> str:
    s = c.scale
    if s > 1.05:
        scaled = f"enlarged {s:.1f} times"
    elif s < 0.95:
        scaled = f"reduced to {round(100 * s)} percent of its size"
    else:
        scaled = "kept at about its original scale"
    where = "nearly all of the photo" if c.region == "nearly all" else f"the {c.region}"
    templates = (
        f"This crop covers {where} of the {c.src_w} by {c.src_h} original, about "
        f"{c.area_pct} percent of its area, {scaled} to {c.w} by {c.h} pixels.",
        f"The frame is {c.w} pixels wide and {c.h} pixels tall, cut from {where} of the "
        f"original and {scaled}.",
        f"It is a {c.w}x{c.h} crop taken from {where} of the picture and {scaled}.",
    )
    return templates[rng.integers(len(templates))]


def _caption(rng: np.random.Generator, c: _Crop) -> str:
    p = c.photo
    openings = (
        f"{_cap(p.subject)}.",
        f"This image shows {p.subject}.",
        f"A cropped view of {p.subject}.",
        # Not "a photograph of a fundus photograph" or "of the black silhouette".
        *(
            ()
            if any(w in p.subject for w in ("photograph", "silhouette"))
            else (f"A photograph of {p.subject}.",)
        ),
    )
    body = _pick(rng, p.sentences, int(rng.integers(1, 4)))
    parts = [openings[rng.integers(len(openings))], *body, _crop_sentence(rng, c)]
    while len(" ".join(parts).split()) > 80 and len(parts) > 3:
        parts.pop(-2)
    return " ".join(parts)


# -- sample kinds ---------------------------------------------------------------------------


def _caption_sample(rng: np.random.Generator, photos: tuple[Photo, ...]) -> dict[str, Any]:
    crop = _random_crop(rng, photos[rng.integers(len(photos))])
    return {"jpg": _jpeg(crop), "txt": _caption(rng, crop)}


def _conversation_sample(rng: np.random.Generator, photos: tuple[Photo, ...]) -> dict[str, Any]:
    crop = _random_crop(rng, photos[rng.integers(len(photos))])
    p = crop.photo
    pairs = list(p.qa) + [
        ("How large is this image?", f"It is {crop.w} pixels wide and {crop.h} pixels tall."),
        (
            "Describe the image in a few sentences.",
            " ".join([f"It shows {p.subject}.", *_pick(rng, p.sentences, 2)]),
        ),
    ]
    turns = _pick(rng, pairs, int(rng.integers(1, 3)))
    rng.shuffle(turns)
    conv = []
    for k, (q, a) in enumerate(turns):
        conv.append({"role": "user", "content": ("<image>\n" if k == 0 else "") + q})
        conv.append({"role": "assistant", "content": a})
    return {"jpg": _jpeg(crop), "json": {"conversations": conv}}


def _interleaved_sample(rng: np.random.Generator, photos: tuple[Photo, ...]) -> dict[str, Any]:
    n = int(rng.integers(2, 4))
    chosen = [photos[i] for i in rng.choice(len(photos), size=min(n, len(photos)), replace=False)]
    sample: dict[str, Any] = {}
    text: list[str | None] = []
    if rng.random() < 0.7:
        subjects = ", ".join(p.subject for p in chosen[:-1]) + f" and {chosen[-1].subject}"
        text.append(f"This short photo essay looks at {len(chosen)} pictures: {subjects}.")
    for k, p in enumerate(chosen):
        if k and rng.random() < 0.5:
            text.append(f"The next picture shows {p.subject}.")
        text.append(None)
        sample[f"{k}.jpg"] = _jpeg(_random_crop(rng, p))
        text.append(" ".join(_pick(rng, p.sentences, int(rng.integers(2, 4)))))
    sample["json"] = {"text": text}
    return sample


def _video_sample(rng: np.random.Generator, photos: tuple[Photo, ...]) -> dict[str, Any]:
    from PIL import Image

    from zephon_vl.testing.video import encode_test_video

    names = [p for p in photos if p.name in VIDEO_PHOTOS] or list(photos)
    p = names[rng.integers(len(names))]
    src = _pixels(p).convert("RGB")
    sw, sh = src.size
    fps = int(rng.choice([8, 10, 12]))
    dur = float(rng.choice([2.0, 2.5, 3.0]))
    frames_n = int(round(fps * dur))
    bw = min(sw, sh * 4 / 3)  # largest 4:3 box
    motion = ("pans across", "zooms into", "zooms out of")[rng.integers(3)]
    if motion == "pans across":
        w0 = w1 = bw * rng.uniform(0.5, 0.7)
        (ax, ay), (bx, by) = rng.uniform(0, 1, size=(2, 2))
    else:
        small, big = bw * rng.uniform(0.35, 0.55), bw * rng.uniform(0.85, 1.0)
        w0, w1 = (big, small) if motion == "zooms into" else (small, big)
        ax, ay = rng.uniform(0.2, 0.8, size=2)
        bx, by = ax, ay
    def frames() -> Iterator[np.ndarray]:
        for f in range(frames_n):
            t = f / max(1, frames_n - 1)
            bwt = w0 + (w1 - w0) * t
            bht = bwt * 3 / 4
            x = (ax + (bx - ax) * t) * (sw - bwt)
            y = (ay + (by - ay) * t) * (sh - bht)
            img = src.resize((320, 240), Image.Resampling.BILINEAR, box=(x, y, x + bwt, y + bht))
            yield np.asarray(img)

    mp4 = encode_test_video(frames(), fps, crf=28, preset="fast")
    txt = " ".join(
        [
            f"A {dur:g}-second clip at {fps} frames per second that slowly {motion} a photo of "
            f"{p.subject}.",
            *_pick(rng, p.sentences, int(rng.integers(1, 3))),
        ]
    )
    return {"mp4": mp4, "txt": txt}


_MAKERS = {
    "caption": _caption_sample,
    "conversation": _conversation_sample,
    "interleaved": _interleaved_sample,
    "video": _video_sample,
}


def _kinds(num_samples: int, videos: int, seed: int) -> list[str]:
    """Exact shares of each kind (at least one of each when there is room), shuffled by seed."""
    counts = {k: int(round(share * num_samples)) for k, share in KIND_SHARES.items()}
    for k in ("conversation", "interleaved"):
        if counts[k] == 0 and num_samples >= 3:
            counts[k] = 1
    counts["caption"] = num_samples - counts["conversation"] - counts["interleaved"]
    kinds = [k for k, n in counts.items() for _ in range(n)] + ["video"] * videos
    np.random.default_rng([seed, 0x6B696E64]).shuffle(kinds)
    return kinds


def _make(job: tuple[str, int, int]) -> dict[str, Any]:
    kind, index, seed = job
    sample = _MAKERS[kind](_rng(seed, index), _available())
    sample["__key__"] = f"{index:06d}"
    return sample


def _samples(kinds: list[str], seed: int, workers: int) -> Iterator[dict[str, Any]]:
    """Samples in key order; made in `workers` processes (same bytes: randomness is per sample)."""
    jobs = [(kind, i, seed) for i, kind in enumerate(kinds)]
    if workers <= 1 or len(jobs) < 200:  # a pool costs more than it saves on small builds
        yield from map(_make, jobs)
        return
    # spawn, not fork: the caller may be a training process with threads.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        yield from pool.map(_make, jobs, chunksize=16)
