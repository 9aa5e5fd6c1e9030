"""fold_vocab keeps a qwen3_5 batch's vision placeholders findable (the gpu_smoke crash)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

from zephon_vl.testing.tiny_model import fold_vocab  # noqa: E402
from zephon_vl.titan.dataloader import ZephonDataLoader  # noqa: E402


@pytest.fixture(scope="module")
def qwen_micro():
    cfg = ZephonDataLoader.Config(runner="inline", recipe="vlm-demo", num_lanes=2,
                                  global_batch_size=2, model_format="qwen3_5",
                                  image_preset="qwen3_5", max_pixels=16 * 32 * 32,
                                  min_pixels=4096)
    dl = cfg.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=256,
                   local_batch_size=2, snapshot_every_n_steps=None)
    micro = [next(iter(dl))]
    dl.close()
    return micro


def test_fold_keeps_special_ids_distinct_and_in_range(qwen_micro):
    vocab = 2048
    (x, y), = qwen_micro
    (fx, fy), = fold_vocab(qwen_micro, vocab)
    special = x["special_tokens"]
    folded = fx["special_tokens"]
    assert set(folded) == set(special)
    assert len(set(folded.values())) == len(set(special.values()))
    assert all(0 <= v < vocab for v in folded.values())
    assert int(fx["input"].max()) < vocab and int(fy.max()) < vocab
    for name, old in special.items():
        # every special token sits exactly where it was, and nothing else became one
        assert torch.equal(fx["input"] == folded[name], x["input"] == old), name
    assert torch.equal(fy == -100, y == -100)
    assert x["input"].max() >= vocab, "the fixture must hold ids to fold"


def test_text_batches_fold_modulo_vocab():
    x = {"input": torch.tensor([[5, 3000, 248000]]), "positions": torch.tensor([[0, 1, 2]])}
    y = torch.tensor([[3000, -100, 7]])
    (fx, fy), = fold_vocab([(x, y)], 2048)
    assert fx["input"].tolist() == [[5, 3000 % 2048, 248000 % 2048]]
    assert fy.tolist() == [[3000 % 2048, -100, 7]]
