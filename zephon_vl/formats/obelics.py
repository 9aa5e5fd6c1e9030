"""``obelics``: interleaved web documents as OBELICS stores them (JSON list, JSON Lines
or Parquet)::

    {"texts": ["A harbour at dawn.", null, "Boats leave before six."],
     "images": [null, "harbour/1.jpg", null]}

Two lists of one length: at each position exactly one of them holds a value,
text or an image (a path or URL relative to ``image_folder``, or an embedded
``{"bytes", "path"}``). Every text is trained (a document, not a chat).
"""

from __future__ import annotations

from collections.abc import Mapping

from zephon_vl.formats.base import RecordFormat, Where, bad, media_item


class ObelicsFormat(RecordFormat):
    name = "obelics"
    fields = {"id": "id", "texts": "texts", "images": "images"}
    required = (("texts",), ("images",))

    def to_sample(self, record: dict, fields: Mapping[str, str], where: Where) -> dict:
        texts, images = record.get(fields["texts"]), record.get(fields["images"])
        if not isinstance(texts, list) or not isinstance(images, list):
            raise bad(where, f"{fields['texts']!r} and {fields['images']!r} must both be lists")
        if len(texts) != len(images):
            raise bad(where, f"{len(texts)} texts for {len(images)} images: the lists must be "
                      "as long as each other")
        parts: list[str | None] = []
        media = []
        for j, (text, image) in enumerate(zip(texts, images, strict=True)):
            if (text is None) == (image is None):
                raise bad(where, f"position {j} holds {'both' if text is not None else 'neither'}"
                          " a text and an image; exactly one is expected")
            if text is not None:
                if not isinstance(text, str):
                    raise bad(where, f"text {j} is a {type(text).__name__}, not a string")
                parts.append(text)
            else:
                parts.append(None)
                media.append(media_item(image, False, where))
        if not any(parts):
            raise bad(where, "a document without text", "missing_text")
        return {"kind": "interleaved", "parts": parts, "media": media}
