"""``messages``: chats as role/content-part lists, the Hugging Face chat layout that
NVIDIA's Nemotron-VLM data also uses (JSON list, JSON Lines or Parquet)::

    {"messages": [
        {"role": "user", "content": [{"type": "image", "image": "photos/1.jpg"},
                                     {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]}

An image part names its file (``image``, ``path`` or ``url``, or
``{"type": "image_url", "image_url": {"url": ...}}``) relative to
``image_folder``, or names nothing and takes the next entry of the record's
``images`` list (paths, or embedded ``{"bytes", "path"}`` as Parquet holds
them); ``{"type": "video", "video": ...}`` likewise with ``video_folder`` and
``videos``. A string ``content`` may carry ``<image>`` placeholders for the
``images`` list. Roles: ``system``, ``user``, ``assistant``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zephon_vl.formats.base import (
    RecordFormat,
    Where,
    as_list,
    bad,
    conversation,
    media_item,
    role_of,
    split_text,
)

_REF_KEYS = ("image", "path", "url", "video")


def _part_ref(part: dict) -> Any:
    if part.get("type") == "image_url":
        inner = part.get("image_url")
        return inner.get("url") if isinstance(inner, dict) else inner
    for k in _REF_KEYS:
        value = part.get(k)
        if value is not None:
            return value
    return None


def message_turns(raw: Any, images: list, videos: list, where: Where) -> tuple[list, list]:
    """Messages -> zephon turns and their media in order; list entries fill parts that
    name no file."""
    if not isinstance(raw, list) or not raw:
        raise bad(where, "'messages' must be a non-empty list of {'role', 'content'}")
    pools = {False: list(images), True: list(videos)}
    turns, media = [], []

    def take(video: bool) -> dict:
        if not pools[video]:
            kind = "video" if video else "image"
            raise bad(where, f"more {kind} parts than entries in the record's {kind}s list",
                      "placeholder_mismatch")
        return media_item(pools[video].pop(0), video, where)

    for m in raw:
        if not isinstance(m, dict):
            raise bad(where, f"a message is a {type(m).__name__}, not {{'role', 'content'}}")
        role = role_of(m.get("role"), where)
        content = m.get("content")
        pieces: list[str | None] = []
        if isinstance(content, str):
            pieces, found = split_text(content)
            media += [take(mark == "<video>") for mark in found]
        elif isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    pieces.append(part["text"])
                elif kind in ("image", "image_url", "video"):
                    video = kind == "video"
                    ref = _part_ref(part)
                    media.append(take(video) if ref is None else media_item(ref, video, where))
                    pieces.append(None)
                else:
                    raise bad(where, "a content part is not {'type': 'text', 'text': str}, "
                              "{'type': 'image'[, 'image': path]} or {'type': 'video', ...}: "
                              + str(part)[:60])
        elif content is not None:
            raise bad(where, f"a message's 'content' is {type(content).__name__}, not a "
                      "string or a list of parts")
        turns.append({"role": role, "content": pieces})
    if pools[False] or pools[True]:
        raise bad(where, f"{len(pools[False])} image(s) and {len(pools[True])} video(s) of the "
                  "record are named by no message part", "placeholder_mismatch")
    return turns, media


class MessagesFormat(RecordFormat):
    name = "messages"
    fields = {"id": "id", "messages": "messages", "images": "images", "videos": "videos"}
    required = (("messages",),)

    def to_sample(self, record: dict, fields: Mapping[str, str], where: Where) -> dict:
        turns, media = message_turns(record.get(fields["messages"]),
                                     as_list(record.get(fields["images"])),
                                     as_list(record.get(fields["videos"])), where)
        return conversation(turns, media, where)
