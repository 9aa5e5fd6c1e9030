"""``messages``: chats as role/content-part lists, the Hugging Face chat layout that
NVIDIA's Nemotron-VLM data also uses (JSON list, JSON Lines or Parquet)::

    {"messages": [
        {"role": "user", "content": [{"type": "image", "image": "photos/1.jpg"},
                                     {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]}

An image part names its file (``image``, ``path`` or ``url``) relative to
``image_folder``, or names nothing and takes the next entry of the record's
``images`` list (paths, or embedded ``{"bytes", "path"}`` as Parquet holds
them); ``{"type": "video", "video": ...}`` likewise with ``video_folder`` and
``videos``. A string ``content`` may carry ``<image>`` placeholders for the
``images`` list. Roles: ``system``, ``user``, ``assistant``.

Parts as API logs write them are read too, each the same sample as the file it
holds or names: OpenAI Chat Completions' ``{"type": "image_url", "image_url":
{"url": ...}}``, the Responses API's ``{"type": "input_image", "image_url":
"..."}`` (a string) with ``input_text``/``output_text`` parts, xtuner's and
Qwen's ``{"type": "video_url", "video_url": {"url": ...}}``, and Anthropic's
``{"type": "image", "source": {"type": "base64", "media_type", "data"}}`` or
``{"source": {"type": "url", "url"}}``. A URL may be a base64 ``data:`` URL
(`zephon_vl.formats.inline`). A part that does not fit is a ``bad_message_part``
drop whose detail names it (``message 1, part 0 (input_image): ...``), never its
payload.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from zephon_core import BadSampleError
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
from zephon_vl.formats.inline import source_item

_REF_KEYS = ("image", "path", "url", "video")
_TEXT = ("text", "input_text", "output_text")
_IMAGE = ("image", "image_url", "input_image")
_VIDEO = ("video", "video_url")
#: where a URL part keeps its URL (the Responses API's input_image: a string under image_url)
_URL_KEY = {"image_url": "image_url", "input_image": "image_url", "video_url": "video_url"}
#: parts that may name nothing and take the next entry of the record's images/videos list
_FROM_LIST = ("image", "image_url", "video")


def _bad_part(where: Where, label: str, detail: str) -> BadSampleError:
    return bad(where, f"{label}: {detail}", "bad_message_part")


def _url_of(value: Any) -> Any:
    """A URL given as a string (Responses API) or as ``{"url": ...}`` (Chat Completions)."""
    return value.get("url") if isinstance(value, dict) else value


def _part_ref(part: dict, kind: str, label: str, where: Where) -> Any:
    """What an image or video part names (None: nothing)."""
    if kind in _URL_KEY:
        ref = _url_of(part.get(_URL_KEY[kind]))
        if ref is None and kind == "input_image" and part.get("file_id") is not None:
            raise _bad_part(where, label, "names an uploaded file (file_id), whose bytes "
                            "the record does not hold; write its image_url (a URL or a "
                            "data: URL)")
        if ref is not None and (not isinstance(ref, str) or not ref):
            raise _bad_part(where, label, f"its URL is {type(ref).__name__} "
                            f"{str(ref)[:40]!r}, not a path, URL or data: URL")
        return ref
    for k in _REF_KEYS:
        value = part.get(k)
        if value is not None:
            return value
    return None


def _source_item(source: dict, label: str, where: Where) -> dict:
    """Anthropic's image ``source``: ``{"type": "base64", "media_type", "data"}`` or
    ``{"type": "url", "url"}`` (a URL under the same rule as every reference)."""
    how = source.get("type")
    if how == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not media_type:
            raise _bad_part(where, label, "a base64 source without its media_type")
        if not isinstance(data, str) or not data:
            raise _bad_part(where, label, "a base64 source without its data")
        return source_item(media_type, data, False, where, label)
    if how == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url:
            raise _bad_part(where, label, "a url source without its url")
        return media_item(url, False, where, label)
    raise _bad_part(where, label, f"a source of type {str(how)[:30]!r}; 'base64' and 'url' "
                    "sources are read (an uploaded file's bytes are not in the record)")


def message_part(part: Any, label: str, take: Callable[[bool], dict],
                 where: Where) -> str | dict:
    """One content part -> its text, or its media item (`take` gives the next entry of
    the record's images or videos list, for a part that names nothing)."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in _TEXT:
        text = part.get("text")
        if not isinstance(text, str):
            raise _bad_part(where, label, f"its 'text' is {type(text).__name__}, not a string")
        return text
    if kind not in _IMAGE and kind not in _VIDEO:
        keys = sorted(str(k)[:20] for k in part)[:8] if isinstance(part, dict) else []
        raise _bad_part(where, label, "not a part read here: text, input_text, output_text, "
                        "image, image_url, input_image, video or video_url (keys "
                        f"{keys})")
    # Anthropic's source is an object (null in a Parquet part that has none: a column
    # gives every part every field; a string is some data set's provenance note)
    if kind == "image" and isinstance(part.get("source"), dict):
        return _source_item(part["source"], label, where)
    video = kind in _VIDEO
    ref = _part_ref(part, kind, label, where)
    if ref is not None:
        return media_item(ref, video, where, label)
    if kind in _FROM_LIST:
        return take(video)
    raise _bad_part(where, label, "names no media: an image_url/video_url that is a URL, "
                    "a path or a data: URL")


def _label(m: int, p: int, part: Any) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    return f"message {m}, part {p} ({str(kind)[:30] if kind is not None else 'no type'})"


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

    for m, message in enumerate(raw):
        if not isinstance(message, dict):
            raise bad(where, f"a message is a {type(message).__name__}, not "
                      "{'role', 'content'}")
        role = role_of(message.get("role"), where)
        content = message.get("content")
        pieces: list[str | None] = []
        if isinstance(content, str):
            pieces, found = split_text(content)
            media += [take(mark == "<video>") for mark in found]
        elif isinstance(content, list):
            for p, part in enumerate(content):
                got = message_part(part, _label(m, p, part), take, where)
                if isinstance(got, str):
                    pieces.append(got)
                else:
                    media.append(got)
                    pieces.append(None)
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
