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
from typing import Any

from zephon_vl.formats.base import RecordFormat, Where, bad, media_item


def obelics_parts(texts: Any, images: Any, where: Where | str,
                  names: tuple[str, str] = ("texts", "images")) -> tuple[list[str | None], list]:
    """OBELICS's parallel lists -> the document's parts (None where an image goes) and
    the image entries in order; a bad record raises naming the position and the fault.
    Shared by this format and WebDataset samples whose ``json`` is OBELICS-shaped."""
    if not isinstance(texts, list) or not isinstance(images, list):
        raise bad(where, f"{names[0]!r} and {names[1]!r} must both be lists")
    if len(texts) != len(images):
        raise bad(where, f"{len(texts)} texts for {len(images)} images: the lists must be "
                  "as long as each other")
    parts: list[str | None] = []
    found = []
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
            found.append(image)
    if not any(parts):
        raise bad(where, "a document without text", "missing_text")
    return parts, found


class ObelicsFormat(RecordFormat):
    name = "obelics"
    fields = {"id": "id", "texts": "texts", "images": "images"}
    required = (("texts",), ("images",))

    def to_sample(self, record: dict, fields: Mapping[str, str], where: Where) -> dict:
        parts, images = obelics_parts(record.get(fields["texts"]), record.get(fields["images"]),
                                      where, (fields["texts"], fields["images"]))
        return {"kind": "interleaved", "parts": parts,
                "media": [media_item(image, False, where) for image in images]}
