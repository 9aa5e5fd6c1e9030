"""Chat framing: how a conversation's turns become tokens and prediction targets.

A conversation is a list of turns ``{"role": "system" | "user" | "assistant",
"content": [str | None, ...]}``; None in the content is a media slot (where a
model family puts an image's or a video's placeholder run). Two things decide
its tokens:

* the **turn tokens**, which open and close a turn of a role: a model
  family's (`zephon_vl.families`), or ChatML's (`chatml_turn`) for a text
  recipe: ``<|im_start|>role\\n`` ... ``<|im_end|>\\n``;
* the **framing** (`ChatFraming`), the rest of what a chat template decides
  plus what is trained: a default system prompt for chats without one, which
  roles' turns are targets and whether their closing tokens are, and whether
  an end-of-text token follows each document.

Control tokens are inserted by id; the text of a turn is tokenized as text
(guarantee 8: untrusted text never becomes control tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from zephon_core.common.settings import (
    check_choices,
    setting,
    settings_fingerprint,
    settings_from_table,
)
from zephon_core.errors import BadSampleError, ConfigError

#: the text placeholder of a media slot in a string turn (LLaVA's convention)
MEDIA_PLACEHOLDER = "<image>"
#: a turn's role as datasets write it -> the role zephon frames (LLaVA/ShareGPT's
#: ``human``/``gpt`` included)
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "system": "system"}
CHAT_ROLES = ("system", "user", "assistant")
#: the record keys a chat is read from, in order
CHAT_KEYS = ("conversations", "messages")

Encode = Callable[[str], list[int]]
TurnTokens = Callable[[str], tuple[list[int], list[int]]]


@dataclass(frozen=True)
class ChatFraming:
    """What a chat template decides beyond the turn tokens, and what is trained (a
    recipe's ``[chat]``; each field's meaning is its declaration).

    The defaults are how zephon has always framed documents; each family
    states its own (``VisionFamily.chat_framing``) and the framing its chat
    template gives exactly (``VisionFamily.template_framing``).
    """

    system_prompt: str | None = setting(
        None, since="0.3.0",
        help="a system turn with this text goes before a chat whose first turn is not "
        "a system turn (none: no system turn is added)")
    train_roles: tuple[str, ...] = setting(
        ("assistant",), since="0.3.0", choices=CHAT_ROLES,
        help="the roles whose turns are targets (their text; media slots and turn openings "
        "never are)")
    train_turn_end: bool = setting(
        True, since="0.3.0",
        help="a trained turn's closing tokens (<|im_end|>\\n in ChatML) are targets too")
    end_of_text: bool = setting(
        True, since="0.3.0",
        help="the tokenizer's end-of-text token follows every document (chat, caption, "
        "interleaved, text)")
    train_end_of_text: bool = setting(True, since="0.3.0",
                                      help="that end-of-text is a target")

    def __post_init__(self) -> None:
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ConfigError(f"chat system_prompt must be a string or None, got "
                              f"{self.system_prompt!r}")
        roles = self.train_roles
        if isinstance(roles, str) or not all(isinstance(r, str) for r in roles):
            raise ConfigError(f"chat train_roles must be a list of roles, got {roles!r}")
        object.__setattr__(self, "train_roles", tuple(roles))
        check_choices(self)
        for name in ("train_turn_end", "end_of_text", "train_end_of_text"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"chat {name} must be true or false, got "
                                  f"{getattr(self, name)!r}")

    def settings(self) -> dict:
        """The fields that differ from the defaults, for checkpoint fingerprints: every
        field is declared ``since`` 0.3.0, so a checkpoint written before framing was a
        setting keeps a valid fingerprint, and a resume with a changed framing is refused
        naming the field."""
        return settings_fingerprint(self)

    def end_of_text_piece(self, eos: int | None) -> list[tuple[str, Any, bool]]:
        """The piece that ends every document: ``[]`` without one."""
        if not self.end_of_text or eos is None:
            return []
        return [("text", [eos], self.train_end_of_text)]


def chat_framing(value: ChatFraming | Mapping[str, Any] | None,
                 default: ChatFraming | None = None) -> ChatFraming:
    """A framing given as itself, as a ``[chat]`` table (fields over `default`'s), or None
    (`default`, else `ChatFraming()`)."""
    base = default or ChatFraming()
    if value is None:
        return base
    if isinstance(value, ChatFraming):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"chat must be a table of ChatFraming fields ([chat]), got {value!r}")
    return settings_from_table(ChatFraming, value, "chat", base)


def chatml_turn(im_start: int, im_end: int, role: str,
                encode: Encode) -> tuple[list[int], list[int]]:
    """ChatML's turn tokens: ``<|im_start|>role\\n`` and ``<|im_end|>\\n``."""
    return [im_start] + encode(f"{role}\n"), [im_end] + encode("\n")


def parse_turn(turn: Any, where: str) -> dict:
    """One conversation turn as ``{"role": str, "content": [str | None, ...]}``.

    Turns are ``{"role", "content"}`` or LLaVA/ShareGPT's ``{"from", "value"}``,
    their roles mapped by `ROLES` either way (a role it lacks is a ``bad_role`` drop:
    framed as written, it would train nothing). ``content`` is a string, where ``<image>`` marks
    a media slot, or a list of chat-template parts (``{"type": "text", "text":
    ...}``, ``{"type": "image"}``); either way it becomes text pieces with None
    where a slot goes.
    """
    if not isinstance(turn, dict):
        raise BadSampleError("bad_json", where, f"a conversation turn is {type(turn).__name__}, "
                             "not an object with 'role' and 'content'")
    if "from" in turn and "role" not in turn:
        raw, content = turn.get("from"), turn.get("value", "")
    else:
        raw, content = turn.get("role", "user"), turn.get("content", "")
    if not isinstance(raw, str):
        raise BadSampleError("bad_json", where, "a turn's 'role' is not a string")
    role = ROLES.get(raw)
    if role is None:
        raise BadSampleError("bad_role", where, f"role {raw!r} is none of "
                             f"{', '.join(sorted(ROLES))}")
    if isinstance(content, str):
        pieces: list[str | None] = []
        for j, chunk in enumerate(content.split(MEDIA_PLACEHOLDER)):
            if j:
                pieces.append(None)
            pieces.append(chunk)
        return {"role": role, "content": pieces}
    if not isinstance(content, list):
        raise BadSampleError("bad_json", where, f"a turn's 'content' is "
                             f"{type(content).__name__}, not a string or a list of parts")
    pieces = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif kind == "image":
            pieces.append(None)
        else:
            raise BadSampleError("bad_json", where, "a content part is not {'type': 'text', "
                                 "'text': str} or {'type': 'image'}: " + str(part)[:60])
    return {"role": role, "content": pieces}


def record_turns(record: dict, where: str) -> list[dict] | None:
    """A record's chat (`CHAT_KEYS`) as parsed turns; None when it holds none."""
    turns = record.get(CHAT_KEYS[0], record.get(CHAT_KEYS[1]))
    if not isinstance(turns, list):
        return None
    return [parse_turn(t, where) for t in turns]


def chat_pieces(turns: list[dict], framing: ChatFraming, turn_tokens: TurnTokens,
                encode: Encode) -> list[tuple[str, Any, bool]]:
    """A conversation as ``("text", ids, is_target)`` and ``("media", slot, False)`` pieces
    (slots numbered in order), framed by `turn_tokens(role)` and `framing`."""
    if turns and framing.system_prompt is not None and turns[0]["role"] != "system":
        turns = [{"role": "system", "content": [framing.system_prompt]}, *turns]
    out: list[tuple[str, Any, bool]] = []
    slots = 0
    for turn in turns:
        role = turn["role"]
        trained = role in framing.train_roles
        opening, closing = turn_tokens(role)
        out.append(("text", opening, False))
        for piece in _joined(turn["content"]):
            if piece is None:
                out.append(("media", slots, False))
                slots += 1
            else:
                out.append(("text", encode(piece), trained))
        out.append(("text", closing, trained and framing.train_turn_end))
    return out


def _joined(content: list[str | None]) -> list[str | None]:
    """Neighbouring text pieces of a turn as one (a chat template renders them as one
    string, and BPE merges across the seam: ``"Hel" + "lo"``)."""
    out: list[str | None] = []
    for piece in content:
        if piece is not None and out and out[-1] is not None:
            out[-1] += piece
        else:
            out.append(piece)
    return out
