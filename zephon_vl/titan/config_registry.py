"""Ready TorchTitan configurations fed by zephon-vl.

``--module zephon_vl.titan --config <name>``: TorchTitan's ConfigManager imports
this module and calls ``<name>()``; CLI flags (``--training.steps 20``,
``--dataloader.num_lanes 64``, ...) override the result.

* ``zephon_llama3_debug``: TorchTitan's ``llama3`` debug model on the
  ``text-demo`` recipe. The debug model's vocabulary (2048 ids) is far smaller
  than the Qwen tokenizer zephon's recipes use (248,077 ids), so the model's
  vocabulary is set to 248,320 (the ``qwen3_5`` debug model's padded size):
  the token ids are real, never remapped or clipped. It costs 127M parameters
  in the embedding and output layers (dim 256), cheap enough on CPU.
* ``zephon_qwen35_debug``: TorchTitan's ``qwen3_5`` debug VLM on ``vlm-demo``,
  with Qwen3.5's vision settings (patch 16, temporal patch 2, merge 2,
  mean/std 0.5) and ``model_format="qwen3_5"``.
* ``zephon_kimi_debug``: TorchTitan's ``kimi_k2_5_debugmodel`` (MoonViT3d +
  DeepSeek-V3 MLA/MoE, the ``kimi_k2_7`` module) on ``vlm-mix-demo`` with
  ``model_format="kimi_k2_5"`` and its preset (patch 14, temporal patch 1,
  raster order, a budget of 16384 patches, padding), the offline Kimi
  tokenizer (``zephon_vl.kimi_tokenizer_dir``) and vocabulary 248,320;
  AdamW instead of TorchTitan's DistMuon (CUDA only).
* ``zephon_muse_debug``: TorchTitan's ``muse_glimmer_debugmodel_mm`` on
  ``vlm-mix-demo`` with ``model_format="muse_glimmer"`` and its preset (patch
  14, temporal patch 2, raster order, 784 to 3136 pixels an image), the Qwen
  tokenizer and vocabulary 248,320; the ``spmd_types`` backend, the only one
  TorchTitan's muse_glimmer takes.

All are ``ZephonTrainer.Config`` (TorchTitan's Trainer; the config hands
``training.global_batch_size`` to the dataloader, which refuses a mismatch when
it is built). Both are set up to also run on CPU under ``python -m zephon_vl.testing.titan_cpu``
(float32 parameters, no activation checkpointing, no validator, the
``partial_dtensor`` SPMD backend, one loss chunk); on GPUs override what you like.
"""

from __future__ import annotations

from torchtitan.trainer import Trainer

from zephon_core import qwen_tokenizer_dir
from zephon_vl.families.qwen import QWEN_VOCAB
from zephon_vl.titan.dataloader import ZephonDataLoader
from zephon_vl.titan.trainer import ZephonTrainer, zephon_trainer_config

__all__ = ["QWEN_VOCAB", "zephon_kimi_debug", "zephon_llama3_debug", "zephon_muse_debug",
           "zephon_qwen35_debug"]


def _cpu_friendly(config: Trainer.Config) -> ZephonTrainer.Config:
    # torch 2.13's FSDP2 with the spmd_types backend fails at dp > 1 on CPU
    # ("all parameters must be DTensors on the full SPMD mesh").
    config.parallelism.spmd_backend = "partial_dtensor"
    config.training.mixed_precision_param = "float32"  # bf16 matmuls are slow on CPU
    config.activation_checkpoint = None
    config.validator.enable = False
    if hasattr(config.loss, "num_chunks"):
        # each chunk of TorchTitan's ChunkedLossWrapper reduce-scatters the whole
        # 248,320-row output gradient, over gloo a large share of a CPU step
        config.loss.num_chunks = 1
    return zephon_trainer_config(config)


def set_vocab_size(config: Trainer.Config, vocab_size: int) -> None:
    """Resize a Decoder model config's embedding, output layer and loss to ``vocab_size``."""
    model = config.model_spec.model
    model.vocab_size = vocab_size
    # muse_glimmer bundles its embedding with a norm (EmbeddingWithNorm)
    embedding = getattr(model.tok_embeddings, "embedding", model.tok_embeddings)
    embedding.num_embeddings = vocab_size
    model.lm_head.out_features = vocab_size
    loss = config.loss
    inner = getattr(loss, "loss_fn", loss)
    if hasattr(inner, "global_vocab_size"):
        inner.global_vocab_size = vocab_size


