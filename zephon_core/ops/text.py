"""Text transforms: load a local tokenizer, tokenize documents, drop short ones."""

from __future__ import annotations

import gc
import hashlib
import json
import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from zephon_core.common.deprecation import moved_keywords
from zephon_core.common.system import release_free_heap
from zephon_core.errors import BadSampleError, ConfigError
from zephon_core.ops.chat import ChatFraming, chat_pieces, chatml_turn, record_turns
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
        tokenizer: Any = FastTokenizer(Path(path))
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True,
                                                  split_special_tokens=True)
    # parsing tokenizer.json frees more than the tokenizer keeps (176 MB of 248 for the
    # bundled Qwen vocabulary), and glibc keeps freed pages resident: every forked worker
    # would share them and every spawned one hold its own
    release_free_heap()
    return tokenizer


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


class FastTokenizer:
    """The part of a transformers tokenizer zephon uses, over `tokenizers.Tokenizer`.

    Every method and attribute that shares a name with transformers'
    ``PreTrainedTokenizerFast`` behaves as that one does on the same folder loaded with
    ``AutoTokenizer.from_pretrained(path, split_special_tokens=True)``: the same ids,
    types and defaults (``tests/core/test_tokenizer_conventions.py`` compares them).
    That one flag is on purpose: text is untrusted, so a caption that contains
    ``<|image_pad|>`` or ``<|im_start|>`` is tokenized as those characters, never as the
    control tokens (which only the operators insert, by id). It is the engine's
    ``encode_special_tokens`` mode. `convert_tokens_to_ids` looks tokens up by name, so
    ``convert_tokens_to_ids("<|im_end|>")`` is that token's id, as in transformers.
    """

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tok.encode_special_tokens = True
        self._ascii = _without_normalizer(self._tok)
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self._special = {name: self._id(config.get(f"{name}_token"))
                         for name in ("bos", "eos", "pad", "unk")}

    def _id(self, token: Any) -> int | None:
        text = _token_text(token)
        return None if text is None else self._tok.token_to_id(text)

    @property
    def bos_token_id(self) -> int | None:
        return self._special["bos"]

    @bos_token_id.setter
    def bos_token_id(self, value: int | None) -> None:
        self._special["bos"] = value

    @property
    def eos_token_id(self) -> int | None:
        return self._special["eos"]

    @eos_token_id.setter
    def eos_token_id(self, value: int | None) -> None:
        self._special["eos"] = value

    @property
    def pad_token_id(self) -> int | None:
        return self._special["pad"]

    @pad_token_id.setter
    def pad_token_id(self, value: int | None) -> None:
        self._special["pad"] = value

    @property
    def unk_token_id(self) -> int | None:
        return self._special["unk"]

    @unk_token_id.setter
    def unk_token_id(self, value: int | None) -> None:
        self._special["unk"] = value

    def __len__(self) -> int:
        """The vocabulary with the added tokens, as ``len()`` of a transformers tokenizer."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | None | list[int | None]:
        """A token's id (a str in, an int out), or a list of ids for an iterable of tokens;
        a token the vocabulary lacks gives `unk_token_id` (None without an unknown token),
        as transformers does."""
        if isinstance(tokens, str):
            return self._lookup(tokens)
        return [self._lookup(t) for t in tokens]

    def _lookup(self, token: str) -> int | None:
        found = self._tok.token_to_id(token)
        return self.unk_token_id if found is None else found

    @moved_keywords("FastTokenizer.__call__", "0.4.0", {"texts": "text"})
    def __call__(self, text: str | list[str], add_special_tokens: bool = True,
                 return_attention_mask: bool | None = None) -> dict[str, Any]:
        """``{"input_ids": ..., "attention_mask": ...}`` for a text (lists of ints) or a
        list of texts (lists of lists), as transformers' tokenizer call gives them, with
        its defaults: the tokenizer's special tokens added (`add_special_tokens`), the
        attention mask included unless `return_attention_mask` is False. No padding,
        truncation or tensors: the operators pack rows themselves."""
        mask = return_attention_mask is not False
        one = isinstance(text, str)
        batch = self._encodings([text] if one else list(text), add_special_tokens)
        out: dict[str, Any] = {"input_ids": [e.ids for e in batch]}
        if mask:
            out["attention_mask"] = [e.attention_mask for e in batch]
        return {k: v[0] for k, v in out.items()} if one else out

    def _encodings(self, texts: list[str], add_special_tokens: bool) -> list[Any]:
        """One `tokenizers.Encoding` per text, by the cheapest route to the same ids.

        Measured with callgrind on the bundled Qwen vocabulary (issue 39): the engine's
        `encode` and `encode_batch` also compute character offsets (18% of the work) that
        nothing here reads, so each text goes through ``encode_batch_fast`` (byte offsets,
        same ids); one text a call, so the work stays in the calling thread and the
        engine's workers are the only parallelism (a longer list runs on the library's
        thread pool, as many threads as cores in every worker process); and an ASCII text
        skips a Unicode normalizer, which leaves ASCII unchanged and costs 15% of the rest
        (`_without_normalizer`). The special-token-safe mode costs nothing measurable.
        """
        plain = self._ascii
        return [(plain if plain is not None and t.isascii() else self._tok)
                .encode_batch_fast([t], add_special_tokens=add_special_tokens)[0]
                for t in texts]


#: Unicode normal forms: each leaves every ASCII string as it is
_ASCII_IDENTITY = ("NFC", "NFD", "NFKC", "NFKD")


def _normalizes_only_unicode(normalizer: Any) -> bool:
    """Whether `normalizer` is a Unicode normal form (or a sequence of them)."""
    from tokenizers import normalizers

    if isinstance(normalizer, normalizers.Sequence):
        return all(_normalizes_only_unicode(normalizer[i]) for i in range(len(normalizer)))
    return type(normalizer).__name__ in _ASCII_IDENTITY


def _without_normalizer(tok: Any) -> Any:
    """A tokenizer that shares `tok`'s model and pre-tokenizer but not its normalizer:
    for ASCII text when that normalizer is a Unicode normal form (which leaves ASCII as it
    is), else None. Its added tokens get `tok`'s ids, checked; it costs no memory (the
    vocabulary is shared, not copied)."""
    from tokenizers import Tokenizer

    if tok.normalizer is None or not _normalizes_only_unicode(tok.normalizer) \
            or tok.truncation is not None or tok.padding is not None:
        return None
    plain = Tokenizer(tok.model)
    plain.pre_tokenizer, plain.post_processor, plain.decoder = \
        tok.pre_tokenizer, tok.post_processor, tok.decoder
    added = tok.get_added_tokens_decoder()
    for i in sorted(added):
        (plain.add_special_tokens if added[i].special else plain.add_tokens)([added[i]])
    if plain.get_added_tokens_decoder() != added:
        return None  # ids with gaps or reordered: keep the one tokenizer
    plain.encode_special_tokens = tok.encode_special_tokens
    return plain


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

    def release(self) -> None:
        """Let go of the tokenizer in this process and return its memory (`setup` loads
        it again)."""
        self._tok = None
        forget_tokenizers()


class Tokenize(TokenizerTransform):
    """Text -> token ids with a `transformers` tokenizer loaded from a local path.

    A record is ``{text_key: str}`` (all of it a target) or a chat under
    ``conversations``/``messages`` (`zephon_core.ops.chat`: ChatML turns, the
    targets `chat` says: assistant turns and their ``<|im_end|>\\n`` by default).
    Output payload: ``{"tokens": int32 array}``, EOS appended when `add_eos` and
    ``chat.end_of_text`` (every document, text or chat, ends the same way),
    plus ``targets`` (bool) where not every token is one. What happens to
    documents longer than the context is the packer's `overlong` setting
    (split, truncate or drop), so it is decided in one place.
    """

    default_runner = "processes"

    def __init__(self, tokenizer_path: str | os.PathLike, text_key: str = "text",
                 add_bos: bool = False, add_eos: bool = True, name: str = "tokenize",
                 on_error: str = "raise", chat: ChatFraming | None = None) -> None:
        super().__init__(tokenizer_path)
        self.text_key = text_key
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.name = name
        self.on_error = check_on_error(on_error)
        self.chat = chat or ChatFraming()
        self._chatml: tuple[int, int] | None = None

    def settings(self) -> dict:
        chat = self.chat.settings()
        return {"tokenizer": self._identity, "text_key": self.text_key,
                "add_bos": self.add_bos, "add_eos": self.add_eos,
                **({"chat": chat} if chat else {})}

    def process_many(self, elements: list[Element]) -> list[Any]:
        self.setup()
        texts, at = [], []
        out: list[Any] = [None] * len(elements)
        for i, e in enumerate(elements):
            record = e.payload if isinstance(e.payload, dict) else {}
            text = record.get(self.text_key)
            if isinstance(text, str):
                texts.append(text)
                at.append(i)
                continue
            turns = record_turns(record, _where(e))
            if turns is None:
                raise BadSampleError("missing_text", _where(e),
                                     f"no string field {self.text_key!r} and no "
                                     "'conversations'/'messages' chat in the sample")
            out[i] = self._chat(turns, _where(e))
        ids = self._tok(texts, add_special_tokens=False,
                        return_attention_mask=False)["input_ids"] if texts else []
        bos_id, eos_id = self._tok.bos_token_id, self._tok.eos_token_id
        bos = [bos_id] if self.add_bos and bos_id is not None else []
        eos = [eos_id] if self.add_eos and self.chat.end_of_text and eos_id is not None else []
        masked_eos = bool(eos) and not self.chat.train_end_of_text
        for i, t in zip(at, ids, strict=True):
            doc = {"tokens": np.asarray(bos + t + eos, dtype=np.int32)}
            if masked_eos:
                doc["targets"] = np.arange(len(doc["tokens"])) < len(doc["tokens"]) - 1
            out[i] = doc
        return out

    def _chat(self, turns: list[dict], where: str) -> dict:
        """A chat framed as ChatML: tokens and targets."""
        if self._chatml is None:
            self._chatml = self._chatml_ids()
        start, end = self._chatml

        def encode(s: str) -> list[int]:
            return self._tok(s, add_special_tokens=False,
                             return_attention_mask=False)["input_ids"] if s else []

        pieces = chat_pieces(turns, self.chat, lambda role: chatml_turn(start, end, role, encode),
                             encode)
        if any(kind == "media" for kind, _, _ in pieces):
            raise BadSampleError("placeholder_mismatch", where, "a text record's chat has an "
                                 "image slot (<image> or an image part) and no image; read "
                                 "it with a VLM recipe and its format")
        if not any(trained and value for kind, value, trained in pieces):
            raise BadSampleError("no_assistant_turn", where, "a chat without text in a turn "
                                 f"of {'/'.join(self.chat.train_roles)} has nothing to train on")
        bos_id, eos_id = self._tok.bos_token_id, self._tok.eos_token_id
        if self.add_bos and bos_id is not None:
            pieces.insert(0, ("text", [bos_id], False))
        if self.add_eos:
            pieces += self.chat.end_of_text_piece(eos_id)  # none when chat.end_of_text is off
        tokens = [t for _, value, _ in pieces for t in value]
        targets = [trained for _, value, trained in pieces for _ in value]
        return {"tokens": np.asarray(tokens, dtype=np.int32),
                "targets": np.asarray(targets, dtype=bool)}

    def _chatml_ids(self) -> tuple[int, int]:
        ids = self._tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
        unk = getattr(self._tok, "unk_token_id", None)
        if any(i is None or (unk is not None and i == unk) for i in ids):
            raise ConfigError(f"chat records are framed as ChatML (<|im_start|>role ... "
                              f"<|im_end|>) and the tokenizer {self.tokenizer_path} lacks "
                              "those tokens; use a tokenizer that has them (the bundled Qwen "
                              "one: `zephon-vl tokenizer`), or give text records")
        return ids[0], ids[1]


def _where(e: Element) -> str:
    return e.origin.where() if e.origin is not None else "?"


class MinTokens(Transform):
    """Drop documents with fewer than `n` tokens (recorded as ``too_short``).

    It rides along (`engine.plan.runner_of`): by default it runs in the same worker call
    as the transform before it (the tokenizer), not as a stage of its own in the driver.
    """

    rides_along = True

    def __init__(self, n: int, name: str = "min_tokens") -> None:
        self.n = n
        self.name = name

    def settings(self) -> dict:
        return {"n": self.n}

    def process_many(self, elements: list[Element]) -> list[Any]:
        from zephon_core.records import Dropped

        return [e.payload if len(e.payload["tokens"]) >= self.n else Dropped("too_short")
                for e in elements]
