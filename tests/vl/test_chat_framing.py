"""Chat framing per model family (issue 21, item 5): token for token equal to the chat
template under ``chat = "template"``, today's framing by default, every setting
documented, fingerprinted when not the default.

The reference is `transformers`' ``apply_chat_template`` with the family's template:
Qwen2-VL's own (the bundled Qwen tokenizer folder carries none, so the test holds
Qwen/Qwen2-VL-7B-Instruct's ``chat_template``, the one transformers' Qwen2-VL processor
tests use), Kimi-VL's template with the ``<|media_begin|>`` tokens of TorchTitan's
Kimi K2.5 (what zephon_vl.families.kimi documents), and plain ChatML for Muse Glimmer
(TorchTitan defines no template for it). Conversations are generated: system turn or
not, one to three exchanges, zero to three images per user turn, neighbouring text parts.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.helpers.vl import demo_shards, run_epoch
from zephon_core import (
    ChatFraming,
    CheckpointError,
    ConfigError,
    Execution,
    Loader,
    qwen_tokenizer_dir,
    text_loader,
    text_recipe,
)
from zephon_core.ops.pack import FILLER_ORIGIN
from zephon_vl.families.kimi import kimi_tokenizer_dir
from zephon_vl.families.registry import get_family
from zephon_vl.media.image import ImageSettings, VisionPatches
from zephon_vl.ops.multimodal import TokenizeMultimodal
from zephon_vl.recipes import vlm_recipe

INLINE = Execution(runner="inline", prefetch_steps=0)

#: Qwen/Qwen2-VL-7B-Instruct's chat template (also Qwen2.5-VL's), verbatim.
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN_DEFAULT_SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
#: Qwen2-VL's template without its default system turn: plain ChatML with image parts.
CHATML = QWEN2_VL_TEMPLATE.replace(
    "{% if loop.first and message['role'] != 'system' %}" + QWEN_DEFAULT_SYSTEM + "{% endif %}",
    "")
#: Kimi-VL's chat template, images as TorchTitan's Kimi K2.5 tokens.
KIMI_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and messages[0]['role'] != 'system' -%}"
    "{{'<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>'}}"
    "{%- endif -%}"
    "{%- if message['role'] == 'system' -%}{{'<|im_system|>'}}{%- endif -%}"
    "{%- if message['role'] == 'user' -%}{{'<|im_user|>'}}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{{'<|im_assistant|>'}}{%- endif -%}"
    "{{- message['role'] -}}{{'<|im_middle|>'}}"
    "{%- if message['content'] is string -%}{{- message['content'] + '<|im_end|>' -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' -%}{{'<|media_begin|><|media_pad|><|media_end|>'}}"
    "{%- else -%}{{content['text']}}{%- endif -%}{%- endfor -%}{{'<|im_end|>'}}"
    "{%- endif -%}{%- endfor -%}"
)
KIMI_DEFAULT_SYSTEM = "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>"

FAMILIES = {
    # family: (tokenizer folder, template, its default system turn, image pad, closing)
    "qwen3_5": (qwen_tokenizer_dir, QWEN2_VL_TEMPLATE, QWEN_DEFAULT_SYSTEM, "<|image_pad|>",
                "<|im_end|>\n"),
    "muse_glimmer": (qwen_tokenizer_dir, CHATML, "", "<|image_pad|>", "<|im_end|>\n"),
    "kimi_k2_5": (kimi_tokenizer_dir, KIMI_TEMPLATE, KIMI_DEFAULT_SYSTEM, "<|media_pad|>",
                  "<|im_end|>"),
}

_tokenizers: dict = {}


def hf(family: str):
    """`transformers`' tokenizer of the family's folder (special tokens recognized in the
    rendered template, as a trainer reads it)."""
    if family not in _tokenizers:
        from transformers import AutoTokenizer

        _tokenizers[family] = AutoTokenizer.from_pretrained(str(FAMILIES[family][0]()))
    return _tokenizers[family]


_ops: dict = {}


def tokenize_op(family: str, chat: ChatFraming) -> TokenizeMultimodal:
    key = (family, chat)
    if key not in _ops:
        op = TokenizeMultimodal(FAMILIES[family][0](), 2, 1 << 16, family=family, chat=chat)
        op.setup()
        _ops[key] = op
    return _ops[key]


#: text a turn may hold: letters, digits, punctuation, spaces, line breaks, non-ASCII; a
#: turn's text never starts with whitespace that holds a line break (see
#: `test_a_turn_starting_with_a_line_break_differs_from_the_template_by_one_seam`)
TEXT = st.text(alphabet="abcXYZ 019.,?!'\"\n\té中ß-", max_size=12)
FIRST = TEXT.filter(lambda s: "\n" not in s[:len(s) - len(s.lstrip())])


@st.composite
def conversations(draw) -> list[dict]:
    """Turns as zephon reads them: ``{"role", "content": [str | None]}``."""
    turns = []
    if draw(st.booleans()):
        turns.append({"role": "system", "content": [draw(FIRST)]})
    for _ in range(draw(st.integers(1, 3))):
        pieces: list = []
        for _ in range(draw(st.integers(1, 4))):
            if draw(st.integers(0, 2)) == 0:
                pieces.append(None)
            else:
                pieces.append(draw(FIRST if not pieces else TEXT))
        turns.append({"role": "user", "content": pieces})
        turns.append({"role": "assistant", "content": [draw(FIRST.filter(bool)), draw(TEXT)]})
    for t in turns:  # neighbouring pieces are joined: the joined start is what counts
        lead = "".join(itertools.takewhile(lambda p: p is not None, t["content"]))
        assume("\n" not in lead[:len(lead) - len(lead.lstrip())])
    return turns


def to_messages(turns: list[dict]) -> list[dict]:
    """The same chat as `transformers` messages with content parts."""
    return [{"role": t["role"],
             "content": [{"type": "image"} if p is None else {"type": "text", "text": p}
                         for p in t["content"]]} for t in turns]


def patches(grids: list[tuple[int, int]]) -> list[VisionPatches]:
    return [VisionPatches(np.zeros((h * w, 3), np.float32), np.array([1, h, w], np.int64))
            for h, w in grids]


def template_ids(family: str, messages: list[dict], grids: list[tuple[int, int]],
                 drop_default_system: bool = False) -> list[int]:
    """``apply_chat_template`` ids with each image's one pad expanded to its merged patches
    (the family's placeholder expansion)."""
    tok = hf(family)
    _, template, default_system, pad_text, _ = FAMILIES[family]
    text = tok.apply_chat_template(messages, chat_template=template, tokenize=False)
    if drop_default_system and default_system and messages[0]["role"] != "system":
        assert text.startswith(default_system)
        text = text[len(default_system):]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pad = tok.convert_tokens_to_ids(pad_text)
    runs = iter(h * w // 4 for h, w in grids)
    out: list[int] = []
    for i in ids:
        out += [pad] * next(runs) if i == pad else [i]
    assert next(runs, None) is None
    return out


def zephon(family: str, chat: ChatFraming, turns: list[dict],
           grids: list[tuple[int, int]]) -> dict:
    doc = {"kind": "conversation", "turns": turns, "vision": patches(grids),
           "video": [False] * len(grids), "key": "k", "shard": "s"}
    return tokenize_op(family, chat).tokenize(doc)


def grids_for(turns: list[dict], data) -> list[tuple[int, int]]:
    n = sum(p is None for t in turns for p in t["content"])
    return [data.draw(st.tuples(st.sampled_from([2, 4, 6]), st.sampled_from([2, 4])))
            for _ in range(n)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=conversations(), data=st.data())
def test_template_framing_equals_the_chat_template(family, turns, data) -> None:
    """``chat = "template"``: the ids are ``apply_chat_template``'s, default system prompt
    included when the chat has none, no end-of-text; only assistant turns are trained."""
    grids = grids_for(turns, data)
    framing = get_family(family).template_framing
    out = zephon(family, framing, turns, grids)
    assert out["tokens"].tolist() == template_ids(family, to_messages(turns), grids)
    closing = FAMILIES[family][4]
    trained = hf(family).decode(out["tokens"][out["targets"]].tolist())
    assert trained == "".join("".join(t["content"]) + closing for t in turns
                              if t["role"] == "assistant")


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=conversations(), data=st.data())
def test_default_framing_is_the_template_without_system_prompt_plus_end_of_text(
        family, turns, data) -> None:
    """The default (every family's): no system prompt added, a trained end-of-text."""
    grids = grids_for(turns, data)
    out = zephon(family, get_family(family).chat_framing, turns, grids)
    eos = hf(family).eos_token_id
    want = template_ids(family, to_messages(turns), grids, drop_default_system=True)
    assert out["tokens"].tolist() == want + [eos]
    assert bool(out["targets"][-1])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=conversations(), data=st.data(), prompt=FIRST,
       roles=st.sampled_from([("assistant",), ("user", "assistant"), ("system", "assistant")]),
       turn_end=st.booleans(), eot=st.booleans(), train_eot=st.booleans())