def zephon_llama3_debug() -> ZephonTrainer.Config:
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()
    set_vocab_size(config, QWEN_VOCAB)
    config.hf_assets_path = str(qwen_tokenizer_dir())
    config.dataloader = ZephonDataLoader.Config(recipe="text-demo", num_lanes=8,
                                                global_batch_size=8)
    config.training.seq_len = 128
    config.training.local_batch_size = 2
    config.training.global_batch_size = 8  # = dataloader.global_batch_size; D in {1, 2, 4}
    return _cpu_friendly(config)


def zephon_qwen35_debug() -> ZephonTrainer.Config:
    # imported lazily: qwen3_5 needs fla + triton (and its registry imports torchvision)
    from torchtitan.components.tokenizer import MultiModalTokenizer
    from torchtitan.models.qwen3_5 import QWEN3_5_SPECIAL_TOKENS
    from torchtitan.models.qwen3_5.config_registry import qwen35_debugmodel

    config = qwen35_debugmodel()
    config.hf_assets_path = str(qwen_tokenizer_dir())
    config.tokenizer = MultiModalTokenizer.Config(**QWEN3_5_SPECIAL_TOKENS)
    config.dataloader = ZephonDataLoader.Config(recipe="vlm-demo", num_lanes=8,
                                                global_batch_size=8,
                                                model_format="qwen3_5",
                                                image_preset="qwen3_5")
    config.training.seq_len = 512
    config.training.local_batch_size = 1
    config.training.global_batch_size = 8  # = dataloader.global_batch_size; D in {1, 2, 4, 8}
    return _cpu_friendly(config)


def _vlm_dataloader(family: str, **image: int) -> ZephonDataLoader.Config:
    return ZephonDataLoader.Config(recipe="vlm-mix-demo", num_lanes=8, global_batch_size=8,
                                   model_format=family, image_preset=family, **image)


def zephon_kimi_debug() -> ZephonTrainer.Config:
    """TorchTitan's ``kimi_k2_5_debugmodel`` fed by zephon (its vocabulary covers the
    offline Kimi tokenizer's 248,085 ids), trained with TorchTitan's AdamW: its DistMuon
    needs one CUDA device per process (and FlexShard), which a CPU run has not."""
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.components.tokenizer import MultiModalTokenizer
    from torchtitan.models.kimi_k2_7 import KIMI_K2_5_SPECIAL_TOKENS
    from torchtitan.models.kimi_k2_7.config_registry import kimi_k2_5_debugmodel

    from zephon_vl.families.kimi import kimi_tokenizer_dir

    config = kimi_k2_5_debugmodel()
    set_vocab_size(config, QWEN_VOCAB)
    config.hf_assets_path = str(kimi_tokenizer_dir())
    config.optimizer = default_adamw(lr=8e-4)
    config.tokenizer = MultiModalTokenizer.Config(**KIMI_K2_5_SPECIAL_TOKENS)
    theirs = config.dataloader
    config.dataloader = _vlm_dataloader("kimi_k2_5", max_patches=theirs.max_patches,
                                        max_pixels=theirs.max_pixels,
                                        min_pixels=theirs.min_pixels)
    config.training.seq_len = 512
    config.training.local_batch_size = 1
    config.training.global_batch_size = 8  # = dataloader.global_batch_size; D in {1, 2, 4, 8}
    return _cpu_friendly(config)


def zephon_muse_debug() -> ZephonTrainer.Config:
    """TorchTitan's ``muse_glimmer_debugmodel_mm`` fed by zephon (vocabulary 248,320)."""
    from torchtitan.components.tokenizer import MultiModalTokenizer
    from torchtitan.models.muse_glimmer.config_registry import (
        MUSE_GLIMMER_SPECIAL_TOKENS,
        muse_glimmer_debugmodel_mm,
    )

    config = muse_glimmer_debugmodel_mm()
    set_vocab_size(config, QWEN_VOCAB)
    config.hf_assets_path = str(qwen_tokenizer_dir())
    config.tokenizer = MultiModalTokenizer.Config(**MUSE_GLIMMER_SPECIAL_TOKENS)
    theirs = config.dataloader
    config.dataloader = _vlm_dataloader("muse_glimmer", max_pixels=theirs.max_pixels,
                                        min_pixels=theirs.min_pixels)
    config.training.seq_len = 512
    config.training.local_batch_size = 1
    config.training.global_batch_size = 8  # = dataloader.global_batch_size; D in {1, 2, 4, 8}
    config = _cpu_friendly(config)
    # parallelize_muse_glimmer refuses any other backend (on CPU at D > 1 the launcher
    # zephon_vl.testing.titan_cpu FSDP-wraps it without SPMD mesh dims, see there)
    config.parallelism.spmd_backend = "spmd_types"
    return config
