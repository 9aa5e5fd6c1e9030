"""Media a record carries inside itself as base64 text.

API logs hold images (and videos) inline: OpenAI writes a ``data:`` URL
(``data:image/png;base64,iVBOR...``) where a URL goes, Anthropic a source
``{"type": "base64", "media_type": "image/png", "data": "iVBOR..."}``. Both are
the same thing, a media type and base64 text, and become the same media item::

    {"video": False, "inline": <the text>, "start": <where the base64 begins>,
     "media_type": "image/png", "label": "message 1, part 0 (image_url)",
     "name": "message 1, part 0 (image_url): data:image/png"}

`inline_item` checks the header when the record becomes a sample (cheap: no
byte decoded); `decode_inline` decodes when the reader loads the media, with
the dataset's ``max_image_bytes``/``max_video_bytes``. What is refused, each a
drop of the record (so the same at every D and in every run):

- ``bad_data_url``: not a well-formed base64 data URL: no ``,`` ending its
  header, no media type, no bytes, or text that is not strict base64 (the
  standard alphabet with its ``=`` padding, no line breaks or other characters:
  `base64.b64decode` with ``validate=True``);
- ``unsupported_data_url``: well formed, but not what the slot takes: a media
  type other than ``image/*`` for an image or ``video/*`` for a video
  (``text/html``), or a data URL that is not base64-encoded;
- ``media_too_large``: the bytes it decodes to, known from the length of its
  text before anything is decoded, are over the dataset's bound.

A detail names the part (or the record's media entry) and the payload's length,
never the payload. The bytes then decode by their content, as a file's do: a
media type that names another image kind than the bytes hold is not a fault.
"""

from __future__ import annotations

import base64
import binascii

from zephon_core import BadSampleError

#: how far into a data URL its ``,`` may be (``data:`` + media type + parameters)
MAX_HEADER = 256


def is_data_url(ref: object) -> bool:
    return isinstance(ref, str) and ref[:5].lower() == "data:"


def _kind(video: bool) -> str:
    return "video" if video else "image"


def inline_item(url: str, video: bool, where: object, label: str) -> dict:
    """The media item of data URL `url` in a slot for a video or an image; `label` names
    the place in the record (``message 1, part 0 (image_url)``) for drop details."""
    comma = url.find(",", 0, MAX_HEADER)
    if comma < 0:
        raise _fault("bad_data_url", where, label, f"a data: URL without the ',' that ends "
                     f"its header in its first {MAX_HEADER} characters", len(url))
    params = [p.strip().lower() for p in url[5:comma].split(";")]
    if params[-1] != "base64":
        raise _fault("unsupported_data_url", where, label, "a data: URL that is not "
                     "base64-encoded (';base64,'); only base64 data URLs are decoded",
                     len(url) - comma - 1)
    if not params[0] or len(params) < 2:
        raise _fault("bad_data_url", where, label, "a data: URL that names no media type "
                     f"(data:{_kind(video)}/...;base64,...)", len(url) - comma - 1)
    return _item(url, comma + 1, params[0], video, where, label)


def source_item(media_type: str, data: str, video: bool, where: object, label: str) -> dict:
    """The media item of Anthropic's ``{"type": "base64", "media_type", "data"}``."""
    return _item(data, 0, media_type.strip().lower(), video, where, label)


def _item(text: str, start: int, media_type: str, video: bool, where: object,
          label: str) -> dict:
    kind = _kind(video)
    if media_type.partition("/")[0] != kind:
        raise _fault("unsupported_data_url", where, label, f"base64 {media_type!r} data "
                     f"where {'a video' if video else 'an image'} goes ({kind}/... is "
                     "read)", len(text) - start)
    return {"video": video, "inline": text, "start": start, "media_type": media_type,
            "label": label, "name": f"{label}: data:{media_type}"}


def decoded_size(text: str, start: int) -> int | None:
    """The bytes base64 `text[start:]` decodes to, from its length; None when its length
    or padding cannot be base64's."""
    n = len(text) - start
    if n % 4:
        return None
    pad = 2 if text.endswith("==") else 1 if text.endswith("=") else 0
    return n // 4 * 3 - pad if n > pad else None


def decode_inline(item: dict, limit: int, where: object) -> bytes:
    """The bytes of inline media `item` (from `inline_item`/`source_item`), at most
    `limit` of them: the size is checked on the text's length, before decoding."""
    text, start, label = item["inline"], item["start"], item["label"]
    length = len(text) - start
    size = decoded_size(text, start)
    if not size:
        raise _fault("bad_data_url", where, label, "base64 text of a length base64 never "
                     "has (empty, cut short, or holding line breaks)", length)
    kind = _kind(item["video"])
    if size > limit:
        raise BadSampleError("media_too_large", str(where), f"{label}: base64 "
                             f"{item['media_type']} data of {size:,} bytes, over "
                             f"max_{kind}_bytes {limit:,}; not decoded")
    try:
        return base64.b64decode(text[start:] if start else text, validate=True)
    except (binascii.Error, ValueError):
        raise _fault("bad_data_url", where, label, "text that is not base64 (the standard "
                     "alphabet, '=' padding, no line breaks)", length) from None


def _fault(reason: str, where: object, label: str, what: str, length: int) -> BadSampleError:
    return BadSampleError(reason, str(where), f"{label}: {what} ({length:,} characters of "
                          "data, not decoded)")
