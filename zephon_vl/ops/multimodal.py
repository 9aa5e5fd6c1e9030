"""Vision-language transforms: decode images/videos, and tokenize text with vision tokens.

`DecodeVision` turns a WebDataset sample (member bytes) into a *document*:
its kind, its text parts and its images as patch rows. `TokenizeMultimodal`
turns the document into tokens where each image becomes
``<|vision_start|> + N x <|image_pad|> + <|vision_end|>`` (``<|video_pad|>``
for videos), `N` being exactly that image's number of merged patches, and
marks which tokens are prediction targets (captions, assistant turns,
interleaved text; never vision tokens or user prompts).

Both are pure functions of their input, so they run in process pools with
their own worker counts; pixel arrays travel between processes through shared
memory.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_core.errors import BadSampleError, ConfigError
from zephon_core.ops.contract import Transform, check_on_error
from zephon_core.ops.text import TokenizerTransform
from zephon_core.records import Element
from zephon_vl.media.image import IMAGE_EXTS, ImageSettings, VisionPatches, process_image
from zephon_vl.media.video import VideoSettings, process_video

_INDEXED = re.compile(r"^(\d+)\.(jpg|jpeg|png|webp)$")
IMAGE_PLACEHOLDER = "<image>"


def _where(sample: dict) -> str:
    return f"{sample.get('__shard__', '?')}:{sample.get('__key__', '?')}"


def _text_member(sample: dict, ext: str) -> str | None:
    raw = sample.get(ext)
    if raw is None:
        return None
    try:
        return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError:
        raise BadSampleError("bad_text", _where(sample), f"{ext} is not UTF-8") from None


class DecodeVision(Transform):
    """WebDataset sample -> document dict with decoded vision inputs (heavy: processes)."""

    default_runner = "processes"

    def __init__(self, image: ImageSettings | None = None, video: VideoSettings | None = None,
                 name: str = "decode", on_error: str = "drop") -> None:
        self.image = image or ImageSettings()
        self.video = video or VideoSettings()
        self.name = name
        self.on_error = check_on_error(on_error)

    def settings(self) -> dict:
        from zephon_vl.media.image import pillow_backend

        return {"image": self.image.settings_dict(), "video": self.video.settings_dict(),
                "pil": pillow_backend()}

    def process_many(self, elements: list[Element]) -> list[Any]:
        return [self.decode(e.payload) for e in elements]

    def decode(self, sample: dict) -> dict:
        where = _where(sample)
        base = {"key": sample.get("__key__"), "shard": sample.get("__shard__")}
        indexed = sorted((int(m.group(1)), k) for k in sample
                         if isinstance(k, str) and (m := _INDEXED.match(k)))
        meta_raw = _text_member(sample, "json")
        meta = None
        if meta_raw is not None:
            try:
                meta = json.loads(meta_raw)
            except ValueError as exc:
                raise BadSampleError("bad_json", where, str(exc)) from None
        if "mp4" in sample:
            caption = _text_member(sample, "txt")
            if not caption:
                raise BadSampleError("missing_caption", where, "video without txt")
            vid = process_video(sample["mp4"], self.image, self.video, f"{where}.mp4")
            return {**base, "kind": "caption", "text": caption, "vision": [vid],
                    "video": [True]}
        if indexed:
            if not isinstance(meta, dict) or not isinstance(meta.get("text"), list):
                raise BadSampleError("missing_caption", where,
                                     "interleaved images need json {'text': [...]} ")
            parts = meta["text"]
            if sum(p is None for p in parts) != len(indexed):
                raise BadSampleError("bad_json", where, "number of nulls != number of images")
            vision = [process_image(sample[k], self.image, f"{where}.{k}", one_frame=True)
                      for _, k in indexed]
            return {**base, "kind": "interleaved", "parts": parts, "vision": vision,
                    "video": [False] * len(vision)}
        ext = next((e for e in IMAGE_EXTS if e in sample), None)
        if ext is None:
            raise BadSampleError("missing_image", where, "no jpg/png/webp/mp4 member")
        img = process_image(sample[ext], self.image, f"{where}.{ext}", one_frame=True)
        if isinstance(meta, dict) and isinstance(meta.get("conversations"), list):
            return {**base, "kind": "conversation", "turns": meta["conversations"],
                    "vision": [img], "video": [False]}
        caption = _text_member(sample, "txt")
        if caption is None and isinstance(meta, dict) and isinstance(meta.get("caption"), str):
            caption = meta["caption"]
        if not caption:
            raise BadSampleError("missing_caption", where, "image without txt or json caption")
        return {**base, "kind": "caption", "text": caption, "vision": [img], "video": [False]}


@dataclass(frozen=True)
class VisionTokens:
    """Ids of the special tokens that frame vision inputs."""

    vision_start: int
    vision_end: int
    image_pad: int
    video_pad: int
    im_start: int
    im_end: int
    eos: int
    pad: int

    @classmethod
    def from_tokenizer(cls, tok: Any) -> VisionTokens:
        ids = tok.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                                         "<|video_pad|>", "<|im_start|>", "<|im_end|>"])
        if any(i is None or i == tok.unk_token_id for i in ids):
            raise ConfigError("the tokenizer lacks the vision special tokens (<|vision_start|>, "
                              "<|image_pad|>, ...); use the bundled Qwen tokenizer "
                              "(`zephon-vl tokenizer`) or add them")
        eos = tok.eos_token_id if tok.eos_token_id is not None else ids[5]
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        return cls(*ids, eos, pad)


class TokenizeMultimodal(TokenizerTransform):
    """Document -> tokens, targets and vision costs; truncates only at text boundaries.

    Documents longer than `max_tokens` are cut after their last complete
    text piece that fits when `overlong="truncate"` (never inside an image's
    tokens), or left whole for the packer to drop (`overlong="drop"`).
    """

    default_runner = "processes"

    def __init__(self, tokenizer_path: str | os.PathLike, merge_size: int, max_tokens: int,
                 overlong: str = "drop", name: str = "tokenize", on_error: str = "drop") -> None:
        if overlong not in ("drop", "truncate"):
            raise ConfigError(f"overlong must be 'drop' or 'truncate', got {overlong!r}")
        super().__init__(tokenizer_path)
        self.merge_size = merge_size
        self.max_tokens = max_tokens
        self.overlong = overlong
        self.name = name
        self.on_error = check_on_error(on_error)
        self._ids: VisionTokens | None = None

    def settings(self) -> dict:
        return {"tokenizer": self._identity, "merge_size": self.merge_size,
                "max_tokens": self.max_tokens, "overlong": self.overlong}

    def setup(self) -> None:
        if self._ids is None:
            super().setup()
            self._ids = VisionTokens.from_tokenizer(self._tok)

    def _text(self, s: str) -> list[int]:
        return self._tok(s, add_special_tokens=False)["input_ids"] if s else []

    def process_many(self, elements: list[Element]) -> list[Any]:
        self.setup()
        return [self.tokenize(e.payload) for e in elements]

    def _pieces(self, doc: dict) -> list[tuple[str, Any, bool]]:
        """The document as ("text", ids, is_target) and ("vision", index, False) pieces."""
        ids = self._ids
        kind = doc["kind"]
        if kind == "caption":
            return [("vision", 0, False), ("text", self._text(doc["text"]), True)]
        if kind == "interleaved":
            out, k = [], 0
            for part in doc["parts"]:
                if part is None:
                    out.append(("vision", k, False))
                    k += 1
                elif part:
                    out.append(("text", self._text(part), True))
            return out
        out, images = [], 0
        for turn in doc["turns"]:
            role = turn.get("role", "user")
            content = str(turn.get("content", ""))
            out.append(("text", [ids.im_start] + self._text(f"{role}\n"), False))
            chunks = content.split(IMAGE_PLACEHOLDER)
            for j, chunk in enumerate(chunks):
                if j > 0:
                    out.append(("vision", images, False))
                    images += 1
                out.append(("text", self._text(chunk), role == "assistant"))
            out.append(("text", [ids.im_end] + self._text("\n"), role == "assistant"))
        if images != len(doc["vision"]):
            raise BadSampleError("bad_json", f"{doc.get('shard')}:{doc.get('key')}",
                                 f"{images} <image> placeholders for {len(doc['vision'])} images")
        return out

    def tokenize(self, doc: dict) -> dict:
        ids = self._ids
        vision: list[VisionPatches] = doc["vision"]
        tokens: list[np.ndarray] = []
        targets: list[np.ndarray] = []
        used: list[int] = []
        total = 0
        pieces = self._pieces(doc) + [("text", [ids.eos], True)]
        for kind, value, is_target in pieces:
            if kind == "vision":
                v = vision[value]
                pad = ids.video_pad if doc["video"][value] else ids.image_pad
                n = v.num_tokens(self.merge_size)
                t = np.concatenate([[ids.vision_start], np.full(n, pad), [ids.vision_end]])
                if self.overlong == "truncate" and total + len(t) > self.max_tokens:
                    break
                used.append(value)
            else:
                t = np.asarray(value, dtype=np.int64)
                if self.overlong == "truncate" and total + len(t) > self.max_tokens:
                    t = t[:self.max_tokens - total]
            tokens.append(t)
            targets.append(np.full(len(t), is_target))
            total += len(t)
            if self.overlong == "truncate" and total >= self.max_tokens:
                break
        kept = [vision[i] for i in used] if self.overlong == "truncate" else vision
        vision_tokens = sum(v.num_tokens(self.merge_size) for v in kept)
        return {
            "tokens": np.concatenate(tokens).astype(np.int32),
            "targets": np.concatenate(targets),
            "costs": {"vision_tokens": vision_tokens, "images": len(kept)},
            "pixel_values": [v.pixel_values for v in kept],
            "grid_thw": [v.grid_thw for v in kept],
        }
