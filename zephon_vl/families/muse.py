"""The Muse Glimmer family: its vision encoder's geometry, for TorchTitan's ``muse_glimmer``.

What TorchTitan 0.3.0's ``muse_glimmer_debugmodel_mm`` config and
``MuseGlimmerVisionEncoder`` fix, and this family holds (:attr:`MuseGlimmer.preset`):

* **Geometry.** Patch 14, temporal patch 2, merge (pixel-shuffle
  ``downsample_factor``) 2, mean/std 0.5, patches in **raster** order.
* **Resize** by a **pixel budget** (TorchTitan's ``resize_to_pixel_budget``,
  zephon's ``smart_resize``): sides multiples of 28, area within
  ``[min_pixels, max_pixels]``; TorchTitan's debug config takes 784 and 3136
  (at most 4 x 4 patches, 4 tokens an image).
* **Tokens** are Qwen's (``<|vision_start|>``, ``<|image_pad|>``,
  ``<|video_pad|>``, ``<|vision_end|>``, pad ``<|endoftext|>``: TorchTitan's
  ``MUSE_GLIMMER_SPECIAL_TOKENS``), all in the bundled Qwen vocabulary, which
  is this family's tokenizer. An image is ``<|vision_start|> + (h/2)(w/2) x
  <|image_pad|> + <|vision_end|>``. Turns are ChatML (TorchTitan defines no
  chat template for Muse Glimmer; these are the tokens its vocabulary has), so
  its ``template_framing`` is plain ChatML: no default system prompt, no
  end-of-text (the default framing adds a trained end-of-text, as for Qwen).
* **Videos.** ``MuseGlimmerModel.forward`` raises ``NotImplementedError`` on
  ``pixel_values_videos`` and its encoder takes ``grid_t == 1`` only. zephon
  lays a video of grid ``(t, h, w)`` out as ``t`` runs (one per temporal
  patch, ``<|video_pad|>``) and hands it to the model as ``t`` images of grid
  ``(1, h, w)``: the encoder sees each 2-frame temporal patch as an image (its
  patch embedding takes 2 frames), the placeholders are renamed to
  ``<|image_pad|>``. Time shows only through the order of the runs.

``MuseGlimmerModel.forward`` takes ``tokens``, ``positions`` (1-D RoPE),
``pixel_values [items, max_patches, 2*3*14*14]`` zero-padded per item,
``grid_thw [items, 3]`` and ``special_tokens`` with ``image_id``; it scatters
the encoder's tokens, in row-major order, into the ``image_id`` positions.
"""

from __future__ import annotations

from typing import Any

from zephon_vl.families.base import TitanOptions
from zephon_vl.families.common import check_padded, frame_items, pad_items, special_tokens_dict
from zephon_vl.families.qwen import QwenTokenFamily


class MuseGlimmer(QwenTokenFamily):
    """Muse Glimmer's data conventions; TorchTitan's ``muse_glimmer`` forward arguments."""

    name = "muse_glimmer"
    #: TorchTitan trains it with FSDP: every rank runs the vision encoder every micro-step.
    image_every_row = True
    layout = "muse_glimmer-video-frames"
    #: TorchTitan's ``_muse_glimmer_mm_dataloader`` (``config_registry.py``).
    preset = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
              "patch_order": "raster", "resize": "pixels", "min_pixels": 784,
              "image_mean": (0.5, 0.5, 0.5), "image_std": (0.5, 0.5, 0.5)}

    def titan_inputs(self, batch: dict[str, Any], collate: Any,
                     options: TitanOptions) -> dict[str, Any]:
        return to_muse_glimmer(batch, collate.special.pad, collate.image.merge_size)

    def check_model_inputs(self, inputs: dict[str, Any], vocab_size: int | None = None) -> None:
        """``MuseGlimmerModel``'s checks: no video tensors, ``grid_t == 1``, h and w
        divisible by the pixel shuffle, patch rows of 2*3*14*14 values, and as many
        ``image_id`` tokens as the encoder gives (``sum (h/2)(w/2)``)."""
        super().check_model_inputs(inputs, vocab_size)
        f, patch = self.preset["merge_size"], self.preset["patch_size"]
        tokens, special = inputs["input"], inputs.get("special_tokens") or {}
        if inputs.get("pixel_values_videos") is not None or \
                inputs.get("grid_thw_videos") is not None:
            raise ValueError("muse_glimmer: the model does not take pixel_values_videos "
                             "(NotImplementedError in MuseGlimmerModel.forward)")
        pixels, grid = inputs.get("pixel_values"), inputs.get("grid_thw")
        image_id = special.get("image_id")
        found = int((tokens == image_id).sum()) if image_id is not None else 0
        if pixels is None:
            if found:
                raise ValueError(f"muse_glimmer: {found} image placeholders but no "
                                 "pixel_values")
            return
        if image_id is None:
            raise ValueError("muse_glimmer: pixel_values without special_tokens['image_id']")
        if grid is None or grid.ndim != 2 or grid.shape[1] != 3:
            raise ValueError(f"muse_glimmer: grid_thw must be [items, 3], got "
                             f"{None if grid is None else tuple(grid.shape)}")
        if bool((grid[:, 0] != 1).any()):
            raise ValueError(f"muse_glimmer: the encoder takes grid_thw[:, 0] == 1 only, got "
                             f"{grid[:, 0].tolist()}")
        if bool((grid[:, 1:] % f != 0).any()):
            raise ValueError(f"muse_glimmer: grid h/w {grid[:, 1:].tolist()} not divisible by "
                             f"the pixel shuffle's downsample_factor {f}")
        check_padded(self.name, pixels, grid,
                     3 * self.preset["temporal_patch_size"] * patch * patch)
        want = int(((grid[:, 1] // f) * (grid[:, 2] // f)).sum())
        if found != want:
            raise ValueError(f"muse_glimmer: {found} image_id placeholders but the encoder "
                             f"gives {want} tokens for grids {grid.tolist()}")


def to_muse_glimmer(batch: dict[str, Any], pad_id: int, merge: int = 2) -> dict[str, Any]:
    """zephon ``VLCollate`` output (no labels) -> ``input`` + ``MuseGlimmerModel.forward``
    kwargs: a video of grid ``(t, h, w)`` becomes ``t`` items of grid ``(1, h, w)`` (its
    rows are t-major) and its placeholders ``image_id``."""
    import torch

    if "pixel_frames" in batch:
        raise ValueError("this batch holds uint8 frames (ImageSettings(normalize='device')); "
                         "move it with zephon_vl.to_device(batch, device) first")
    special = special_tokens_dict(batch, pad_id)
    tokens = batch["input"]
    out: dict[str, Any] = {"input": tokens, "positions": batch["positions"]}
    grid = batch["grid_thw"]
    if grid.shape[0]:
        frames = frame_items(grid)
        out["input"] = torch.where(tokens == special["video_id"], special["image_id"], tokens)
        out["pixel_values"] = pad_items(batch["pixel_values"], frames, merge)
        out["grid_thw"] = frames
    out["special_tokens"] = special
    return out
