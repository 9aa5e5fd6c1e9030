"""zephon's loader metrics in TorchTitan's logger (TensorBoard, W&B: whichever is enabled).

TorchTitan 0.3.0's ``MetricsProcessor.log(step, loss, max_loss, grad_norm,
extra_metrics=...)`` merges ``extra_metrics`` into what its loggers write, and the
Trainer calls it on every rank at each log step (``metrics.log_freq``).
`attach` wraps that method so the ``extra_metrics`` also hold the loader's
``zephon/*`` scalars (`LoaderMetrics.scalars`, over the steps since the previous
log step) plus the exposed wait across ranks. The Trainer's loop is TorchTitan's,
unchanged; ``ZephonTrainer`` calls `attach` after building the trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["attach", "rank_wait_metrics", "titan_scalars"]


def rank_wait_metrics(wait_per_step_s: float, wait_share: float) -> dict[str, float]:
    """Max and mean over ranks of the exposed wait (one all_gather of 2 floats over gloo).

    Without torch.distributed (or with one rank) they are this rank's own.
    """
    import torch.distributed as dist

    mine = torch.tensor([wait_per_step_s, wait_share], dtype=torch.float64)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        from zephon_core.extend import gloo_group

        group = gloo_group()
        every = [torch.zeros(2, dtype=torch.float64) for _ in range(dist.get_world_size(group))]
        dist.all_gather(every, mine, group=group)
        stacked = torch.stack(every)
    else:
        stacked = mine[None]
    return {"zephon/ranks/wait_per_step_s_max": float(stacked[:, 0].max()),
            "zephon/ranks/wait_per_step_s_mean": float(stacked[:, 0].mean()),
            "zephon/ranks/wait_share_max": float(stacked[:, 1].max()),
            "zephon/ranks/wait_share_mean": float(stacked[:, 1].mean())}


def titan_scalars(dataloader: Any) -> dict[str, float]:
    """A `ZephonDataLoader`'s ``zephon/*`` scalars since the previous call (collective).

    The exposed wait is the trainer's: time blocked in the dataloader's iterator
    (zephon's ``next()`` plus the conversion to TorchTitan's inputs), per optimizer
    step over the window, and its share of the window's wall time.
    """
    m = dataloader.loader.metrics()
    waited = dataloader.take_wait()
    per_step = waited / m.steps if m.steps else 0.0
    share = min(1.0, waited / m.window_s) if m.window_s > 0 else 0.0
    out = m.scalars()
    out["zephon/wait_per_step_s"] = per_step
    out["zephon/wait_share"] = share
    out["zephon/step"] = float(m.step)
    patches = dataloader.take_vision_patches()
    out["zephon/vision_patches_per_s"] = patches / m.window_s if m.window_s > 0 else 0.0
    out.update(rank_wait_metrics(per_step, share))
    return out


def attach(trainer: Any) -> bool:
    """Add the dataloader's metrics to every ``metrics_processor.log`` of `trainer`.

    Returns False (and changes nothing) when its dataloader is not a `ZephonDataLoader`.
    """
    from zephon_vl.titan.dataloader import ZephonDataLoader

    dataloader = getattr(trainer, "dataloader", None)
    processor = getattr(trainer, "metrics_processor", None)
    if not isinstance(dataloader, ZephonDataLoader) or processor is None:
        return False
    log: Callable[..., Any] = processor.log

    def log_with_zephon(step: int, global_avg_loss: float, global_max_loss: float,
                        grad_norm: float, extra_metrics: dict[str, Any] | None = None) -> None:
        extra = {**(extra_metrics or {}), **titan_scalars(dataloader)}
        log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)

    processor.log = log_with_zephon
    return True
