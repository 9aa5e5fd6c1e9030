"""The cheap tokenizer route (issue 39) gives transformers' ids on every kind of text.

`FastTokenizer` encodes each text with ``encode_batch_fast`` (no character offsets),
one text a call (no thread pool), and ASCII text without the Unicode normalizer. The
reference is ``AutoTokenizer.from_pretrained(path, split_special_tokens=True)`` on the
same folder: ids must not change, whatever the text looks like.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from zephon_core import Element, FastTokenizer, Tokenize, load_tokenizer, qwen_tokenizer_dir

SPECIAL_LOOKING = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|image_pad|>",
                   "<|vision_start|>", "<think>", "</think>", "<tool_call>", "<|im_end",
                   "|im_end|>", "<|IM_END|>", "< |im_end| >"]
UNICODE = ["中文文本的分词测试，包括标点符号。", "日本語のテキスト：ひらがな、カタカナ。",
           "한국어 문장입니다.", "emoji 😀🎉 flags 🇫🇷 family 👨‍👩‍👧 skin 👍🏽",
           "e\u0301 a\u0300 n\u0303 o\u0308\u0304", "é à ñ ȫ", "Tiếng Việt: người",
           "العربية", "שָׁלוֹם", "zero\u200bwidth\u00adsoft", "\ufeffBOM",
           "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ﬁ Å Å", "ｆｕｌｌ ＡＢＣ", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o"]
ASCII = ["def f(x):\n    return x ** 2  # square\n", "a\r\nb\rc\n\n\td", "   ", "",
         "x=1;y=2\t\t# tabs\n" * 30, "control \x07 bell \x1b[31m \x00 nul", "I'M HERE, it's",
         "don't you'LL 'S", "12345678901234567890 3.14159", "!!!???...,,,;;;"]


def varied_texts(seed: int = 0) -> list[str]:
    """Prose, code, Unicode in NFC and NFD, text that looks like control tokens, in ASCII
    documents and in non-ASCII ones, and long documents."""
    rng = random.Random(seed)
    words = ("the loader reads every shard once and keeps its place while ranks come and "
             "go data training batch token caption resume lane epoch").split()
    prose = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 300)))
             for _ in range(40)]
    mixed = [" ".join(rng.sample(SPECIAL_LOOKING + UNICODE + ASCII + prose[:5], 5))
             for _ in range(40)]
    return [*prose, *ASCII, *UNICODE, *(unicodedata.normalize("NFD", u) for u in UNICODE),
            *SPECIAL_LOOKING,
            *(f"{p} {s} {p}" for p, s in zip(prose[:12], SPECIAL_LOOKING, strict=True)),
            *mixed, "a" * 20_000, "字" * 5_000, "x" * 500 + "<|endoftext|>" * 100]


def transformers_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                         split_special_tokens=True)


@pytest.fixture(scope="module")
def qwen() -> tuple[FastTokenizer, object]:
    path = qwen_tokenizer_dir()
    return load_tokenizer(path), transformers_tokenizer(path)


def test_the_ids_are_transformers_ids_one_text_at_a_time_and_in_a_batch(qwen) -> None:
    ours, hf = qwen
    texts = varied_texts()
    assert any(t.isascii() for t in texts) and any(not t.isascii() for t in texts)
    expected = [hf(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert ours(texts, add_special_tokens=False)["input_ids"] == expected
    for text, ids in zip(texts, expected, strict=True):
        assert ours(text, add_special_tokens=False)["input_ids"] == ids, text[:60]
    control = set(ours.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>"]))
    assert not control & {i for ids in expected for i in ids}  # text never became one


def test_tokenize_gives_transformers_ids_plus_eos(qwen) -> None:
    ours, hf = qwen
    texts = varied_texts(seed=1)
    docs = Tokenize(qwen_tokenizer_dir()).process_many(
        [Element(i, {"text": t}) for i, t in enumerate(texts)])
    for text, doc in zip(texts, docs, strict=True):
        want = hf(text, add_special_tokens=False)["input_ids"] + [hf.eos_token_id]
        assert doc["tokens"].tolist() == want, text[:60]


def _folder_with_normalizer(root: Path, normalizer) -> Path:
    """A small byte-level BPE folder (trained on a few lines) with `normalizer`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|x|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(varied_texts(seed=2) * 3, trainer)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}))
    return root


@pytest.mark.parametrize("name", ["lowercase", "nfkc", "nfd_then_strip_accents"])
def test_a_normalizer_that_changes_ascii_is_applied_to_ascii_text(tmp_path, name) -> None:
    """Only Unicode normal forms leave ASCII text unchanged; a folder with any other
    normalizer (lowercasing here) normalizes every text, ASCII included."""
    from tokenizers import normalizers

    normalizer = {"lowercase": normalizers.Lowercase(), "nfkc": normalizers.NFKC(),
                  "nfd_then_strip_accents": normalizers.Sequence(
                      [normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase()])}
    folder = _folder_with_normalizer(tmp_path, normalizer[name])
    ours, hf = FastTokenizer(folder), transformers_tokenizer(folder)
    texts = ["HELLO World <|x|>", "Ünïcode ÀÉ", *varied_texts(seed=3)[:30]]
    assert ours(texts, add_special_tokens=False)["input_ids"] == \
        [hf(t, add_special_tokens=False)["input_ids"] for t in texts]


TOKENIZE_IN_A_FRESH_PROCESS = """
import os, sys, threading
from zephon_core import Element, Tokenize
texts = [("some text to tokenize, " * 400) + str(i) for i in range(200)] + ["naïve " * 400]
Tokenize(sys.argv[1]).process_many([Element(i, {"text": t}) for i, t in enumerate(texts)])
ticks = {}
for tid in os.listdir("/proc/self/task"):
    fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
    ticks[int(tid)] = int(fields[11]) + int(fields[12])
me = threading.get_native_id()
print(ticks[me], sum(t for tid, t in ticks.items() if tid != me))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc/self/task")
def test_tokenize_works_in_the_calling_thread() -> None:
    """The tokenizer works in the worker's own thread, so the engine's worker counts are
    the parallelism and a worker's CPU time is its tokenizing. (A batch call runs on the
    tokenizer library's thread pool, one thread per core in every worker process.)"""
    out = subprocess.run([sys.executable, "-c", TOKENIZE_IN_A_FRESH_PROCESS,
                          str(qwen_tokenizer_dir())], capture_output=True, text=True,
                         check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "true"})
    caller, others = (int(x) for x in out.stdout.split()[-2:])
    # other threads may take a few ticks while the process loads (a busy machine shows
    # 5 against 178); a pool doing the work takes most of them (73 on the old code)
    assert caller >= 20 and others * 10 <= caller, (caller, others, out.stderr)
