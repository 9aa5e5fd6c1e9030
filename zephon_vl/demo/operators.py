"""The worked examples of docs/operators.md: users' own operators, importable by path.

Each is a plain function a recipe names by import path (``call =
"zephon_vl.demo.operators:min_side"``) or wraps in `zephon_core.UserOp`; a test
runs every one of them in a recipe (tests/vl/test_user_operators.py).

- `min_side`: a ``pixels`` filter, drops a sample whose image is too small.
- `clean_caption`: a ``decode`` map, tidies caption text (markup, URLs, spaces), and
  drops a sample whose caption is left empty.
- `random_resized_crop`: a ``pixels`` map, a random crop of a random area and
  aspect ratio; the recipe's resize rule then fits the crop to the patch grid.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from zephon_core import Dropped

_TAG = re.compile(r"<[^>]{1,200}>")
_URL = re.compile(r"https?://\S+")
_SPACES = re.compile(r"\s+")


def min_side(image: np.ndarray, *, min_side: int = 64) -> bool:
    """Keep an image whose shorter side has at least `min_side` pixels (as decoded, before
    the resize to the patch grid). Use as ``kind = "filter"``, ``after = "pixels"``."""
    return min(image.shape[0], image.shape[1]) >= min_side


def clean_caption(doc: dict, *, max_chars: int = 2000) -> dict | Dropped:
    """A caption without HTML tags and URLs, its whitespace collapsed, cut at `max_chars`
    characters; a caption left empty drops the sample (``empty_caption``). Other
    documents (chats, interleaved pages) pass unchanged. Use after ``decode``."""
    if doc.get("kind") != "caption":
        return doc
    text = _SPACES.sub(" ", _URL.sub(" ", _TAG.sub(" ", doc["text"]))).strip()
    if not text:
        return Dropped("empty_caption", "nothing left after removing markup and URLs")
    return {**doc, "text": text[:max_chars]}


def random_resized_crop(image: np.ndarray, *, rng: np.random.Generator,
                        scale: Sequence[float] = (0.5, 1.0),
                        ratio: Sequence[float] = (3 / 4, 4 / 3),
                        tries: int = 10) -> np.ndarray:
    """A crop covering a random share `scale` of the image's area with a random aspect
    ratio (width / height, log-uniform in `ratio`), at a random place; after `tries`
    crops that do not fit, the centre crop of the nearest ratio. `rng` is the sample's
    own generator, so the crop is the same at every rank count. Use after ``pixels``."""
    h, w = image.shape[:2]
    area = h * w
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(tries):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(lo, hi))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 1 <= cw <= w and 1 <= ch <= h:
            y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            return image[y:y + ch, x:x + cw]
    aspect = min(max(w / h, ratio[0]), ratio[1])
    cw, ch = (min(w, round(h * aspect)), h) if w / h > aspect else (w, min(h, round(w / aspect)))
    y, x = (h - ch) // 2, (w - cw) // 2
    return image[y:y + ch, x:x + cw]
