"""Built-in text transforms: read a sample by pointer, tokenize it."""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .errors import BadSampleError, ConfigError
from .operators import Transform, _check_on_error
from .readers import ShardReader
from .records import Element


class Read(Transform):
    """Fetch each sample from its dataset's reader (I/O: threads suit it)."""

    default_runner = "threads"

    def __init__(self, readers: list[ShardReader], name: str = "read", on_error: str = "raise"):
        self.readers = readers
        self.name = name
        self.on_error = _check_on_error(on_error)

    def process_many(self, elements: list[Element]) -> list[Any]:
        return [self.readers[e.payload[0]].read(e.payload[1], e.payload[2]) for e in elements]


@lru_cache(maxsize=16)
def _tokenizer_identity(path: str, mtime_ns: int) -> dict:
    digest = hashlib.sha256()
    root = Path(path)
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(f.relative_to(root).as_posix().encode())
        digest.update(f.read_bytes())
    return {"name": root.name, "sha256": digest.hexdigest()}


def tokenizer_identity(path: str | os.PathLike) -> dict:
    """Name and content hash of a tokenizer folder: what a checkpoint must match."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"tokenizer folder {p} does not exist; build it with "
                          "`zephon-vl tokenizer` or pass a local transformers tokenizer folder")
    return _tokenizer_identity(str(p.resolve()), max(f.stat().st_mtime_ns for f in p.iterdir()))


def load_tokenizer(path: str | os.PathLike) -> Any:
    """A `transformers` tokenizer from a local folder (never from a hub); one per process."""
    return _load_tokenizer(str(Path(path).resolve()))


@lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


class Tokenize(Transform):
    """Text -> token ids with a `transformers` tokenizer loaded from a local path.

    Output payload: ``{"tokens": int32 array}``, EOS appended when `add_eos`.
    What happens to documents longer than the context is the packer's
    `overlong` setting (split, truncate or drop), so it is decided in one place.
    """

    default_runner = "processes"

    def __init__(self, tokenizer_path: str | os.PathLike, text_key: str = "text",
                 add_bos: bool = False, add_eos: bool = True, name: str = "tokenize",
                 on_error: str = "raise") -> None:
        self.tokenizer_path = str(tokenizer_path)
        self.text_key = text_key
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.name = name
        self.on_error = _check_on_error(on_error)
        self._identity = tokenizer_identity(tokenizer_path)
        self._tok: Any = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_tok"] = None
        return state

    def settings(self) -> dict:
        return {"tokenizer": self._identity, "text_key": self.text_key,
                "add_bos": self.add_bos, "add_eos": self.add_eos}

    def setup(self) -> None:
        if self._tok is None:
            self._tok = load_tokenizer(self.tokenizer_path)

    def process_many(self, elements: list[Element]) -> list[Any]:
        self.setup()
        texts = []
        for e in elements:
            text = e.payload.get(self.text_key) if isinstance(e.payload, dict) else None
            if not isinstance(text, str):
                raise BadSampleError("missing_text", _where(e),
                                     f"no string field {self.text_key!r} in the sample")
            texts.append(text)
        ids = self._tok(texts, add_special_tokens=False)["input_ids"]
        bos_id, eos_id = self._tok.bos_token_id, self._tok.eos_token_id
        bos = [bos_id] if self.add_bos and bos_id is not None else []
        eos = [eos_id] if self.add_eos and eos_id is not None else []
        return [{"tokens": np.asarray(bos + t + eos, dtype=np.int32)} for t in ids]


def _where(e: Element) -> str:
    return e.origin.where() if e.origin is not None else "?"


class MinTokens(Transform):
    """Drop documents with fewer than `n` tokens (recorded as ``too_short``)."""

    def __init__(self, n: int, name: str = "min_tokens") -> None:
        self.n = n
        self.name = name

    def settings(self) -> dict:
        return {"n": self.n}

    def process_many(self, elements: list[Element]) -> list[Any]:
        from .records import Dropped

        return [e.payload if len(e.payload["tokens"]) >= self.n else Dropped("too_short")
                for e in elements]
