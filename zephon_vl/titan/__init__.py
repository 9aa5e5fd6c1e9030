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

Importing this package does not import torchtitan; the submodules do.
"""