def test_every_setting_does_what_it_says(turns, data, prompt, roles, turn_end, eot,
                                         train_eot) -> None:
    """A custom system prompt is the template given that system turn; `train_roles`,
    `train_turn_end` and `train_end_of_text` decide exactly which tokens are targets."""
    grids = grids_for(turns, data)
    chat = ChatFraming(system_prompt=prompt, train_roles=roles, train_turn_end=turn_end,
                       end_of_text=eot, train_end_of_text=train_eot)
    out = zephon("qwen3_5", chat, turns, grids)
    tok = hf("qwen3_5")
    framed = turns if turns[0]["role"] == "system" else \
        [{"role": "system", "content": [prompt]}, *turns]
    want = template_ids("qwen3_5", to_messages(framed), grids)
    assert out["tokens"].tolist() == want + ([tok.eos_token_id] if eot else [])
    trained = "".join("".join(p for p in t["content"] if p is not None)
                      + ("<|im_end|>\n" if turn_end else "")
                      for t in framed if t["role"] in roles)
    trained += "<|endoftext|>" if eot and train_eot else ""
    assert tok.decode(out["tokens"][out["targets"]].tolist()) == trained


def test_a_turn_starting_with_a_line_break_differs_from_the_template_by_one_seam() -> None:
    """The documented difference: zephon tokenizes ``user\\n`` and the turn's text apart
    (a target mask must fall on a token boundary); the template's string merges
    ``\\n\\n`` into one token. Same text, one token more."""
    turns = [{"role": "user", "content": ["\nhi"]}, {"role": "assistant", "content": ["yo"]}]
    out = zephon("qwen3_5", get_family("qwen3_5").template_framing, turns, [])
    want = template_ids("qwen3_5", to_messages(turns), [])
    tok = hf("qwen3_5")
    assert out["tokens"].tolist() != want
    assert tok.decode(out["tokens"].tolist()) == tok.decode(want)
    assert len(out["tokens"]) == len(want) + 1


