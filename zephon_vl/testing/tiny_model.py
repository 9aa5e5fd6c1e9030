"""Drive TorchTitan's debug models directly (no Trainer): build, feed zephon batches, step.

Used by the loss-curve benchmark, the GPU smoke script and the tests. The
forward and backward are TorchTitan's model code and its cross-entropy
(``torchtitan.components.loss.cross_entropy_loss``, sum reduction divided by
the global number of valid tokens, as ``Trainer.train_step`` does); the
attention masks come from ``model.get_attention_masks(positions=...)`` as in
``Trainer.post_dataloading_process``. What the Trainer adds and this does
not: FSDP/TP wrapping, mixed precision, LR schedule, metrics. Data parallelism
is plain: every rank holds the whole model and gradients are summed with
``all_reduce`` (gloo on CPU).

Why not the Trainer for the curves: its initial weights depend on the DP
degree (FSDP initializes sharded parameters), it takes seconds per step on a
2-core CPU, and the curves must start from the same weights at every ``D``.
"""

from __future__ import annotations

from typing import Any

import torch

from zephon_vl.families.qwen import QWEN_VOCAB

#: The debug models `build_model` builds: TorchTitan's names of them.
FLAVORS = ("llama3", "qwen3_5", "kimi_k2_5", "muse_glimmer")


def shrink_model_config(model: Any, layers: int = 0, vision_layers: int = 0) -> None:
    """Keep the first `layers` decoder layers and `vision_layers` vision blocks (0 = all).

    For tiny models on a CPU: qwen3_5's first 4 layers are 3 gated delta-net layers and
    its first full-attention layer.
    """
    if layers:
        model.layers = model.layers[:layers]
        if hasattr(model, "n_layers"):
            model.n_layers = len(model.layers)
    if vision_layers:
        encoder = getattr(model, "vision_encoder", None)
        if encoder is None:
            raise ValueError("vision_layers: this model has no vision encoder")
        encoder.num_layers = vision_layers


def build_model(flavor: str = "llama3", device: str | torch.device = "cpu", seed: int = 0,
                vocab_size: int = QWEN_VOCAB, layers: int = 0,
                vision_layers: int = 0) -> torch.nn.Module:
    """TorchTitan's ``<flavor>`` debug model (one of `FLAVORS`; muse_glimmer's multimodal
    ``debugmodel_mm``), seeded by ``seed``; `layers`/`vision_layers` as in
    `shrink_model_config`."""
    device = torch.device(device)
    if device.type == "cpu":
        from zephon_vl.testing.titan_cpu import apply

        apply(qwen3_5=flavor == "qwen3_5")
    from torchtitan.distributed import utils as dist_utils

    # the default "spmd_types" backend needs the mesh the Trainer sets up
    dist_utils.set_spmd_backend("partial_dtensor")
    if flavor == "llama3":
        from torchtitan.models.llama3 import model_registry
    elif flavor == "qwen3_5":
        from torchtitan.models.qwen3_5 import model_registry
    elif flavor == "kimi_k2_5":
        from torchtitan.models.kimi_k2_7 import model_registry
    elif flavor == "muse_glimmer":
        from torchtitan.models.muse_glimmer import model_registry
    else:
        raise ValueError(f"flavor must be one of {FLAVORS}, got {flavor!r}")
    cfg = model_registry("debugmodel_mm" if flavor == "muse_glimmer" else "debugmodel").model
    if cfg.vocab_size != vocab_size:
        cfg.vocab_size = vocab_size
        # muse_glimmer bundles its embedding with a norm (EmbeddingWithNorm)
        getattr(cfg.tok_embeddings, "embedding", cfg.tok_embeddings).num_embeddings = vocab_size
        cfg.lm_head.out_features = vocab_size
    shrink_model_config(cfg, layers, vision_layers)
    with torch.device("meta"):
        model = cfg.build()
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    return model


