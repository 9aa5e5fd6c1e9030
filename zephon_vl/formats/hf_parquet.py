"""``parquet``: Parquet as the Hugging Face Hub lays out vision data, media embedded.

Images are ``datasets``' ``Image`` feature (``struct<bytes, path>``), one in
an ``image`` column or a list in ``images`` (``Sequence(Image())``); the text
is one of:

- ``texts``: ``list<struct<user, assistant, source>>``, one exchange per entry
  (HuggingFaceM4's the_cauldron and FineVision). The images go before the
  first user text, the way those sets are meant to be read;
- ``conversations``: LLaVA turns (``from``/``value`` with ``<image>``), as in
  LLaVA-NeXT-Data;
- ``messages``: role/content-part lists (see the ``messages`` format).

An ``Image`` entry without bytes is read from its ``path`` under
``image_folder``. Row groups are read whole and the last few are kept per
process (``row_group_cache``, default 2), local or through a URL.
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
    place_media,
)
from zephon_vl.formats.llava import chat_turns, prepend_media
from zephon_vl.formats.messages import message_turns


def exchange_turns(raw: Any, where: Where) -> list[dict]:
    """the_cauldron's ``texts``: ``[{"user", "assistant"}, ...]`` -> turns."""
    if not isinstance(raw, list) or not raw:
        raise bad(where, "'texts' must be a non-empty list of {'user', 'assistant'}")
    turns = []
    for entry in raw:
        if not isinstance(entry, dict):
            raise bad(where, f"a 'texts' entry is a {type(entry).__name__}, not "
                      "{'user', 'assistant'}")
        for role in ("system", "user", "assistant"):
            value = entry.get(role)
            if value is None and role == "system":
                continue
            if not isinstance(value, str):
                raise bad(where, f"a 'texts' entry's {role!r} is {type(value).__name__}, "
                          "not a string")
            turns.append({"role": role, "content": [value]})
    return turns


class HFParquetFormat(RecordFormat):
    name = "parquet"
    fields = {"id": "id", "image": "image", "images": "images", "texts": "texts",
              "conversations": "conversations", "messages": "messages"}
    required = (("texts", "conversations", "messages"),)

    def to_sample(self, record: dict, fields: Mapping[str, str], where: Where) -> dict:
        refs = as_list(record.get(fields["images"])) or as_list(record.get(fields["image"]))
        if fields["texts"] in record and record[fields["texts"]] is not None:
            turns = exchange_turns(record[fields["texts"]], where)
            media = [media_item(r, False, where) for r in refs]
            if media:
                prepend_media(turns, len(media), where)
            return conversation(turns, media, where)
        if record.get(fields["conversations"]) is not None:
            turns, found = chat_turns(record[fields["conversations"]], where)
            images = [media_item(r, False, where) for r in refs]
            if not found and images:
                prepend_media(turns, len(images), where)
                return conversation(turns, images, where)
            return conversation(turns, place_media(found, images, [], where), where)
        if record.get(fields["messages"]) is not None:
            turns, media = message_turns(record[fields["messages"]], refs, [], where)
            return conversation(turns, media, where)
        raise bad(where, f"none of {fields['texts']!r}, {fields['conversations']!r}, "
                  f"{fields['messages']!r} holds a value; keys {sorted(record)[:12]}")
