"""The CPU launcher's qwen3_5 kernels equal their per-document references.

qwen3_5's GatedDeltaNet layers run on CPU through `chunked_gated_delta_rule`
(the per-token loop made a training step minutes long); outputs and
gradients must be those of `naive_gated_delta_rule`, across document
boundaries and chunk boundaries alike. The varlen causal conv
(`causal_conv1d_varlen`, masked shifts of the whole sequence) must equal one
`F.conv1d` per document, padding's one-token documents included.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zephon_vl.testing.titan_cpu import (
    causal_conv1d_varlen,
    chunked_gated_delta_rule,
    naive_gated_delta_rule,
)


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
    # a packed row's padding (one-token documents), a document that is exactly one chunk,
    # one that starts inside a chunk and ends inside the next but one
    ([0, 5, 6, 7, 8, 16, 17, 33, 34, 35, 40], 8),
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


def per_document_conv(x_btd, weight, bounds):
    """The reference: one depthwise causal ``F.conv1d`` + SiLU per document."""
    kw = weight.shape[-1]
    pieces = []
    for s, e in zip(bounds[:-1], bounds[1:], strict=True):
        seg = F.pad(x_btd[:, s:e].transpose(1, 2), [kw - 1, 0])
        pieces.append(F.silu(F.conv1d(seg, weight, None, groups=weight.shape[0]))
                      .transpose(1, 2))
    return torch.cat(pieces, dim=1)


@pytest.mark.parametrize("bounds", [
    [0, 40],                                # one document
    [0, 1, 2, 3, 13, 14, 15, 37, 38, 39, 40],  # one-token documents, ones shorter than K
    [0, 2, 30, 31, 40],
])
def test_varlen_conv_gives_the_per_document_conv_outputs_and_gradients(bounds) -> None:
    gen = torch.Generator().manual_seed(5)
    x0, w0 = torch.randn(1, 40, 6, generator=gen), torch.randn(6, 1, 4, generator=gen)
    weights = torch.linspace(-1, 1, 40 * 6).view(1, 40, 6)
    results = []
    for conv in (lambda x, w: per_document_conv(x, w, bounds),
                 lambda x, w: causal_conv1d_varlen(x, w, None, torch.tensor(bounds))):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        out = conv(x, w)
        (out * weights).sum().backward()
        results.append([out.detach(), x.grad, w.grad])
    for name, a, b in zip(["out", "x", "weight"], *results, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
