"""``ZephonTrainer``: TorchTitan's Trainer whose config hands the trainer's batch size to zephon.

TorchTitan builds the dataloader with the local batch size and the rank count
but not with ``training.global_batch_size``, so a dataloader cannot see a
trainer whose optimizer step takes another number of rows than its own step
(each trainer step would take two zephon steps, or checkpoints would fail
hundreds of steps in). ``ZephonTrainer.Config`` copies
``training.global_batch_size`` into ``ZephonDataLoader.Config.
trainer_global_batch_size`` after every construction, command-line
overrides included, so ``ZephonDataLoader`` refuses a mismatch when it is
built. Training itself is TorchTitan's, unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torchtitan.trainer import Trainer

from zephon_vl.titan.dataloader import ZephonDataLoader
from zephon_vl.titan.metrics import attach

__all__ = ["ZephonTrainer", "link_batch_sizes", "zephon_trainer_config"]


def link_batch_sizes(config: Trainer.Config) -> None:
    """Give a ``ZephonDataLoader.Config`` (training and validation) the trainer's batch size."""
    loaders = [config.dataloader, getattr(config.validator, "dataloader", None)]
    for loader in loaders:
        if isinstance(loader, ZephonDataLoader.Config):
            loader.trainer_global_batch_size = config.training.global_batch_size


class ZephonTrainer(Trainer):
    """TorchTitan's Trainer; its Config links batch sizes (see the module docstring) and
    its metrics logger receives the loader's ``zephon/*`` scalars
    (`zephon_vl.titan.metrics`, docs/observability.md)."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        attach(self)

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        def __post_init__(self) -> None:
            Trainer.Config.__post_init__(self)
            link_batch_sizes(self)


def zephon_trainer_config(config: Trainer.Config) -> ZephonTrainer.Config:
    """`config` as a ``ZephonTrainer.Config`` (same fields, batch sizes linked)."""
    return ZephonTrainer.Config(**{f.name: getattr(config, f.name)
                                   for f in dataclasses.fields(config) if f.init})
