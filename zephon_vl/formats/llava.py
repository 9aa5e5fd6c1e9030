"""``llava``: LLaVA's instruction data, a JSON list (or JSON Lines) of records::

    {"id": "000123", "image": "coco/train2017/000000123.jpg",
     "conversations": [{"from": "human", "value": "<image>\\nWhat is in the picture?"},
                       {"from": "gpt", "value": "A cat on a sofa."}]}

``image`` (or ``images``) is one path or a list (several ``<image>`` placeholders, in order),
relative to the dataset's ``image_folder``; ``video`` (one path or a list)
is relative to ``video_folder`` and is placed by ``<video>`` (or ``<image>``
when the record has no image, as LLaVA-Video writes it). With no placeholder
at all, the media go before the first human turn's text. Roles are
``human``/``gpt``/``system`` (``user``/``assistant`` too); turns may use
``role``/``content`` instead of ``from``/``value``. Many records may name the
same image.
"""

from __future__ import annotations

from collections.abc import Mapping

from zephon_vl.formats.base import (
    RecordFormat,
    Where,
    as_list,
    bad,
    conversation,
    media_item,
    place_media,
    role_of,
    split_text,
)


def chat_turns(raw: object, where: Where) -> tuple[list[dict], list[str]]:
    """LLaVA/ShareGPT turns -> zephon turns and the placeholders found, in order."""
    if not isinstance(raw, list) or not raw:
        raise bad(where, "'conversations' must be a non-empty list of turns")
    turns, found = [], []
    for t in raw:
        if not isinstance(t, dict):
            raise bad(where, f"a turn is a {type(t).__name__}, not {{'from', 'value'}}")
        role = t.get("from", t.get("role"))
        value = t.get("value", t.get("content"))
        if not isinstance(value, str):
            raise bad(where, f"a turn's 'value' is {type(value).__name__}, not a string")
        pieces, marks = split_text(value)
        turns.append({"role": role_of(role, where), "content": pieces})
        found += marks
    return turns, found


def prepend_media(turns: list[dict], count: int, where: Where) -> None:
    """No placeholder anywhere: the record's media go before its first user turn's text."""
    first = next((t for t in turns if t["role"] == "user"), None)
    if first is None:
        raise bad(where, "media but no <image> placeholder and no human turn to put them in",
                  "placeholder_mismatch")
    first["content"] = [None] * count + first["content"]


class LlavaFormat(RecordFormat):
    name = "llava"
    fields = {"id": "id", "image": "image", "images": "images", "video": "video",
              "conversations": "conversations"}
    required = (("conversations",),)

    def to_sample(self, record: dict, fields: Mapping[str, str], where: Where) -> dict:
        turns, found = chat_turns(record.get(fields["conversations"]), where)
        raw = record.get(fields["image"])
        if raw is None:
            raw = record.get(fields["images"])
        elif record.get(fields["images"]) is not None:
            raise bad(where, f"both {fields['image']!r} and {fields['images']!r}: give the "
                      "record's images under one of them")
        images = [media_item(r, False, where) for r in as_list(raw)]
        videos = [media_item(r, True, where) for r in as_list(record.get(fields["video"]))]
        if not found and (images or videos):
            prepend_media(turns, len(images) + len(videos), where)
            media = images + videos
        else:
            media = place_media(found, images, videos, where)
        return conversation(turns, media, where)
