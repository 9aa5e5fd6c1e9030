"""The CPU launcher's chunked gated delta rule equals the per-token reference.

qwen3_5's GatedDeltaNet layers run on CPU through `chunked_gated_delta_rule`
(the per-token loop made a training step minutes long); outputs and
gradients must be those of `naive_gated_delta_rule`, across document
boundaries and chunk boundaries alike.
"""

from __future__ import annotations

import pytest
import torch

from zephon_vl.testing.titan_cpu import chunked_gated_delta_rule, naive_gated_delta_rule


def _inputs(T: int, H: int, K: int, V: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(1, T, H, V, generator=gen)
    g = -2 * torch.rand(1, T, H, generator=gen)  # log decay
    beta = torch.rand(1, T, H, generator=gen)
    return [x.requires_grad_() for x in (q, k, v, g, beta)]


@pytest.mark.parametrize(("bounds", "chunk"), [
    ([0, 40], 64),                 # one chunk
    ([0, 40], 8),                  # five chunks, the state crosses four boundaries
    ([0, 1, 13, 14, 37, 40], 8),   # documents of 1 token and documents across chunks
    (None, 16),                    # no cu_seqlens: one document
])
def test_chunks_give_the_per_token_rule_outputs_and_gradients(bounds, chunk) -> None:
    weights = torch.linspace(-1, 1, 40 * 3 * 5).view(1, 40, 3, 5)
    results = []
    for rule in (naive_gated_delta_rule,
                 lambda *a, **kw: chunked_gated_delta_rule(*a, chunk=chunk, **kw)):
        inputs = _inputs(40, 3, 4, 5, seed=7)
        out = rule(*inputs, cu_seqlens_host=bounds)
        (out * weights).sum().backward()
        results.append([out.detach(), *(x.grad for x in inputs)])
    for name, a, b in zip(["out", "q", "k", "v", "g", "beta"], *results, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


def test_a_state_reset_at_each_document() -> None:
    """A document's output does not depend on the document before it."""
    inputs = _inputs(30, 2, 4, 4, seed=3)
    together = chunked_gated_delta_rule(*inputs, cu_seqlens_host=[0, 11, 30], chunk=8)
    alone = chunked_gated_delta_rule(*(x[:, 11:] for x in inputs), chunk=8)
    torch.testing.assert_close(together[:, 11:], alone)