def forward_inputs(model: torch.nn.Module, input_dict: dict[str, Any],
                   device: torch.device) -> tuple[torch.Tensor, dict[str, Any]]:
    """What ``Trainer.post_dataloading_process`` gives the model (no CP, no SPMD types)."""
    kwargs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v)
              for k, v in input_dict.items() if k != "input"}
    if "positions" in kwargs and hasattr(model, "get_attention_masks"):
        kwargs["attention_masks"] = model.get_attention_masks(positions=kwargs["positions"])
    return input_dict["input"].to(device), kwargs


def loss_sum(model: torch.nn.Module, input_dict: dict[str, Any], labels: torch.Tensor,
             device: torch.device) -> torch.Tensor:
    """Sum of token cross-entropies of one micro-batch (TorchTitan's loss, sum reduction)."""
    from torchtitan.components.loss import cross_entropy_loss

    tokens, kwargs = forward_inputs(model, input_dict, device)
    pred = model(tokens, **kwargs)
    return cross_entropy_loss(pred, labels.to(device))


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer,
               micro: list[tuple[dict[str, Any], torch.Tensor]], device: torch.device,
               max_norm: float = 1.0) -> float:
    """One optimizer step over this rank's micro-batches; returns the global mean loss.

    With ``torch.distributed`` initialized, valid-token counts, loss sums and
    gradients are summed over all ranks (the data-parallel mean over the
    global batch, as TorchTitan normalizes it).
    """
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    valid = torch.tensor(float(sum(int((y != -100).sum()) for _, y in micro)))
    if distributed:
        dist.all_reduce(valid)
    opt.zero_grad(set_to_none=True)
    total = torch.zeros((), dtype=torch.float64)
    for x, y in micro:
        loss = loss_sum(model, x, y, device) / valid.to(device)
        loss.backward()
        total += float(loss.detach())
    params = [p for p in model.parameters() if p.grad is not None]
    if distributed:
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n
        t = torch.tensor([float(total)], dtype=torch.float64)
        dist.all_reduce(t)
        total = t[0]
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    opt.step()
    return float(total)


def fold_vocab(micro: list[tuple[dict[str, Any], torch.Tensor]],
               vocab: int) -> list[tuple[dict[str, Any], torch.Tensor]]:
    """Fold token ids and labels modulo ``vocab`` (labels -100 stay): a cheap stand-in for
    the full vocabulary on CPU, applied after the batches are hashed.

    A VLM batch (one with ``special_tokens``) keeps its special ids apart: they move to
    the top ``k`` ids of the folded vocabulary and ``special_tokens`` follows, while every
    other id folds modulo ``vocab - k``. Folding them with the text would leave the model
    looking for image placeholders that are no longer there.
    """
    return [_fold_one(x, y, vocab) for x, y in micro]


def _fold_one(x: dict[str, Any], y: torch.Tensor,
              vocab: int) -> tuple[dict[str, Any], torch.Tensor]:
    special = x.get("special_tokens")
    if not special:
        return {**x, "input": x["input"] % vocab}, torch.where(y >= 0, y % vocab, y)
    ids = sorted(set(special.values()))
    if len(ids) >= vocab:
        raise ValueError(f"cannot fold into {vocab} ids: {len(ids)} are special")
    base = vocab - len(ids)
    moved = {old: base + i for i, old in enumerate(ids)}

    def fold(t: torch.Tensor) -> torch.Tensor:
        out = torch.where(t >= 0, t % base, t)
        for old, new in moved.items():
            out = torch.where(t == old, torch.full_like(t, new), out)
        return out

    return ({**x, "input": fold(x["input"]),
             "special_tokens": {k: moved[v] for k, v in special.items()}}, fold(y))


def make_optimizer(model: torch.nn.Module, lr: float = 8e-4) -> torch.optim.Optimizer:
    """TorchTitan's ``default_adamw`` settings, without its LR schedule."""
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8,
                             weight_decay=0.1)
