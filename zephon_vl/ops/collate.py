"""Rows -> the training tensors a VLM takes.

``input``, ``labels``, ``positions``: int64 ``[rows, seq_len]`` (per-document
positions; padding has label -100). ``pixel_values``: every image and video of
the batch as patch rows, concatenated in row order and, inside a row, in
token order, float32 ``[patches, 3*T*P*P]``. ``grid_thw``: int64
``[images, 3]`` in the same order. With ``ImageSettings(normalize="device")``
``pixel_values`` holds uint8 frames instead (`frame_rows_uint8`: a still image's
frame once, not T times), with ``pixel_frames`` (int64 ``[images]``: frames per
patch row, 1 or T), ``pixel_temporal`` (T) and ``pixel_lut`` (the normalization
table): ``zephon_vl.ops.device.to_device`` gives the float32 patch rows on the
device, bit-identical to the host's.
The model family's special token ids ride along as 0-d int64 tensors
(``VisionFamily.batch_token_ids``) so a model never has to guess them.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from zephon_core import BadSampleError
from zephon_core.extend import Row, text_row_arrays
from zephon_vl.media.image import (
    ImageSettings,
    frame_rows_uint8,
    normalization_table,
    patch_rows,
)
from zephon_vl.media.planned import decoded_rows
from zephon_vl.ops.host_buffers import HostBuffers

_TORCH_DTYPES = {np.uint8: torch.uint8, np.float32: torch.float32}

if TYPE_CHECKING:
    from zephon_vl.families.base import VisionFamily


class VLCollate:
    """The collate of `family`'s recipes; `special`: the family's ids in the recipe's tokenizer.

    Pixel data is written once, into the output tensor: page-locked memory with
    `pin_memory=True` (ready for a non_blocking copy to the device; torch's
    pinned allocator recycles it), else memory recycled from earlier batches
    that nothing references any more (`HostBuffers`: no page faults per step).
    """

    #: takes ``pin_memory`` (the loader's `Execution.pin_memory`)
    pins = True

    def __init__(self, seq_len: int, image: ImageSettings, special: Any,
                 family: VisionFamily) -> None:
        self.seq_len = seq_len
        self.image = image
        self.special = special
        self.family = family
        self.row_width = 3 * image.temporal_patch_size * image.patch_size ** 2
        self._token_ids = family.batch_token_ids(special)
        self._vision_ids = np.asarray(family.vision_token_ids(special), dtype=np.int64)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_buffers"}

    def _pixels(self, shape: tuple[int, int], dtype: type, pin_memory: bool) -> torch.Tensor:
        if pin_memory:
            return torch.empty(shape, dtype=_TORCH_DTYPES[dtype], pin_memory=True)
        if "_buffers" not in self.__dict__:
            self._buffers = HostBuffers()
        return torch.from_numpy(self._buffers.empty(shape, dtype))

    def settings(self) -> dict:
        return {"type": "vl", "family": self.family.name, "seq_len": self.seq_len,
                "normalize": self.image.normalize, "special": asdict(self.special)}

    def check_placeholders(self, rows: list[Row]) -> None:
        """Every document's vision placeholders match its items' grids, or the batch is refused.

        A model pairs placeholders with patch rows in order, so one extra or
        missing placeholder shifts every later image of the batch onto the
        wrong tokens; this names the sample instead of failing in the model.
        """
        segs = [seg for row in rows for seg in row.segments]
        if not segs:
            return
        merge, count = self.image.merge_size, self.family.item_tokens
        tokens = np.concatenate([np.asarray(s.payload["tokens"])[s.start:s.end] for s in segs])
        vision = np.zeros(len(tokens), dtype=bool)
        for v in self._vision_ids:  # a few ids: one comparison each beats np.isin's sort
            vision |= tokens == v
        counted = np.concatenate(([0], np.cumsum(vision)))
        ends = np.cumsum([s.end - s.start for s in segs])
        found = counted[ends] - counted[np.concatenate(([0], ends[:-1]))]
        want = [sum(count(g, merge) for g in s.payload["grid_thw"]) for s in segs]
        for seg, f, w in zip(segs, found.tolist(), want, strict=True):
            if f != w:
                raise BadSampleError(
                    "vision_token_mismatch", seg.origin.where(),
                    f"{f} vision placeholder tokens in the document but its "
                    f"{len(seg.payload['grid_thw'])} image(s) need {w}; the batch would "
                    "pair patches with the wrong tokens (check the tokenizer and the "
                    f"{self.family.name!r} family)")

    def __call__(self, rows: list[Row], pin_memory: bool = False) -> dict[str, torch.Tensor]:
        self.check_placeholders(rows)
        arrays = [text_row_arrays(r, self.seq_len, self.special.pad) for r in rows]
        out = {k: torch.from_numpy(np.stack([a[k] for a in arrays])) for k in arrays[0]}
        # an item still planned (a combiner that took what the tokenizer judged too long)
        pixels = decoded_rows([p for r in rows for s in r.segments
                              for p in s.payload["pixel_values"]])
        grids = [g for r in rows for s in r.segments for g in s.payload["grid_thw"]]
        thw = np.stack(grids).astype(np.int64) if grids else np.zeros((0, 3), dtype=np.int64)
        if self.image.normalize == "device":
            width = self.row_width // self.image.temporal_patch_size
            pv = self._pixels((sum(p.size for p in pixels) // width, width), np.uint8,
                              pin_memory)
            _, frames = frame_rows_uint8(pixels, self.image, out=pv.numpy())
            out["pixel_frames"] = torch.tensor(frames, dtype=torch.int64)
            out["pixel_temporal"] = torch.tensor(self.image.temporal_patch_size)
            out["pixel_lut"] = torch.from_numpy(normalization_table(self.image).copy())
        else:
            pv = self._pixels((sum(len(p) for p in pixels), self.row_width), np.float32,
                              pin_memory)
            if pixels:
                patch_rows(pixels, self.image, out=pv.numpy())
        out["pixel_values"] = pv
        out["grid_thw"] = torch.from_numpy(thw)
        for name, value in self._token_ids.items():
            out[name] = torch.tensor(value, dtype=torch.int64)
        if pin_memory:  # the small tensors; the pixels were written pinned
            out = {k: v if k == "pixel_values" else v.pin_memory() for k, v in out.items()}
        return out
