"""Make TorchTitan 0.3.0 run on a CPU-only torch build (gloo), for tests and demos.

TorchTitan's trainer and models assume CUDA. ``apply()`` installs the smallest
set of runtime patches (no file is edited) that we found necessary on torch
2.13+cpu; each patch says why it exists. Call it BEFORE importing anything
from torchtitan (``torchtitan.tools.utils`` picks the device type at import).

Launcher (the trainer, on CPU, with torchrun and gloo)::

    torchrun --nproc_per_node=2 -m zephon_vl.testing.titan_cpu \\
        --module zephon_vl.titan --config zephon_llama3_debug --training.steps 10

The ``qwen3_5`` model also needs ``triton``, ``fla-core`` and
``flash-linear-attention`` installed with ``--no-deps`` (its module imports
them; their Triton kernels are replaced by the pure-torch references below).
``muse_glimmer`` is FSDP-wrapped without SPMD mesh dims (`_apply_muse_glimmer`);
``kimi_k2_5`` needs nothing of its own. `pil_torchvision` lets TorchTitan's own
multimodal sample pipeline run without torchvision (tests compare with it).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
import warnings

import torch
import torch._utils
import torch.nn.functional as F

_APPLIED = False
_QWEN_APPLIED = False


def _patch_device_type() -> None:
    """``torchtitan.tools.utils`` computes ``device_type`` at import from
    ``torch._utils._get_available_device_type()``, which is None on a CPU build;
    TorchTitan then falls back to "cuda" and ``Trainer.__init__`` dies in
    ``torch.cuda.set_device``. Report "cpu"."""
    torch._utils._get_available_device_type = lambda: "cpu"


def _patch_cpu_module() -> None:
    """``DeviceMemoryMonitor`` (components/metrics.py) calls ``get_device_name``,
    ``get_device_properties``, ``memory_stats`` ... on the device module;
    ``torch.cpu`` has none of them. Add inert stand-ins."""
    stubs = {
        "get_device_name": lambda *a, **k: "cpu",
        "get_device_properties": lambda *a, **k: types.SimpleNamespace(
            total_memory=24 * 1024**3, name="cpu"),
        "reset_peak_memory_stats": lambda *a, **k: None,
        "empty_cache": lambda *a, **k: None,
        "memory_stats": lambda *a, **k: {},
    }
    for name, fn in stubs.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, fn)


def dense_flex_attention(q, k, v, *, score_mod, block_mask, scale, enable_gqa, return_aux,
                         kernel_options):
    """FlexAttention has no CPU backward in torch 2.13 ("FlexAttention does not support
    backward on CPU"). Same maths with a dense mask materialised from the BlockMask's
    ``mask_mod`` (document-causal masks from zephon's positions), in float32."""
    from torch.nn.attention.flex_attention import AuxOutput, create_mask

    if score_mod is not None:
        raise NotImplementedError("the dense CPU attention does not support score_mod")
    B, Hq, Lq, D = q.shape
    mask = create_mask(block_mask.mask_mod, B, None, Lq, k.shape[2], device=q.device)
    if enable_gqa and k.shape[1] != Hq:
        rep = Hq // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scale = D ** -0.5 if scale is None else scale
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.nan_to_num(torch.exp(scores - lse.unsqueeze(-1)), nan=0.0)
    out = (probs @ v.float()).to(q.dtype)
    want_lse = return_aux is not None and return_aux.lse
    return out, AuxOutput(lse=lse if want_lse else None)


def _delta_rule_inputs(q, k, v, g, beta, cu_seqlens_host):
    """Both rules' inputs in float32, q and k L2-normalized (q also scaled), and the
    document bounds (one document without ``cu_seqlens``)."""
    q = F.normalize(q.float(), p=2, dim=-1) * (q.shape[-1] ** -0.5)
    k = F.normalize(k.float(), p=2, dim=-1)
    bounds = list(cu_seqlens_host) if cu_seqlens_host is not None else [0, q.shape[1]]
    return q, k, v.float(), g.float(), beta.float(), bounds


def naive_gated_delta_rule(q, k, v, g, beta, *, cu_seqlens_host=None):
    """Reference gated delta rule (FLA semantics with ``use_qk_l2norm_in_kernel=True``),
    replacing FLA's Triton kernel for qwen3_5's GatedDeltaNet layers. The state resets
    at every ``cu_seqlens`` boundary (every packed document). Shapes: q, k ``(1,T,H,K)``,
    v ``(1,T,H,V)``, g (log decay) and beta ``(1,T,H)``; returns ``(1,T,H,V)``."""
    dtype = v.dtype
    q, k, v, g, beta, bounds = _delta_rule_inputs(q, k, v, g, beta, cu_seqlens_host)
    H, K = q.shape[2:]
    outs = []
    for s, e in zip(bounds[:-1], bounds[1:], strict=True):
        S = q.new_zeros(H, K, v.shape[-1])
        for t in range(s, e):
            S = S * torch.exp(g[0, t]).view(H, 1, 1)
            kt, vt, bt = k[0, t], v[0, t], beta[0, t]
            v_new = (vt - torch.einsum("hk,hkv->hv", kt, S)) * bt.unsqueeze(-1)
            S = S + kt.unsqueeze(-1) * v_new.unsqueeze(1)
            outs.append(torch.einsum("hk,hkv->hv", q[0, t], S))
    return torch.stack(outs, 0).unsqueeze(0).to(dtype)


def _documents(bounds: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """For the tokens ``[bounds[0], bounds[-1])``: each one's document number and its
    document's first token (both relative to ``bounds[0]``)."""
    lengths = torch.tensor([e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True)],
                           device=device)
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    first = torch.tensor(bounds[:-1], device=device) - bounds[0]
    return doc, first[doc]


def _chunk_solutions(q, k, v, g, beta, doc, carried):
    """Every chunk's system at once (inputs ``(N, H, C[, D])``): the token
    corrections are ``w = U - W S`` for the state ``S`` the chunk starts from, the
    outputs ``P w + start * (q S)``, and the state after the chunk ``keep * S + B -
    M S``."""
    chunk, V = q.shape[2], v.shape[-1]
    cum = g.cumsum(-1)  # (N, H, C)
    seen = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril() & \
        (doc.unsqueeze(-1) == doc.unsqueeze(-2))
    gap = cum.unsqueeze(-1) - cum.unsqueeze(-2)  # G_i - G_j
    decay = torch.exp(gap.masked_fill(~seen, -torch.inf))
    start = (torch.exp(cum) * carried).unsqueeze(-1)
    system = (beta.unsqueeze(-1) * decay * (k @ k.transpose(-1, -2))).tril(-1)
    system = system + torch.eye(chunk, dtype=system.dtype, device=q.device)
    b = beta.unsqueeze(-1)
    uw = torch.linalg.solve_triangular(system, torch.cat([b * v, b * start * k], -1),
                                       upper=False, unitriangular=True)
    U, W = uw[..., :V], uw[..., V:]
    P = (q @ k.transpose(-1, -2)) * decay
    last = (doc == doc[..., -1:]).to(q.dtype)  # the tokens of the document that goes on
    to_end = (torch.exp(cum[..., -1:] - cum) * last).unsqueeze(-1)
    kt = k.transpose(-1, -2)
    keep = (torch.exp(cum[..., -1]) * carried[..., -1]).unsqueeze(-1).unsqueeze(-1)
    return P, U, W, start, kt @ (to_end * U), kt @ (to_end * W), keep


def chunked_gated_delta_rule(q, k, v, g, beta, *, cu_seqlens_host=None, chunk: int = 64):
    """The gated delta rule of :func:`naive_gated_delta_rule`, a chunk of tokens at a time.

    The per-token loop builds an autograd graph of a few ops per token and
    layer, and its backward was most of a qwen3_5 CPU training step (about 9 s
    per layer for 2048 tokens). Within a chunk the updates of the tokens are
    one unit-lower-triangular system (each token's correction depends on the
    earlier tokens' of its document through ``beta_j * exp(G_j - G_m) * (k_j .
    k_m)``, with ``G`` the cumulative log decay). Its solution is linear in the
    state ``S`` the chunk starts from (``w = U - W S``), so every chunk's
    system is solved at once, batched, and only ``S`` goes from chunk to chunk
    (a few products of ``(H, K, V)`` tensors each).

    Chunks are cut from the whole packed sequence, not per document: a packed
    row's padding is hundreds of one-token documents, and a loop over documents
    spent most of a CPU step on them. Document boundaries are masks instead: a
    token sees the earlier tokens of its own document only, the state reaches a
    token only if its document began before the chunk, and only the chunk's last
    document carries its state on. Same inputs and result as the naive rule
    (float32 rounding apart: the tests compare the two).
    """
    dtype = v.dtype
    q, k, v, g, beta, bounds = _delta_rule_inputs(q, k, v, g, beta, cu_seqlens_host)
    n, (H, K), V = bounds[-1] - bounds[0], q.shape[2:], v.shape[-1]
    N = -(-n // chunk)  # chunks; the last one padded with a document of zeros
    doc, first = _documents([*bounds, bounds[0] + N * chunk], q.device)

    def chunks(x):  # (1, T, H[, D]) -> (N, H, chunk[, D])
        x = x[0, bounds[0]:bounds[-1]]
        x = F.pad(x, [0, 0] * (x.dim() - 1) + [0, N * chunk - n]).unflatten(0, (N, chunk))
        return x.transpose(1, 2)

    q, k, v, g, beta = (chunks(x) for x in (q, k, v, g, beta))
    doc = doc.view(N, 1, chunk)
    # the document began in an earlier chunk: the state reaches it
    carried = (first.view(N, 1, chunk) < torch.arange(N, device=q.device).view(N, 1, 1) * chunk
               ).to(q.dtype)
    P, U, W, start, B, M, keep = _chunk_solutions(q, k, v, g, beta, doc, carried)
    states = [q.new_zeros(H, K, V)]
    for c in range(N - 1):
        S = states[-1]
        states.append(keep[c] * S + B[c] - M[c] @ S)
    out = P @ U + (start * q - P @ W) @ torch.stack(states)  # (N, H, C, V)
    return out.transpose(1, 2).flatten(0, 1)[:n].unsqueeze(0).to(dtype)


def _gated_delta_kernel_forward(self, xq, xk, xv, g, beta, *, cu_seqlens=None,
                                cu_seqlens_cpu=None):
    """``GatedDeltaKernel.forward`` on top of :func:`chunked_gated_delta_rule`."""
    if xq.shape[2] != xv.shape[2]:
        rep = xv.shape[2] // xq.shape[2]
        xq, xk = xq.repeat_interleave(rep, dim=2), xk.repeat_interleave(rep, dim=2)
    if xq.shape[0] != 1:  # fixed-length path: fold the batch into time, reset per row
        B, L = xq.shape[:2]

        def fold(t):
            return t.reshape(1, B * L, *t.shape[2:])

        out = chunked_gated_delta_rule(fold(xq), fold(xk), fold(xv), fold(g), fold(beta),
                                       cu_seqlens_host=[i * L for i in range(B + 1)])
        return out.reshape(B, L, *out.shape[2:])
    host = cu_seqlens_cpu.tolist() if cu_seqlens_cpu is not None else None
    return chunked_gated_delta_rule(xq, xk, xv, g, beta, cu_seqlens_host=host)


def causal_conv1d_varlen(x_btd, weight, cu_seqlens, cu_seqlens_cpu):
    """Depthwise causal conv + SiLU with per-document resets (FLA's Triton varlen conv
    has no CPU path). ``weight``: ``(D, 1, K)``.

    ``K`` shifted copies of the whole sequence, each masked where its tap would
    reach into the previous document, weighted and summed: one conv call per
    document was most of a CPU step (a packed row's padding is hundreds of
    one-token documents). Same result as a per-document ``F.conv1d`` (float32
    rounding apart: the tests compare the two)."""
    kw = weight.shape[-1]
    bounds = cu_seqlens_cpu.tolist()
    x = x_btd[:, bounds[0]:bounds[-1]]
    offset = torch.arange(x.shape[1], device=x.device) - _documents(bounds, x.device)[1]
    out = x * weight[:, 0, kw - 1]
    for s in range(1, kw):  # the tap s tokens back, zero before the document's start
        shifted = F.pad(x, [0, 0, s, 0])[:, :x.shape[1]]
        out = out + shifted * (offset >= s).to(x.dtype).unsqueeze(-1) * weight[:, 0, kw - 1 - s]
    return F.silu(out)


def stub_torchvision() -> None:
    """``torchtitan.hf_datasets.multimodal.utils.image`` (imported by qwen3_5's config
    registry) imports torchvision at module level; the PyPI torchvision wheels are
    CUDA builds that fail against torch+cpu. Install empty modules, but only after
    transformers has been imported (a stub visible to transformers breaks it)."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    for name in ("torchvision", "torchvision.io", "torchvision.transforms",
                 "torchvision.transforms.v2", "torchvision.transforms.v2.functional"):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules.setdefault(name, mod)


def pil_torchvision() -> bool:
    """Fill the `stub_torchvision` modules with the few PIL-backed functions TorchTitan's
    ``hf_datasets.multimodal.utils.image.process_image`` calls, so its own sample
    pipeline (``_process_mm_sample``: decode, resize rule, padding, normalization,
    placeholders, labels) runs on this CPU-only build. Returns False (and changes
    nothing) when a real torchvision is installed.

    What stands in: ``io.decode_image`` (PIL decode to RGB ``(C, H, W)`` uint8),
    ``resize`` (PIL bicubic, as zephon resizes: torchvision's antialiased bicubic is
    not bit-identical to it), ``pad`` (zeros right/bottom), ``to_dtype`` (``/ 255``)
    and ``normalize``. Call it before importing ``torchtitan.hf_datasets.multimodal``.
    """
    loaded = sys.modules.get("torchvision")
    if loaded is not None and getattr(loaded, "__file__", None) or \
            loaded is None and importlib.util.find_spec("torchvision") is not None:
        return False  # a real torchvision
    import io

    import numpy as np
    from PIL import Image

    stub_torchvision()
    tv_io = sys.modules["torchvision.io"]
    tvf = sys.modules["torchvision.transforms.v2.functional"]

    def decode_image(raw, mode=None):
        img = Image.open(io.BytesIO(bytes(raw.numpy().tobytes()))).convert("RGB")
        return torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous()

    def resize(img, size, interpolation=None, antialias=True):
        h, w = size
        pil = Image.fromarray(img.permute(1, 2, 0).numpy())
        out = pil.resize((w, h), resample=Image.Resampling.BICUBIC)
        return torch.from_numpy(np.array(out)).permute(2, 0, 1).contiguous()

    def pad(img, padding, fill=0):
        left, top, right, bottom = padding
        return F.pad(img, (left, right, top, bottom), value=fill)

    def to_dtype(img, dtype, scale=False):
        return img.to(dtype) / 255 if scale else img.to(dtype)

    def normalize(img, mean, std, inplace=False):
        m = torch.tensor(mean, dtype=img.dtype).view(-1, 1, 1)
        s = torch.tensor(std, dtype=img.dtype).view(-1, 1, 1)
        return (img - m) / s

    tv_io.decode_image = decode_image
    tv_io.ImageReadMode = types.SimpleNamespace(RGB="RGB")
    tvf.InterpolationMode = types.SimpleNamespace(BICUBIC="bicubic")
    tvf.resize, tvf.pad, tvf.to_dtype, tvf.normalize = resize, pad, to_dtype, normalize
    tvf.pil_to_tensor = lambda img: torch.from_numpy(np.array(img)).permute(2, 0, 1)
    sys.modules["torchvision"].io = tv_io
    return True


def apply(qwen3_5: bool = True) -> None:
    """Install every patch (idempotent). ``qwen3_5=False`` skips the FLA kernels."""
    global _APPLIED
    if _APPLIED:
        if qwen3_5:
            _apply_qwen3_5()
        return
    _patch_device_type()
    _patch_cpu_module()
    import torchtitan.distributed.fsdp as tt_fsdp
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.models.common.attention as attn
    import torchtitan.models.common.vision_encoder as ve
    from torch.nn.attention.flex_attention import create_block_mask

    # The module-level torch.compile(create_block_mask) objects would compile with
    # inductor on CPU (slow, and fragile on 2 cores): build masks eagerly.
    attn._compiled_create_block_mask = create_block_mask
    ve.compiled_create_block_mask = create_block_mask
    attn.FlexAttention.compiled_flex_attn = staticmethod(dense_flex_attention)

    def set_pg_timeouts(timeout, parallel_dims):
        """Trainer.train() calls this after step 1; the stock one does
        ``barrier(device_ids=[torch.cpu.current_device()])`` == ['cpu'], which gloo's
        BarrierOptions rejects with a TypeError. Same, without device_ids."""
        torch.distributed.barrier()
        groups = [m.get_group() for m in parallel_dims.get_all_one_dimensional_meshes().values()]
        for group in [*groups, None]:
            torch.distributed.distributed_c10d._set_pg_timeout(timeout, group)

    dist_utils.set_pg_timeouts = set_pg_timeouts

    from torch.distributed.fsdp import FSDPModule

    def disable_fsdp_gradient_division(model):
        """FSDP2 with gradient_divide_factor=1.0 reduce-scatters with
        ``ReduceOp.PREMUL_SUM(1.0)``, which gloo rejects. Force plain SUM."""
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(1.0)
                m.set_force_sum_reduction_for_comms(True)

    tt_fsdp.disable_fsdp_gradient_division = disable_fsdp_gradient_division
    _apply_muse_glimmer()
    _APPLIED = True
    if qwen3_5:
        _apply_qwen3_5()


def _apply_qwen3_5() -> None:
    """qwen3_5's FLA Triton kernels -> the pure-torch references above."""
    global _QWEN_APPLIED
    if _QWEN_APPLIED:
        return
    from torch.nn.attention.flex_attention import create_block_mask

    try:
        import torchtitan.models.qwen3_5.model as qm
        import torchtitan.models.qwen3_5.vision_encoder as qve
    except ImportError as exc:  # fla/triton missing: qwen3_5 is unusable anyway
        warnings.warn(f"qwen3_5 CPU patches skipped ({exc!r}); install triton, fla-core and "
                      "flash-linear-attention with --no-deps", stacklevel=2)
        return
    qve.compiled_create_block_mask = create_block_mask
    qm._causal_conv1d_varlen = causal_conv1d_varlen
    qm.GatedDeltaKernel.forward = _gated_delta_kernel_forward
    stub_torchvision()
    _QWEN_APPLIED = True


def _apply_muse_glimmer() -> None:
    """``muse_glimmer`` refuses any SPMD backend but ``spmd_types``, under which
    ``fully_shard(..., dp_mesh_dims=...)`` wants every parameter a DTensor on the SPMD
    mesh; TorchTitan 0.3.0 gives its vision encoder and adapter no sharding config, so
    their parameters stay plain tensors and FSDP refuses them at D > 1 ("all parameters
    must be DTensors on the full SPMD mesh"). Shard those two with plain FSDP
    (``dp_mesh_dims=None``), as at D = 1."""
    try:
        import torchtitan.models.muse_glimmer.parallelize as mp
    except ImportError:
        return
    if getattr(mp, "_zephon_patched", False):
        return
    def plain(stock):
        def wrapped(module, dp_mesh, *args, dp_mesh_dims=None, **kwargs):
            return stock(module, dp_mesh, *args, dp_mesh_dims=None, **kwargs)
        return wrapped

    mp.apply_fsdp_to_vision_encoder = plain(mp.apply_fsdp_to_vision_encoder)
    mp.apply_fsdp_to_decoder = plain(mp.apply_fsdp_to_decoder)
    mp._zephon_patched = True


def main() -> None:
    """``python -m zephon_vl.testing.titan_cpu <torchtitan.train arguments>``."""
    apply()
    from torchtitan.train import main as titan_main

    titan_main()


if __name__ == "__main__":
    main()
