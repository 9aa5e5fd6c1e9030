"""Vision-language transforms: decode images/videos, and tokenize text with vision tokens.

`DecodeVision` turns a WebDataset sample (member bytes), or a sample of a
record format (`zephon_vl.formats`: turns or parts with media bytes), into a
*document*: its kind, its text parts and its images as patch rows. A record of a text
dataset (JSONL/Parquet, no ``__key__``) passes through as a document with no
vision items, so one recipe mixes text-only and image/video datasets. `TokenizeMultimodal`
turns the document into tokens where each image becomes its model family's
placeholder run (for Qwen, ``<|vision_start|> + N x <|image_pad|> +
<|vision_end|>``, `N` being exactly that image's number of merged patches;
see :mod:`zephon_vl.families`), frames conversation turns the family's way,
and marks which tokens are prediction targets (captions, assistant turns,
interleaved text; never vision tokens or user prompts).

Both are pure functions of their input, so they run in process pools with
their own worker counts; pixel arrays travel between processes through shared
memory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon_core import (
    BadSampleError,
    ChatFraming,
    ConfigError,
    Element,
    Transform,
    UserTransform,
)
from zephon_core.extend import (
    TokenizerTransform,
    chat_pieces,
    check_on_error,
    loads_sample,
    parse_turn,
    record_turns,
)
from zephon_vl.families.base import VisionFamily
from zephon_vl.families.registry import vision_family
from zephon_vl.formats.obelics import obelics_parts
from zephon_vl.media.image import IMAGE_EXTS, ImageSettings, VisionPatches, process_image
from zephon_vl.media.planned import (
    PlannedItem,
    item_pixels,
    items_for_the_packer,
    plan_clip_reference,
    plan_image,
    plan_video,
)
from zephon_vl.media.video import VideoSettings, open_video_reference, process_video
from zephon_vl.ops.pixels import PixelEdit, decode_with_pixels, edited_image

_INDEXED = re.compile(r"^(\d+)\.(jpg|jpeg|png|webp)$")


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


def text_document(record: Any) -> dict:
    """A JSONL/Parquet record of a text dataset -> a document without vision items.

    ``{"text": str}`` is plain text (all of it a target), ``{"conversations":
    [...]}`` or ``{"messages": [...]}`` a chat (assistant turns are targets);
    an ``<image>`` in a text record has no image to stand for and is refused
    when the document is tokenized.
    """
    if not isinstance(record, dict):
        raise BadSampleError("bad_json", "text record", f"a {type(record).__name__}, "
                             "not an object with 'text' or 'conversations'")
    where = f"text record {str(record.get('id', '?'))[:40]}"
    turns = record_turns(record, where)
    if turns is not None:
        return {"kind": "conversation", "turns": turns, "vision": [], "video": []}
    text = record.get("text")
    if not isinstance(text, str) or not text:
        raise BadSampleError("missing_text", where, "a text record needs a non-empty 'text' "
                             "string or a 'conversations'/'messages' list")
    return {"kind": "text", "text": text, "vision": [], "video": []}


def document_text(parts: list[str | None]) -> list[str | None]:
    """An image-text document's parts with whitespace stripped from the document's two
    ends, as TorchTitan's ``MMDataLoader`` does (``insert_vision_placeholders``' ``strip``).

    A caption is ``[image, text]``: its text loses its trailing whitespace.
    Neighbouring text parts stay separate pieces (TorchTitan joins them with no
    separator before it tokenizes; see docs/torchtitan.md).
    """
    out = list(parts)
    first = next((i for i, p in enumerate(out) if p), None)
    if first is not None and all(p is not None for p in out[:first + 1]):
        out[first] = out[first].lstrip()
    last = next((i for i in range(len(out) - 1, -1, -1) if out[i]), None)
    if last is not None and all(p is not None for p in out[last:]):
        out[last] = out[last].rstrip()
    return out


class DecodeVision(Transform):
    """WebDataset sample -> document dict with decoded vision inputs (heavy: processes).

    With `plan` (the built-in VLM recipes), an image or clip whose header can be
    trusted is a `PlannedItem` (its grid, its bytes) instead, decoded after the packer
    by the recipe's row transform `DecodePlanned` (or by `TokenizeMultimodal` for a
    sample that fits, with ``decode_planned``; docs/design.md).
    """

    default_runner = "processes"

    #: this element's ``pixels`` operators (`zephon_vl.ops.pixels`), set on a per-element copy
    edit: PixelEdit | None = None

    def __init__(self, image: ImageSettings | None = None, video: VideoSettings | None = None,
                 name: str = "decode", on_error: str = "drop",
                 pixel_ops: Sequence[UserTransform] = (), plan: bool = False) -> None:
        self.image = image or ImageSettings()
        self.video = video or VideoSettings()
        self.name = name
        self.on_error = check_on_error(on_error)
        #: the user's operators on each still image's decoded pixels (docs/operators.md)
        self.pixel_ops = list(pixel_ops)
        #: plan images and clips from their headers (`zephon_vl.media.planned`): the
        #: document holds `PlannedItem`s, decoded later (`DecodePlanned` after the packer,
        #: or the tokenizer). Never with ``pixels`` operators (they may change the size).
        #: Not a setting: the pixels are the same either way.
        self.plan = plan and not self.pixel_ops

    def settings(self) -> dict:
        from zephon_vl.media.image import pillow_backend

        pixels = [{"name": t.name, **t.settings()} for t in self.pixel_ops]
        return {"image": self.image.settings(), "video": self.video.settings(),
                "pil": pillow_backend(), **({"pixel_ops": pixels} if pixels else {})}

    def process_many(self, elements: list[Element]) -> list[Any]:
        if self.pixel_ops:
            return [decode_with_pixels(self, e) for e in elements]
        return [self.decode(e.payload) for e in elements]

    def _still(self, data: bytes, where: str) -> VisionPatches | PlannedItem:
        """One still image's patch rows, through this element's ``pixels`` operators;
        planned instead where `plan` is on and its header can be trusted."""
        if self.edit is not None:
            return edited_image(data, self.image, where, self.edit)
        if self.plan:
            return plan_image(data, self.image, where)
        return process_image(data, self.image, where, one_frame=True)

    def _clip(self, data: Any, where: str) -> VisionPatches | PlannedItem:
        """One clip's patch rows; planned instead where `plan` is on, the clip is bytes
        and its container index can be trusted."""
        if self.plan and isinstance(data, bytes):
            return plan_video(data, self.image, self.video, where)
        return process_video(data, self.image, self.video, where)

    def decode(self, sample: dict) -> dict:
        if "__format__" in sample:
            return self.decode_sample(sample)
        if "__key__" not in sample:
            return text_document(sample)
        where = _where(sample)
        base = {"key": sample.get("__key__"), "shard": sample.get("__shard__")}
        indexed = sorted((int(m.group(1)), k) for k in sample
                         if isinstance(k, str) and (m := _INDEXED.match(k)))
        meta_raw = _text_member(sample, "json")
        meta = None if meta_raw is None else loads_sample(meta_raw, where)
        if "mp4" in sample:
            caption = _text_member(sample, "txt")
            if not caption:
                raise BadSampleError("missing_caption", where, "video without txt")
            vid = self._clip(sample["mp4"], f"{where}.mp4")
            return {**base, "kind": "caption", "text": caption, "vision": [vid],
                    "video": [True]}
        if isinstance(meta, dict) and "video" in meta:  # a video by reference (video_folder)
            return self._referenced_video(sample, meta, base, where)
        if isinstance(meta, dict) and "texts" in meta and "images" in meta:
            return self._obelics(sample, meta, indexed, base, where)
        if indexed and isinstance(meta, dict) and isinstance(
                meta.get("conversations", meta.get("messages")), list):
            turns = [parse_turn(t, where) for t in meta.get("conversations", meta.get("messages"))]
            vision = [self._still(sample[k], f"{where}.{k}")
                      for _, k in indexed]
            return {**base, "kind": "conversation", "turns": turns, "vision": vision,
                    "video": [False] * len(vision)}
        if indexed:
            if not isinstance(meta, dict) or not isinstance(meta.get("text"), list):
                raise BadSampleError("missing_caption", where,
                                     "numbered images need json {'text': [...]} (interleaved) "
                                     "or a 'conversations'/'messages' chat")
            parts = meta["text"]
            if not all(p is None or isinstance(p, str) for p in parts):
                raise BadSampleError("bad_json", where, "interleaved 'text' parts must be "
                                     "strings, or null where an image goes")
            if sum(p is None for p in parts) != len(indexed):
                raise BadSampleError("bad_json", where, "number of nulls != number of images")
            vision = [self._still(sample[k], f"{where}.{k}")
                      for _, k in indexed]
            return {**base, "kind": "interleaved", "parts": parts, "vision": vision,
                    "video": [False] * len(vision)}
        ext = next((e for e in IMAGE_EXTS if e in sample), None)
        if ext is None:
            raise BadSampleError("missing_image", where, "no jpg/png/webp/mp4 member")
        img = self._still(sample[ext], f"{where}.{ext}")
        if isinstance(meta, dict) and isinstance(meta.get("conversations"), list):
            return {**base, "kind": "conversation",
                    "turns": [parse_turn(t, where) for t in meta["conversations"]],
                    "vision": [img], "video": [False]}
        caption = _text_member(sample, "txt")
        if caption is None and isinstance(meta, dict) and isinstance(meta.get("caption"), str):
            caption = meta["caption"]
        if not caption:
            raise BadSampleError("missing_caption", where, "image without txt or json caption")
        return {**base, "kind": "caption", "text": caption, "vision": [img], "video": [False]}

    def decode_sample(self, sample: dict) -> dict:
        """A sample of a record format (`zephon_vl.formats.base`): decode its media."""
        where = _where(sample)
        vision = []
        for j, m in enumerate(sample["media"]):
            name = f"{where}.{m.get('name', j)}"
            vision.append(self._clip(m["data"], name) if m["video"]
                          else self._still(m["data"], name))
        doc = {"key": sample["__key__"], "shard": sample["__shard__"], "kind": sample["kind"],
               "vision": vision, "video": [bool(m["video"]) for m in sample["media"]]}
        if sample["kind"] == "interleaved":
            doc["parts"] = sample["parts"]
        else:
            doc["turns"] = sample["turns"]
        return doc

    def _obelics(self, sample: dict, meta: dict, indexed: list[tuple[int, str]], base: dict,
                 where: str) -> dict:
        """``json {"texts": [...], "images": [...]}`` (OBELICS's parallel lists): an
        interleaved document whose images are the numbered members, in order, one per
        non-null ``images`` entry (the entry itself, often the source URL, is not read)."""
        parts, images = obelics_parts(meta["texts"], meta["images"], where)
        if len(images) != len(indexed):
            raise BadSampleError("placeholder_mismatch", where,
                                 f"json 'images' holds {len(images)} image(s) and the sample "
                                 f"has {len(indexed)} numbered image member(s) (0.jpg, 1.jpg...)"
                                 "; each image of the document is one member, in order")
        vision = [self._still(sample[k], f"{where}.{k}")
                  for _, k in indexed]
        return {**base, "kind": "interleaved", "parts": parts, "vision": vision,
                "video": [False] * len(vision)}

    def _referenced_video(self, sample: dict, meta: dict, base: dict, where: str) -> dict:
        """``json {"video": "clips/a.mp4", ...}``: the clip is read from
        `VideoSettings.video_folder` by range; a caption (txt, or json
        ``caption``) or ``conversations`` whose ``<image>`` stands for the clip."""
        name = f"{where}:{meta['video']}"
        if self.plan:
            vid = plan_clip_reference(meta["video"], self.image, self.video, where, name)
        else:
            with open_video_reference(meta["video"], self.video.video_folder, where) as f:
                vid = process_video(f, self.image, self.video, name)
        if isinstance(meta.get("conversations"), list):
            return {**base, "kind": "conversation",
                    "turns": [parse_turn(t, where) for t in meta["conversations"]],
                    "vision": [vid], "video": [True]}
        caption = _text_member(sample, "txt")
        if caption is None and isinstance(meta.get("caption"), str):
            caption = meta["caption"]
        if not caption:
            raise BadSampleError("missing_caption", where, "video without txt or json caption")
        return {**base, "kind": "caption", "text": caption, "vision": [vid], "video": [True]}


class TokenizeMultimodal(TokenizerTransform):
    """Document -> tokens, targets and vision costs; truncates only at text boundaries.

    Documents longer than `max_tokens` are cut after their last complete
    text piece that fits when `overlong="truncate"` (never inside an image's
    tokens), or left whole for the packer to drop (`overlong="drop"`).

    `decode_planned` False leaves planned items (`PlannedItem`) undecoded for a row
    transform after the packer (`DecodePlanned`, which the built-in VLM recipes add):
    the packer's open rows then hold encoded bytes, and nothing is decoded for a sample
    it refuses. Not a setting: the pixels are the same either way.
    """

    default_runner = "processes"

    def __init__(self, tokenizer_path: str | os.PathLike, merge_size: int, max_tokens: int,
                 overlong: str = "drop", name: str = "tokenize", on_error: str = "drop",
                 family: str | VisionFamily = "qwen3_5",
                 chat: ChatFraming | None = None, decode_planned: bool = True) -> None:
        if overlong not in ("drop", "truncate"):
            raise ConfigError(f"overlong must be 'drop' or 'truncate', got {overlong!r}")
        super().__init__(tokenizer_path)
        self.merge_size = merge_size
        self.max_tokens = max_tokens
        self.overlong = overlong
        self.name = name
        self.on_error = check_on_error(on_error)
        self.family = vision_family(family)
        self.chat = chat if chat is not None else self.family.chat_framing
        self.decode_planned = decode_planned
        self._ids: Any = None

    def _pixels(self, items: list[Any], refused: bool) -> list[Any]:
        """The items as the packer gets them: a sample it refuses for its length
        (`refused`) is never decoded; with `decode_planned` the rest is; without (the
        decode follows the packer) each item is held in its smaller form."""
        if refused:
            return item_pixels(items, decode=False)
        return item_pixels(items) if self.decode_planned else items_for_the_packer(items)

    def settings(self) -> dict:
        chat = self.chat.settings()
        return {"tokenizer": self._identity, "merge_size": self.merge_size,
                "max_tokens": self.max_tokens, "overlong": self.overlong,
                "family": self.family.name, **({"layout": self.family.layout}
                                                if self.family.layout else {}),
                **({"chat": chat} if chat else {})}

    def setup(self) -> None:
        if self._tok is None:  # first use, or after `release`
            super().setup()
            self._ids = self.family.special_tokens(self._tok)

    def _text(self, s: str) -> list[int]:
        return self._tok(s, add_special_tokens=False,
                         return_attention_mask=False)["input_ids"] if s else []

    def process_many(self, elements: list[Element]) -> list[Any]:
        self.setup()
        return [self.tokenize(e.payload) for e in elements]

    def _pieces(self, doc: dict) -> list[tuple[str, Any, bool]]:
        """The document as ("text", ids, is_target) and ("media", index, False) pieces: a
        chat framed by the family's turn tokens and the recipe's `ChatFraming`."""
        ids = self._ids
        kind = doc["kind"]
        if kind == "caption":
            return [("media", 0, False), ("text", self._text(doc["text"].rstrip()), True)]
        if kind == "text":
            return [("text", self._text(doc["text"]), True)]
        if kind == "interleaved":
            out, k = [], 0
            for part in document_text(doc["parts"]):
                if part is None:
                    out.append(("media", k, False))
                    k += 1
                elif part:
                    out.append(("text", self._text(part), True))
            return out
        out = chat_pieces(doc["turns"], self.chat,
                          lambda role: self.family.chat_turn(ids, role, self._text), self._text)
        images = sum(kind == "media" for kind, _, _ in out)
        if images != len(doc["vision"]):
            raise BadSampleError("bad_json", f"{doc.get('shard')}:{doc.get('key')}",
                                 f"{images} <image> placeholders for {len(doc['vision'])} images")
        return out

    def tokenize(self, doc: dict) -> dict:
        ids = self._ids
        vision: list[VisionPatches | PlannedItem] = doc["vision"]
        tokens: list[np.ndarray] = []
        targets: list[np.ndarray] = []
        used: list[int] = []
        total = 0
        pieces = self._pieces(doc) + self.chat.end_of_text_piece(ids.eos)
        for kind, value, is_target in pieces:
            if kind == "media":
                t = self.family.placeholder(ids, vision[value], self.merge_size,
                                            doc["video"][value])
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
        vision_tokens = sum(self.family.item_tokens(v.grid_thw, self.merge_size) for v in kept)
        return {
            "tokens": np.concatenate(tokens).astype(np.int32),
            "targets": np.concatenate(targets),
            "costs": {"vision_tokens": vision_tokens, "images": len(kept)},
            "pixel_values": self._pixels(kept, self.overlong == "drop"
                                         and total > self.max_tokens),
            "grid_thw": [v.grid_thw for v in kept],
        }
