"""Users' own operators for the tests (tests/*/test_user_operators.py), at module level so
worker processes and recipe files import them by path (``tests.helpers.user_ops:cut``)."""

from __future__ import annotations

import numpy as np


def cut(record: dict, *, rng: np.random.Generator, keep: float = 0.5) -> dict:
    """A raw text record with its words cut at a random point (at least `keep` of them):
    randomness that a run at another rank count must repeat exactly."""
    words = record["text"].split()
    n = max(1, int(len(words) * rng.uniform(keep, 1.0)))
    return {**record, "text": " ".join(words[:n])}


def no_sevens(record: dict, *, digit: str = "7") -> bool:
    """Drop the raw records whose text holds `digit` (the test data numbers its documents)."""
    return digit not in record["text"]


def say(record: dict) -> str:
    """A filter with a bug: it returns a string, not True or False."""
    return "yes"


def flat_pixels(image: np.ndarray) -> np.ndarray:
    """A pixels map with a bug: it returns the image flattened to two axes."""
    return image.reshape(image.shape[0], -1)


def caption_words(doc: dict, *, most: int = 12) -> bool:
    """Keep a decoded caption document of at most `most` words (others pass)."""
    return doc.get("kind") != "caption" or len(doc["text"].split()) <= most