def test_framing_settings_are_fingerprinted_only_when_not_default() -> None:
    """Old checkpoints (no ``chat`` in the tokenizer's settings) keep their fingerprint;
    a changed framing is in it."""
    base = TokenizeMultimodal(qwen_tokenizer_dir(), 2, 1024).settings()
    assert "chat" not in base
    chat = TokenizeMultimodal(qwen_tokenizer_dir(), 2, 1024,
                              chat=get_family("qwen3_5").template_framing).settings()
    assert chat == {**base, "chat": {"system_prompt": "You are a helpful assistant.",
                                     "end_of_text": False}}
    assert ChatFraming(train_roles=["user", "assistant"]).settings() == \
        {"train_roles": ["user", "assistant"]}


def test_bad_framing_settings_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="train_roles names 'tool', which is none of "
                                          "system, user, assistant"):
        ChatFraming(train_roles=("tool",))
    with pytest.raises(ConfigError, match="unknown key 'system' in \\[chat\\]"):
        get_family("qwen3_5").framing({"system": "x"})
    with pytest.raises(ConfigError, match="template"):
        get_family("qwen3_5").framing("qwen2")
    with pytest.raises(ConfigError, match="end_of_text must be true or false"):
        ChatFraming(end_of_text="no")


# --- the text recipe: chat records, same masking -------------------------------------


