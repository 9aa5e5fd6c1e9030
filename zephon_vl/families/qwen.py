"""The Qwen-VL family: Qwen's tokens, Qwen3.5's layout, converted for TorchTitan's ``qwen3_5``.

Qwen2-VL, Qwen2.5-VL and Qwen3.5 share the data conventions this module holds:

* **Placeholders.** An image is ``<|vision_start|> + N x <|image_pad|> +
  <|vision_end|>``, ``N`` being its number of merged patches
  (``h * w / merge_size**2`` of its grid). A video of grid ``(t, h, w)`` is laid
  out as Qwen3.5 and TorchTitan's ``qwen3_5`` collator expect: one run
  ``<|vision_start|> + (h * w / merge_size**2) x <|video_pad|> + <|vision_end|>``
  per temporal patch (frame), and MRoPE positions each frame as an image
  (:func:`mrope_positions`). No timestamp text is inserted between frames.
* **Turns** are ChatML: ``<|im_start|>role\\n ... <|im_end|>\\n``. Qwen2-VL's
  and Qwen2.5-VL's chat template also puts the system prompt "You are a helpful
  assistant." before a chat that has none (Qwen3-VL's adds none) and no
  end-of-text: :attr:`QwenVL.template_framing`, a recipe's ``chat =
  "template"``. The default framing (``chat_framing``) adds no system prompt
  and a trained ``<|endoftext|>`` after every document, as zephon always did
  (so packed documents stay separated, and existing digests hold).
* **Resize** is ``smart_resize`` (:mod:`zephon_vl.media.image`, which the
  decode operators call with the recipe's ``ImageSettings``): sides are
  multiples of ``patch_size * merge_size``, the area within the settings'
  pixel budget. ``ImageSettings()``'s defaults are Qwen2-VL's (patch 14,
  CLIP mean/std); :attr:`QwenVL.preset` is Qwen3.5's (``image_settings``).
* **Batch ids.** Every batch carries ``image_token_id``, ``video_token_id``,
  ``vision_start_token_id``, ``vision_end_token_id`` (:data:`SPECIAL_KEYS`).

The family is registered as ``qwen3_5``, TorchTitan's name for the model its
conversion targets (:func:`to_qwen3_5`). zephon's ``VLCollate`` gives every
image and video of a batch as one flat ``pixel_values [patches, 3*T*P*P]``
plus ``grid_thw [items, 3]``, in row order and, inside a row, in token order.
TorchTitan's ``Qwen35Model.forward`` takes

* ``pixel_values``: ``[items, max_patches, 3*T*P*P]``, zero-padded per item
  (``max_patches`` rounded up to a multiple of ``merge_size**2``);
* ``grid_thw``: ``[items, 3]``;
* optionally ``pixel_values_videos`` / ``grid_thw_videos`` (same layout);
* ``special_tokens``: a plain dict ``{"image_id", "video_id", "vision_start_id",
  "vision_end_id", "pad_id"}`` on every batch;
* ``mrope_positions``: ``[rows, seq_len, 3]`` (the model does not compute them:
  without them it falls back to 1-D ``positions``, which is not Qwen's RoPE).

The patch-element order of zephon's rows, ``(t, block_h, block_w, m_h, m_w)``
rows of ``(C, T, P, P)`` values, is TorchTitan's ``patch_order="block"`` and
transformers' Qwen2-VL order (checked in ``tests/titan/test_titan_qwen.py``).

Videos (``video_mode``):

* ``"merge"`` (default): images and videos go through ONE vision-encoder call
  (``pixel_values``/``grid_thw`` hold both, videos with ``grid_t > 1``), and the
  video placeholders in ``input`` are rewritten to the image placeholder id.
  The rewritten ids are never looked up: the model overwrites every
  placeholder embedding with the vision embedding, labels there are -100, and
  MRoPE is computed from the true grids before the rewrite. One call per
  micro-step is what FSDP needs: two calls (images, then videos) on a rank
  whose micro-batch has both, against one on a rank that has only images,
  is a collective mismatch.
* ``"split"``: the model's native interface, videos in
  ``pixel_values_videos``/``grid_thw_videos``. Only safe without FSDP, or
  when every rank's micro-batch has the same kinds of media.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from zephon_core import ChatFraming, ConfigError
from zephon_core.extend import chatml_turn
from zephon_vl.families.base import TitanOptions, VisionFamily
from zephon_vl.families.common import frame_items, pad_items, special_tokens_dict

if TYPE_CHECKING:
    import torch

    from zephon_vl.media.image import VisionPatches

log = logging.getLogger(__name__)

#: Qwen3.5's vision encoder: its Conv3d patch and merger geometry, and its mean/std.
QWEN3_5_PATCHES = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2}
QWEN3_5_MEAN_STD = (0.5, 0.5, 0.5)
#: The system turn Qwen2-VL's and Qwen2.5-VL's chat template adds to a chat without one.
QWEN_SYSTEM_PROMPT = "You are a helpful assistant."
#: Qwen3.5's vocabulary size (its embedding rows): holds every id of the Qwen tokenizer, so
#: the debug models and TorchTitan configs built for zephon's batches take it.
QWEN_VOCAB = 248320
#: TorchTitan's qwen3_5 dataloader ``min_pixels`` (``models/qwen3_5/config_registry.py``).
QWEN3_5_MIN_PIXELS = 65536


@dataclass(frozen=True)
class QwenTokens:
    """Ids of the special tokens that frame vision inputs and chat turns."""

    vision_start: int
    vision_end: int
    image_pad: int
    video_pad: int
    im_start: int
    im_end: int
    eos: int
    pad: int

    @classmethod
    def from_tokenizer(cls, tok: Any) -> QwenTokens:
        ids = tok.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                                         "<|video_pad|>", "<|im_start|>", "<|im_end|>"])
        if any(i is None or i == tok.unk_token_id for i in ids):
            raise ConfigError("the tokenizer lacks the vision special tokens (<|vision_start|>, "
                              "<|image_pad|>, ...); use the bundled Qwen tokenizer "
                              "(`zephon-vl tokenizer`) or add them")
        eos = tok.eos_token_id if tok.eos_token_id is not None else ids[5]
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        return cls(*ids, eos, pad)


class QwenTokenFamily(VisionFamily):
    """Qwen's vocabulary conventions, shared by the families whose models read them:
    the special tokens, one placeholder run per image and per temporal patch of a
    video, ChatML turns, the ids every batch carries."""

    def special_tokens(self, tokenizer: Any) -> QwenTokens:
        return QwenTokens.from_tokenizer(tokenizer)

    def placeholder(self, special: QwenTokens, patches: VisionPatches, merge_size: int,
                    video: bool) -> np.ndarray:
        """An image: one run. A video: one run per temporal patch (Qwen3.5's frames)."""
        if not video:
            n = patches.num_tokens(merge_size)
            return np.concatenate([[special.vision_start], np.full(n, special.image_pad),
                                   [special.vision_end]])
        t, h, w = (int(x) for x in patches.grid_thw)
        frame = np.concatenate([[special.vision_start],
                                np.full(h * w // (merge_size * merge_size), special.video_pad),
                                [special.vision_end]])
        return np.tile(frame, t)

    def chat_turn(self, special: QwenTokens, role: str,
                  encode: Callable[[str], list[int]]) -> tuple[list[int], list[int]]:
        return chatml_turn(special.im_start, special.im_end, role, encode)

    def batch_token_ids(self, special: QwenTokens) -> dict[str, int]:
        values = (special.image_pad, special.video_pad, special.vision_start,
                  special.vision_end)
        return dict(zip(SPECIAL_KEYS, values, strict=True))

    def vision_token_ids(self, special: QwenTokens) -> tuple[int, ...]:
        return (special.image_pad, special.video_pad)


class QwenVL(QwenTokenFamily):
    """Qwen2-VL's data conventions; TorchTitan's ``qwen3_5`` forward arguments."""

    name = "qwen3_5"
    image_every_row = True
    #: Qwen3.5's vision encoder; ``min_pixels`` is TorchTitan's qwen3_5 dataloader's.
    preset = {**QWEN3_5_PATCHES, "patch_order": "block", "resize": "pixels",
              "image_mean": QWEN3_5_MEAN_STD, "image_std": QWEN3_5_MEAN_STD,
              "min_pixels": QWEN3_5_MIN_PIXELS}
    #: Part of the tokenizer's checkpoint settings: a video's placeholder layout.
    layout = "qwen3_5-video-frames"
    #: Qwen2-VL's chat template: a default system prompt, no end-of-text.
    template_framing = ChatFraming(system_prompt=QWEN_SYSTEM_PROMPT, end_of_text=False)

    def check_model_inputs(self, inputs: dict[str, Any], vocab_size: int | None = None) -> None:
        super().check_model_inputs(inputs, vocab_size)
        check_qwen3_5_inputs(inputs, QWEN3_5_PATCHES)

    def titan_inputs(self, batch: dict[str, Any], collate: Any,
                     options: TitanOptions) -> dict[str, Any]:
        return to_qwen3_5(batch, collate.special.pad, collate.image.merge_size,
                          options.video_mode, options.mrope)


SPECIAL_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id",
                "vision_end_token_id")


def _item_kinds(tokens: torch.Tensor, grid_thw: torch.Tensor, merge: int,
                image_id: int, video_id: int) -> list[bool]:
    """For each vision item (in zephon's order), True when it is a video.

    Items follow the placeholder runs of ``tokens`` in row-major order; item
    ``k`` covers ``prod(grid_thw[k]) / merge**2`` placeholders.
    """
    import torch  # here, not at the top: worker processes import this module without torch

    flat = tokens.reshape(-1)
    where = torch.nonzero((flat == image_id) | (flat == video_id)).reshape(-1)
    counts = (grid_thw.prod(-1) // (merge * merge)).tolist()
    if sum(counts) != where.numel():
        raise ValueError(f"zephon batch is inconsistent: {where.numel()} vision placeholders "
                         f"but grid_thw accounts for {sum(counts)}")
    kinds, offset = [], 0
    for n in counts:
        kinds.append(bool(flat[where[offset]] == video_id))
        offset += n
    return kinds


def mrope_positions(tokens: torch.Tensor, positions: torch.Tensor, grid_thw: torch.Tensor,
                    merge: int, image_id: int, video_id: int) -> torch.Tensor:
    """Qwen3.5's 3-D positions ``[rows, seq_len, 3]``, restarting at every document.

    Inside a document: text tokens get ``p`` on all three axes; a vision run
    of merged grid ``(t, h, w)`` starting after ``n`` positions gets
    ``(n + t_i, n + h_i, n + w_i)``; the text after it continues at
    ``max + 1``. An image is one run. A video of ``t`` temporal patches is
    ``t`` runs (its frames, with the tokens between them), each positioned as
    an image of grid ``(1, h, w)``: time shows only through the order of the
    frames. Documents start where ``positions`` resets (zephon restarts
    positions at 0 per document). This is exactly what TorchTitan's
    ``MultiModalCollator._build_mrope_positions`` computes (tests check both
    images and videos).
    """
    import torch

    rows, seq = tokens.shape
    out = torch.zeros(rows, seq, 3, dtype=torch.int64)
    grids = grid_thw.tolist()
    item = 0
    frames_left = 0  # runs still to come of the current video
    frame: tuple[int, int] = (0, 0)
    for b in range(rows):
        tok = tokens[b].tolist()
        pos = positions[b].tolist()
        i = 0
        nxt = 0  # next free position in the current document
        while i < seq:
            if i > 0 and pos[i] < pos[i - 1]:
                nxt = 0  # a new document starts
            if tok[i] == image_id or tok[i] == video_id:
                if frames_left:
                    t, (h, w) = 1, frame
                    frames_left -= 1
                else:
                    t, h, w = grids[item]
                    item += 1
                    h, w = h // merge, w // merge
                    if tok[i] == video_id:
                        frame, frames_left, t = (h, w), t - 1, 1
                n = t * h * w
                ti = torch.arange(t).repeat_interleave(h * w)
                hi = torch.arange(h).repeat_interleave(w).repeat(t)
                wi = torch.arange(w).repeat(t * h)
                grid = torch.stack([ti, hi, wi], -1) + nxt
                out[b, i:i + n] = grid[: seq - i]
                nxt = int(grid.max()) + 1
                i += n
                continue
            out[b, i] = nxt
            nxt += 1
            i += 1
    if item != len(grids) or frames_left:
        raise ValueError(f"zephon batch is inconsistent: {item} vision items "
                         f"({frames_left} video frames missing) for {len(grids)} grid_thw entries")
    return out


def to_qwen3_5(batch: dict[str, Any], pad_id: int, merge: int = 2,
               video_mode: str = "merge", with_mrope: bool = True) -> dict[str, Any]:
    """zephon ``VLCollate`` output (no labels) -> ``input`` + ``Qwen35Model.forward`` kwargs.

    A batch of uint8 frames (``normalize="device"``) goes through
    `zephon_vl.to_device` first, which makes its patch rows.
    """
    if "pixel_frames" in batch:
        raise ValueError("this batch holds uint8 frames (ImageSettings(normalize='device')); "
                         "move it with zephon_vl.to_device(batch, device) first, which makes "
                         "the float patch rows the model takes")
    import torch

    special = special_tokens_dict(batch, pad_id)
    tokens, positions = batch["input"], batch["positions"]
    grid = batch["grid_thw"]
    out: dict[str, Any] = {"input": tokens, "positions": positions}
    if grid.shape[0]:
        image_id, video_id = special["image_id"], special["video_id"]
        if with_mrope:
            out["mrope_positions"] = mrope_positions(tokens, positions, grid, merge,
                                                     image_id, video_id)
        frames = frame_items(grid)
        padded = pad_items(batch["pixel_values"], frames, merge)
        if video_mode == "merge":
            out["input"] = torch.where(tokens == video_id, image_id, tokens)
            out["pixel_values"], out["grid_thw"] = padded, frames
        elif video_mode == "split":
            kinds = torch.tensor(_item_kinds(tokens, grid, merge, image_id, video_id))
            kinds = torch.repeat_interleave(kinds, grid[:, 0])
            if (~kinds).any():
                out["pixel_values"] = _repad(padded[~kinds], frames[~kinds], merge)
                out["grid_thw"] = frames[~kinds]
            if kinds.any():
                out["pixel_values_videos"] = _repad(padded[kinds], frames[kinds], merge)
                out["grid_thw_videos"] = frames[kinds]
        else:
            raise ValueError(f"video_mode must be 'merge' or 'split', got {video_mode!r}")
    out["special_tokens"] = special
    return out


def _repad(padded: torch.Tensor, grid: torch.Tensor, merge: int) -> torch.Tensor:
    unit = merge * merge
    longest = -(-int(grid.prod(-1).max()) // unit) * unit
    return padded[:, :longest].contiguous()


def check_qwen3_5_inputs(inputs: dict[str, Any], patches: dict[str, int]) -> None:
    """What ``Qwen35Model.forward`` asserts about its inputs, run without the model.

    Per modality it locates the placeholder runs with TorchTitan's own
    ``get_vision_positions`` (one run per item, of ``prod(grid) / merge**2``
    tokens) and scatters into them with ``scatter_vision_embeds``, as
    ``_prepare_multimodal_embeds`` does; it checks the padded pixel layout the
    vision encoder reads and the MRoPE shape, and refuses placeholders that
    no pixels would replace (the model would train on their embeddings).
    """
    import torch
    from torchtitan.models.common.multimodal import get_vision_positions, scatter_vision_embeds

    tokens = inputs["input"]
    rows, seq = tokens.shape
    if inputs["positions"].shape != tokens.shape:
        raise ValueError(f"positions {tuple(inputs['positions'].shape)} != input "
                         f"{tuple(tokens.shape)}")
    special = inputs.get("special_tokens") or {}
    missing = {"image_id", "video_id", "vision_start_id", "vision_end_id", "pad_id"} - set(special)
    if missing:
        raise ValueError(f"special_tokens lacks {sorted(missing)}")
    merge = patches["merge_size"]
    unit = merge * merge
    width = 3 * patches["temporal_patch_size"] * patches["patch_size"] ** 2
    for pixels_key, grid_key, id_key in (("pixel_values", "grid_thw", "image_id"),
                                         ("pixel_values_videos", "grid_thw_videos", "video_id")):
        placeholder = special[id_key]
        pixels, grid = inputs.get(pixels_key), inputs.get(grid_key)
        if pixels is None or grid is None:
            if pixels is not None or grid is not None:
                raise ValueError(f"{pixels_key} and {grid_key} come together")
            if bool((tokens == placeholder).any()):
                raise ValueError(f"{int((tokens == placeholder).sum())} placeholders "
                                 f"{placeholder} ({id_key}) but no {pixels_key}: the model "
                                 "would keep their text embeddings")
            continue
        sizes = grid.prod(-1)
        if pixels.dim() != 3 or pixels.shape[0] != grid.shape[0] or pixels.shape[2] != width:
            raise ValueError(f"{pixels_key} {tuple(pixels.shape)}: the vision encoder takes "
                             f"[items={grid.shape[0]}, patches, {width}]")
        if int(sizes.max()) > pixels.shape[1] or pixels.shape[1] % unit:
            raise ValueError(f"{pixels_key} pads items to {pixels.shape[1]} patches; the "
                             f"largest item has {int(sizes.max())} and the padding must be "
                             f"a multiple of {unit}")
        if bool((grid[:, 1:] % merge).any()):
            raise ValueError(f"{grid_key} {grid.tolist()}: heights and widths must be "
                             f"multiples of the merge size {merge}")
        per_item = sizes // unit
        found = get_vision_positions(tokens, per_item, placeholder)
        embeds = torch.zeros(grid.shape[0], pixels.shape[1] // unit, 1)
        scatter_vision_embeds(torch.zeros(rows, seq, 1), vision_embeds=embeds,
                              vision_positions=found)
    mrope = inputs.get("mrope_positions")
    if mrope is not None and tuple(mrope.shape) != (rows, seq, 3):
        raise ValueError(f"mrope_positions {tuple(mrope.shape)} != {(rows, seq, 3)}")
