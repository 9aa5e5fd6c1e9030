"""What several families' TorchTitan conversions and model checks share.

A `VLCollate` batch names its special ids and gives every image and video as one
flat ``pixel_values [patches, D]`` with ``grid_thw [items, 3]``; TorchTitan's
vision models take items zero-padded to one length (``[items, max_patches, D]``),
some of them one item per frame. These helpers do that once, for `qwen.py`,
`kimi.py` and `muse.py`, which import them from here and never from each other.
Torch is imported inside them: worker processes import the families without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def special_tokens_dict(batch: dict[str, Any], pad_id: int) -> dict[str, int]:
    return {"image_id": int(batch["image_token_id"]), "video_id": int(batch["video_token_id"]),
            "vision_start_id": int(batch["vision_start_token_id"]),
            "vision_end_id": int(batch["vision_end_token_id"]), "pad_id": int(pad_id)}


def frame_items(grid_thw: torch.Tensor) -> torch.Tensor:
    """Each item of grid ``(t, h, w)`` as ``t`` items of grid ``(1, h, w)``, in order.

    TorchTitan's ``qwen3_5`` forward finds one placeholder run per item
    (``get_vision_positions``), while a Qwen3.5 video is one run per temporal
    patch; handing it the frames as items makes the two agree. The flat patch
    rows need no change (an item's rows are ordered by temporal patch first),
    and the vision encoder then attends within each frame, as transformers'
    Qwen3.5 vision model does (``cu_seqlens`` per temporal patch).
    """
    import torch

    frames = torch.repeat_interleave(grid_thw, grid_thw[:, 0], dim=0)
    frames[:, 0] = 1
    return frames


def pad_items(pixel_values: torch.Tensor, grid_thw: torch.Tensor,
              merge: int) -> torch.Tensor:
    """Flat ``[patches, D]`` -> ``[items, max_patches, D]`` zero-padded per item."""
    sizes = grid_thw.prod(-1).tolist()
    unit = merge * merge
    longest = max(sizes)
    longest = -(-longest // unit) * unit
    out = pixel_values.new_zeros(len(sizes), longest, pixel_values.shape[-1])
    offset = 0
    for i, n in enumerate(sizes):
        out[i, :n] = pixel_values[offset:offset + n]
        offset += n
    if offset != pixel_values.shape[0]:
        raise ValueError(f"zephon batch is inconsistent: {pixel_values.shape[0]} patch rows "
                         f"but grid_thw accounts for {offset}")
    return out


def check_padded(name: str, pixels: Any, grid: Any, width: int) -> None:
    """Padded ``[items, max_patches, width]`` pixels that hold every item's ``t*h*w`` rows."""
    if grid is None or grid.ndim != 2 or grid.shape[1] != 3:
        raise ValueError(f"{name}: grid_thw must be [items, 3], got "
                         f"{None if grid is None else tuple(grid.shape)}")
    if pixels.ndim != 3 or pixels.shape[0] != grid.shape[0] or pixels.shape[2] != width:
        raise ValueError(f"{name}: pixel_values must be [{grid.shape[0]} items, patches, "
                         f"{width}], got {tuple(pixels.shape)}")
    longest = int(grid.prod(-1).max()) if grid.shape[0] else 0
    if longest > pixels.shape[1]:
        raise ValueError(f"{name}: an item of {longest} patches does not fit the padded "
                         f"pixel_values of {pixels.shape[1]} patches an item")
