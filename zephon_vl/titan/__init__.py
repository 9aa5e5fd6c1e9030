"""TorchTitan integration: zephon-vl as TorchTitan's dataloader.

* :mod:`zephon_vl.titan.dataloader`: ``ZephonDataLoader`` (a ``BaseDataLoader``)
  and its ``Config``, built by TorchTitan's trainer.
* The model's forward arguments come from the model family that
  ``model_format`` names (:mod:`zephon_vl.families`; ``qwen3_5``: padded
  patches, MRoPE positions, the ``special_tokens`` dict, in
  :mod:`zephon_vl.families.qwen`).
* :mod:`zephon_vl.titan.state`: the checkpoint envelope (key, format, version), torchtitan-free
  so that ``zephon-vl inspect`` reads DCP folders with it.
* :mod:`zephon_vl.titan.trainer`: ``ZephonTrainer``, TorchTitan's Trainer whose config
  hands ``training.global_batch_size`` to the dataloader (a mismatch is refused at build).
* :mod:`zephon_vl.titan.metrics`: the loader's ``zephon/*`` scalars in TorchTitan's metrics
  logger at every log step (``ZephonTrainer`` attaches it; docs/observability.md).
* :mod:`zephon_vl.titan.config_registry`: ready configurations for
  ``--module zephon_vl.titan --config zephon_llama3_debug`` / ``zephon_qwen35_debug``.
* :mod:`zephon_vl.testing.titan_cpu`: the patches that make TorchTitan 0.3.0 run on a
  CPU-only torch build (gloo), and ``python -m zephon_vl.testing.titan_cpu`` to launch it.

The public names are importable from here (``from zephon_vl.titan import
ZephonDataLoader``); importing this package does not import torchtitan, and a name
imports it when first used (install the ``[titan]`` extra).
"""

from __future__ import annotations

from zephon_core.extend import lazy_exports

_EXPORTS: dict[str, str] = {
    "ZephonDataLoader": "zephon_vl.titan.dataloader",
    "ZephonTrainer": "zephon_vl.titan.trainer",
    "zephon_trainer_config": "zephon_vl.titan.trainer",
    "load_titan_config": "zephon_vl.titan.check",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("zephon_vl.titan", _EXPORTS, globals())
