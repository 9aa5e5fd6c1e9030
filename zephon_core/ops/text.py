"""Text transforms: load a local tokenizer, tokenize documents, drop short ones."""

from __future__ import annotations

import gc
import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from zephon_core.common.system import release_free_heap
from zephon_core.errors import BadSampleError, ConfigError
from zephon_core.ops.contract import Transform, check_on_error
from zephon_core.records import Element


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
    """A tokenizer from a local `transformers` tokenizer folder (never from a hub).

    A folder with ``tokenizer.json`` is loaded straight into the Rust
    `tokenizers` engine that backs transformers' fast tokenizers (same ids,
    and it spares every worker process the multi-second import of
    transformers); other folders go through ``AutoTokenizer``. One per process.
    """
    return _load_tokenizer(str(Path(path).resolve()))


def forget_tokenizers() -> None:
    """Drop this process's cached tokenizers and return their memory to the system.

    A driver loads a tokenizer only to read a few ids while a recipe is built;
    once the transforms that tokenize run in worker processes (each loads its
    own), keeping it would hold hundreds of MB in the driver for nothing.
    """
    _load_tokenizer.cache_clear()
    gc.collect()
    release_free_heap()


@lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> Any:
    if (Path(path) / "tokenizer.json").is_file():
        return FastTokenizer(Path(path))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True, split_special_tokens=True)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


class FastTokenizer:
    """The part of a transformers tokenizer zephon uses, over `tokenizers.Tokenizer`.

    Text is untrusted: a caption that contains ``<|image_pad|>`` or
    ``<|im_start|>`` is tokenized as those characters, never as the control
    tokens (which only the operators insert, by id). That is the engine's
    ``encode_special_tokens`` mode, transformers' ``split_special_tokens``.
    """

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tok.encode_special_tokens = True
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.bos_token_id = self._id(config.get("bos_token"))
        self.eos_token_id = self._id(config.get("eos_token"))
        self.pad_token_id = self._id(config.get("pad_token"))
        self.unk_token_id = self._id(config.get("unk_token"))

    def _id(self, token: Any) -> int | None:
        text = _token_text(token)
        return None if text is None else self._tok.token_to_id(text)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int | None]:
        return [self._tok.token_to_id(t) for t in tokens]

    def __call__(self, texts: str | list[str], add_special_tokens: bool = False) -> dict:
        if isinstance(texts, str):
            return {"input_ids": self._tok.encode(texts, add_special_tokens=add_special_tokens).ids}
        encoded = self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)
        return {"input_ids": [e.ids for e in encoded]}


class TokenizerTransform(Transform):
    """A transform that owns a tokenizer folder: loaded once per process, never pickled."""

    def __init__(self, tokenizer_path: str | os.PathLike) -> None:
        self.tokenizer_path = str(tokenizer_path)
        self._identity = tokenizer_identity(tokenizer_path)
        self._tok: Any = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_tok"] = None
        return state

    def setup(self) -> None:
        if self._tok is None:
            self._tok = load_tokenizer(self.tokenizer_path)

    def unload(self) -> None:
        """Let go of the tokenizer in this process (`setup` loads it again)."""
        self._tok = None


class Tokenize(TokenizerTransform):
    """Text -> token ids with a `transformers` tokenizer loaded from a local path.

    Output payload: ``{"tokens": int32 array}``, EOS appended when `add_eos`.
    What happens to documents longer than the context is the packer's
    `overlong` setting (split, truncate or drop), so it is decided in one place.
    """

    default_runner = "processes"

    def __init__(self, tokenizer_path: str | os.PathLike, text_key: str = "text",
                 add_bos: bool = False, add_eos: bool = True, name: str = "tokenize",
                 on_error: str = "raise") -> None:
        super().__init__(tokenizer_path)
        self.text_key = text_key
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.name = name
        self.on_error = check_on_error(on_error)

    def settings(self) -> dict:
        return {"tokenizer": self._identity, "text_key": self.text_key,
                "add_bos": self.add_bos, "add_eos": self.add_eos}

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
        from zephon_core.records import Dropped

        return [e.payload if len(e.payload["tokens"]) >= self.n else Dropped("too_short")
                for e in elements]