def write_chats(path, n: int = 24) -> list[dict]:
    records = []
    for i in range(n):
        turns = [{"from": "human", "value": f"Question {i}: what is {i} + {i}?"},
                 {"from": "gpt", "value": f"It is {2 * i}."}]
        if i % 3 == 0:
            records.append({"conversations": turns})
        elif i % 3 == 1:
            records.append({"messages": [{"role": "user", "content": turns[0]["value"]},
                                         {"role": "assistant", "content": turns[1]["value"]}]})
        else:
            records.append({"text": f"Plain document number {i}, trained in full."})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_text_loader_reads_chat_records_with_assistant_only_labels(tmp_path) -> None:
    """A JSONL mixing text and chat records (LLaVA's from/value or role/content): chats are
    ChatML, their labels only the assistant answers, ``<|im_end|>\\n`` and the end of text;
    text records are trained in full, as before."""
    write_chats(tmp_path / "chat.jsonl")
    loader = text_loader([tmp_path / "chat.jsonl"], qwen_tokenizer_dir(), seq_len=256,
                         global_batch_size=2, num_lanes=2, shuffle_buffer=0,
                         execution=INLINE)
    tok = hf("qwen3_5")
    seen = {"chat": 0, "text": 0}
    for _, batch in zip(range(3), loader, strict=False):
        for inp, lab, pos in zip(batch["input"], batch["labels"], batch["positions"],
                                 strict=True):
            starts = [i for i in range(len(pos)) if pos[i] == 0] + [len(pos)]
            for a, b in zip(starts, starts[1:], strict=False):
                ids, labels = inp[a:b].tolist(), lab[a:b].tolist()
                text = tok.decode(ids)
                if not text.replace("<|endoftext|>", ""):
                    continue  # padding
                trained = tok.decode([t for t in labels if t != -100])
                if text.startswith("<|im_start|>user\n"):
                    answer = text.split("<|im_start|>assistant\n")[1]
                    # labels are the next tokens: the first answer token is predicted from
                    # the opening's last, so the trained text is the answer onward
                    assert trained == answer, text
                    seen["chat"] += 1
                else:
                    assert trained == text[len(tok.decode(ids[:1])):], text
                    seen["text"] += 1
    assert seen["chat"] >= 4 and seen["text"] >= 2


def test_text_recipe_chat_framing_is_a_setting_and_resume_refuses_a_change(tmp_path) -> None:
    write_chats(tmp_path / "chat.jsonl")
    args = dict(seq_len=256, global_batch_size=2, num_lanes=2, shuffle_buffer=0,
                execution=INLINE)
    plain = text_loader([tmp_path / "chat.jsonl"], qwen_tokenizer_dir(), **args)
    next(iter(plain))
    state = plain.state_dict()
    framed = text_loader([tmp_path / "chat.jsonl"], qwen_tokenizer_dir(),
                         chat={"system_prompt": "Be brief."}, **args)
    with pytest.raises(CheckpointError, match="chat"):
        framed.load_state_dict(state)
    again = text_loader([tmp_path / "chat.jsonl"], qwen_tokenizer_dir(), **args)
    again.load_state_dict(state)
    first = next(iter(framed))
    assert "Be brief." in hf("qwen3_5").decode(first["input"].reshape(-1).tolist())


def test_a_text_chat_with_an_image_slot_is_dropped_naming_why(tmp_path) -> None:
    (tmp_path / "c.jsonl").write_text(json.dumps({"conversations": [
        {"from": "human", "value": "<image>\nwhat?"}, {"from": "gpt", "value": "x"}]}) + "\n"
        + json.dumps({"text": "fine"}) + "\n")
    recipe = text_recipe([tmp_path / "c.jsonl"], qwen_tokenizer_dir(), seq_len=64,
                         global_batch_size=2, num_lanes=2, on_error="drop", epochs=1)
    epoch = run_epoch(Loader(recipe, execution=INLINE))
    assert [r for _, r in epoch.drops()] == ["placeholder_mismatch"]


# --- the filler, per dataset --------------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return demo_shards(tmp_path_factory)


