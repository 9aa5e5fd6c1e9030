"""Batches to the accelerator: one copy of uint8 frames, patch rows made there.

A VLM batch's pixels are most of its bytes. Normalized on the host they are
float32 patch rows with every still image repeated over the temporal axis:
eight times the uint8 frames the workers made. This module moves the uint8
frames (from pinned memory, without blocking the host), normalizes them on
the device with the same table the host would use and lays them out as the
model's patch rows there, so the float32 tensor is bit-identical to the host
collate on every device (a table lookup has no rounding of its own).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

#: Host batches larger than this are copied from pageable memory (with a warning), not pinned.
PINNED_BUDGET_BYTES = 2 << 30
_warned = False


def _nbytes(batch: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values() if isinstance(t, torch.Tensor))


def normalize_pixels(pixel_values: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, 3*K]`` rows -> float32 rows: entry ``c*256 + v`` of `table` for channel c.

    One gather over all channels (a handful of kernels whatever the batch holds)."""
    n, width = pixel_values.shape
    offset = torch.arange(0, 3 * 256, 256, dtype=torch.int32, device=pixel_values.device)
    index = pixel_values.view(n, 3, width // 3).to(torch.int32) + offset[None, :, None]
    return torch.index_select(table, 0, index.reshape(-1)).view(n, width)


def frame_row_index(frames_per_item: torch.Tensor, grid_thw: torch.Tensor,
                    temporal: int) -> torch.Tensor:
    """The frame row behind each temporal slot of each patch row, ``[patches * temporal]``,
    computed where `frames_per_item` and `grid_thw` are (the host, in `to_device`): sizing
    the result on the device would make the host wait for the device."""
    per_row = torch.repeat_interleave(frames_per_item, grid_thw.prod(dim=1))
    first = torch.cumsum(per_row, 0) - per_row
    step = torch.arange(temporal)[None, :] * (per_row[:, None] > 1)
    return (first[:, None] + step).reshape(-1)


def patch_rows_from_frames(frames: torch.Tensor, frames_per_item: torch.Tensor,
                           grid_thw: torch.Tensor, temporal: int,
                           index: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 frame rows ``[F, 3*K]`` -> patch rows ``[patches, 3*temporal*K]`` (channel,
    then frame, then pixel), on the frames' device.

    `frames_per_item` ``[items]`` is 1 (a still image: its one frame fills every
    temporal slot) or `temporal` (a video's frames in order); item i has
    ``prod(grid_thw[i])`` patch rows. See `zephon_vl.frame_rows_uint8`. `index`: their
    `frame_row_index`, when the caller already moved it to the frames' device.
    """
    width = frames.shape[1]
    if index is None:
        index = frame_row_index(frames_per_item.cpu(), grid_thw.cpu(), temporal)
    rows = frames.index_select(0, index.to(frames.device))
    patches = len(index) // temporal
    return rows.view(patches, temporal, 3, width // 3).transpose(1, 2).reshape(
        patches, temporal * width)


def to_device(batch: dict[str, Any], device: torch.device | str, *, pin: bool = True,
              non_blocking: bool = True,
              pinned_budget_bytes: int = PINNED_BUDGET_BYTES) -> dict[str, Any]:
    """Every tensor of `batch` on `device`, uint8 pixels normalized there.

    On CUDA the host tensors are staged in pinned memory and copied with
    `non_blocking`, so the copy overlaps the host's next work; a batch larger
    than `pinned_budget_bytes` is copied from pageable memory with a warning.
    A device without room raises the framework's own out-of-memory error.
    Batches without ``pixel_lut`` (float32 pixels, text) are only moved. With
    ``pixel_frames`` (`VLCollate`'s uint8 frames), the patch rows are made on
    the device (`patch_rows_from_frames`).
    """
    global _warned
    device = torch.device(device)
    staged = pin and device.type == "cuda"
    if staged and _nbytes(batch) > pinned_budget_bytes:
        if not _warned:
            _warned = True
            log.warning("zephon: a %.0f MiB batch is over the pinned budget of %.0f MiB; copying "
                        "it from pageable memory (slower). Raise pinned_budget_bytes if the host "
                        "has the memory", _nbytes(batch) / 2**20, pinned_budget_bytes / 2**20)
        staged = False
    out: dict[str, Any] = {}
    temporal = batch.get("pixel_temporal")
    moving = dict(batch)
    if "pixel_lut" in batch and "pixel_frames" in batch:
        moving["pixel_frames"] = frame_row_index(batch["pixel_frames"].cpu(),
                                                 batch["grid_thw"].cpu(), int(temporal))
    for name, value in moving.items():
        if name == "pixel_temporal":
            continue
        if isinstance(value, torch.Tensor):
            if staged and value.device.type == "cpu":
                value = value.pin_memory()
            value = value.to(device, non_blocking=non_blocking and staged)
        out[name] = value
    table = out.pop("pixel_lut", None)
    index = out.pop("pixel_frames", None)
    if table is not None:
        pixels = normalize_pixels(out["pixel_values"], table)
        if index is not None:
            pixels = patch_rows_from_frames(pixels, batch["pixel_frames"], batch["grid_thw"],
                                            int(temporal), index=index)
        out["pixel_values"] = pixels
    return out
