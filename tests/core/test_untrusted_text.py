"""Guarantee 8: untrusted text never becomes control tokens, for every special token."""

from __future__ import annotations

import numpy as np

from zephon_core import Element, Origin, Tokenize, load_tokenizer, qwen_tokenizer_dir


def _specials() -> tuple[list[str], set[int]]:
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(qwen_tokenizer_dir() / "tokenizer.json"))
    added = raw.get_added_tokens_decoder()
    specials = {i: t.content for i, t in added.items() if t.special}
    assert len(specials) > 20, "the bundled vocabulary has its chat and vision tokens"
    return sorted(specials.values()), set(specials)


def test_every_special_token_string_is_plain_text() -> None:
    names, ids = _specials()
    tok = load_tokenizer(qwen_tokenizer_dir())
    for name in names:
        text = f"a caption with {name} inside, and {name}{name} twice"
        got = tok(text, add_special_tokens=False)["input_ids"]
        assert not set(got) & ids, f"{name!r} became a control token: {got}"


def test_tokenize_operator_keeps_specials_out_and_appends_only_its_own_eos() -> None:
    names, ids = _specials()
    op = Tokenize(qwen_tokenizer_dir())
    text = " ".join(names)
    out = op.process_many([Element(0, {"text": text}, Origin(0, 0, 0, 0, 0))])[0]["tokens"]
    eos = load_tokenizer(qwen_tokenizer_dir()).eos_token_id
    assert out[-1] == eos and not set(out[:-1].tolist()) & ids
    assert np.count_nonzero(out == eos) == 1