def test_a_dataset_can_turn_the_row_filler_off(shards, tmp_path) -> None:
    """``image_every_row = false`` on a text dataset: rows made of its documents only carry
    no image; a row with a document of a dataset that keeps the filler still gets one."""
    from zephon_core.engine.plan import Plan
    from zephon_core.engine.simulate import SimulatedRanks
    from zephon_core.recipes.assets import text_corpus

    corpus = [str(p) for p in text_corpus()]
    recipe = vlm_recipe({"photos": shards, "text": {"files": corpus, "image_every_row": False},
                         "more": corpus[:1]},
                        qwen_tokenizer_dir(), seq_len=1024, global_batch_size=8, num_lanes=4,
                        image=ImageSettings(max_pixels=128 * 28 * 28), pack={"max_images": 8},
                        shuffle_buffer=16, weights={"photos": 1.0, "text": 8.0, "more": 2.0})
    sim = SimulatedRanks(recipe, 1, INLINE, Plan(recipe.ops, INLINE).make_runners())
    rows = [r for _ in range(4) for ld in sim.loaders for r in ld.next_rows()]
    seen = {"bare": 0, "filled": 0}
    for row in rows:
        own = [s for s in row.segments if s.origin != FILLER_ORIGIN]
        filled = len(own) != len(row.segments)
        has_image = any(len(s.payload["grid_thw"]) for s in own)
        wants = any(s.origin.dataset != 1 for s in own)
        assert filled == (wants and not has_image)
        seen["filled"] += filled
        seen["bare"] += not wants and not has_image
    assert seen["bare"] and seen["filled"]
    fingerprint = next(op.settings() for op in recipe.ops if op.name == "pack")["filler"]
    assert fingerprint["datasets"] == [0, 2]


def test_a_vlm_recipe_file_frames_chats_by_the_template_and_masks_labels(tmp_path) -> None:
    """``kind = "vlm"`` with ``chat = "template"`` and a text chat dataset whose filler is
    off: through the whole pipeline (read, tokenize, pack, collate) every chat of a batch
    is the template's ids, and its labels are its assistant answers only."""
    from zephon_core import load_recipe

    records = write_chats(tmp_path / "chat.jsonl")
    chats = [r for r in records if "text" not in r]
    (tmp_path / "r.toml").write_text(
        'kind = "vlm"\nseq_len = 512\nglobal_batch_size = 2\nnum_lanes = 2\n'
        'shuffle_buffer = 0\nchat = "template"\n'
        '[[datasets]]\nname = "chat"\nfiles = ["chat.jsonl"]\nimage_every_row = false\n')
    recipe = load_recipe(str(tmp_path / "r.toml"))
    assert next(op.filler for op in recipe.ops if op.name == "pack") is None
    tok = hf("qwen3_5")
    rendered = {}
    for r in chats:
        turns = r.get("messages") or [{"role": {"human": "user", "gpt": "assistant"}[t["from"]],
                                       "content": t["value"]} for t in r["conversations"]]
        text = tok.apply_chat_template(turns, chat_template=QWEN2_VL_TEMPLATE, tokenize=False)
        rendered[tuple(tok(text, add_special_tokens=False)["input_ids"])] = \
            turns[-1]["content"] + "<|im_end|>\n"
    loader = Loader(recipe, execution=INLINE)
    seen = 0
    for _, batch in zip(range(3), loader, strict=False):
        for inp, lab, pos in zip(batch["input"], batch["labels"], batch["positions"],
                                 strict=True):
            starts = [i for i in range(len(pos)) if pos[i] == 0] + [len(pos)]
            for a, b in zip(starts, starts[1:], strict=False):
                ids = inp[a:b].tolist()
                while ids and ids[-1] == tok.eos_token_id:  # padding after the last one
                    ids.pop()
                if not ids:
                    continue
                if tok.decode(ids).startswith("<|im_start|>"):
                    assert tuple(ids) in rendered, tok.decode(ids)
                    trained = tok.decode([t for t in lab[a:b].tolist() if t != -100])
                    assert trained == rendered[tuple(ids)]
                    seen += 1
                else:
                    assert tok.decode(ids).startswith("Plain document number")
    loader.close()
    assert seen >= 4
