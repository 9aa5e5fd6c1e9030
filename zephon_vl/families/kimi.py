"""The Kimi K2.5 family: MoonViT3d's geometry and Kimi's tokens, for TorchTitan's ``kimi_k2_5``.

TorchTitan 0.3.0 ships the model as ``torchtitan.models.kimi_k2_7`` (its
``ModelSpec`` is named ``kimi_k2_5``; flavors ``debugmodel``, ``Kimi-VL-A3B``,
``Kimi-K2.5``). What its vision encoder and dataloader config fix, and this
family holds (:attr:`KimiK25.preset`):

* **Geometry.** Patch 14, temporal patch 1, merge 2, mean/std 0.5, patches in
  **raster** order (MoonViT's 2-D RoPE and position table index ``row = p // w``).
* **Resize** by a **patch budget** (TorchTitan's ``resize_to_patch_budget``):
  scale down, never up, to at most ``max_patches`` (16384) patches and
  ``max_patches_per_side`` (512) a side, then pad right and bottom with black
  to a multiple of 28 (``ImageSettings(resize="patches")``).
* **Placeholders.** One unified token for images and videos:
  ``<|media_begin|> + N x <|media_pad|> + <|media_end|>``, ``N = (h/2)(w/2)``
  of the item's patch grid. MoonViT3d pools time, so a video of grid
  ``(t, h, w)`` (t frames: temporal patch 1) is ONE run of ``(h/2)(w/2)``
  tokens (:meth:`KimiK25.item_tokens`).
* **Turns** are Kimi's: ``<|im_user|>user<|im_middle|> ... <|im_end|>``
  (``<|im_assistant|>``, ``<|im_system|>`` for the other roles). Kimi-VL's chat
  template also puts ``<|im_system|>system<|im_middle|>You are a helpful
  assistant<|im_end|>`` before a chat without a system turn and adds no
  end-of-text: :attr:`KimiK25.template_framing` (a recipe's ``chat =
  "template"``); the default framing adds no system prompt and a trained
  end-of-text after every document, as zephon's other families do.
* **Tokenizer.** TorchTitan's debug tokenizer is not in its wheel, and the
  real Kimi one is a hub download; :func:`kimi_tokenizer_dir` builds an
  offline stand-in: the bundled Qwen vocabulary with Kimi's special tokens
  added (``[PAD]`` the pad token), ids below the debug config's vocabulary.

TorchTitan's ``KimiK25Model.forward`` takes ``tokens``, ``positions`` (1-D
RoPE; no MRoPE), ``pixel_values [items, max_patches, 3*14*14]`` zero-padded
per item (``max_patches`` rounded up to a multiple of 4), ``grid_thw
[items, 3]`` and ``special_tokens`` (``image_id == video_id``). It refuses a
batch mixing ``pixel_values`` and ``pixel_values_videos``; with one placeholder
id for both, zephon hands images and videos together as ``pixel_values``
(one encoder call per micro-step, which FSDP also needs).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from zephon_core import ChatFraming, ConfigError
from zephon_vl.families.base import TitanOptions, VisionFamily
from zephon_vl.families.common import check_padded, pad_items, special_tokens_dict

if TYPE_CHECKING:
    from zephon_vl.media.image import VisionPatches

#: TorchTitan's ``KIMI_K2_5_SPECIAL_TOKENS`` (``torchtitan/models/kimi_k2_7/__init__.py``).
KIMI_VISION_TOKENS = {"image_token": "<|media_pad|>", "video_token": "<|media_pad|>",
                      "vision_start_token": "<|media_begin|>",
                      "vision_end_token": "<|media_end|>", "pad_token": "[PAD]"}
#: Kimi's chat-turn tokens (its chat template); ``<|im_end|>`` is in the Qwen vocabulary.
KIMI_TURN_TOKENS = ("<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>")
#: Tokens the offline Kimi tokenizer adds to the Qwen vocabulary, in id order.
KIMI_ADDED_TOKENS = ("<|media_begin|>", "<|media_pad|>", "<|media_end|>", "[PAD]",
                     *KIMI_TURN_TOKENS)
#: The system turn Kimi-VL's chat template adds to a chat without one (no final period).
KIMI_SYSTEM_PROMPT = "You are a helpful assistant"
#: Bump when the tokenizer folder's content changes (a new cache folder).
KIMI_TOKENIZER_VERSION = "1"


def kimi_tokenizer_dir(out: str | os.PathLike | None = None) -> Path:
    """A local `transformers` tokenizer folder for the Kimi family (built once, ~10 s).

    The bundled Qwen3.6 vocabulary (:func:`zephon_core.qwen_tokenizer_dir`)
    plus `KIMI_ADDED_TOKENS` as special tokens, ``[PAD]`` its pad token and
    ``<|endoftext|>`` its end of text: a test and demo asset, not Kimi's real
    vocabulary (ids differ from the released checkpoints; train from scratch
    or point the recipe at the real tokenizer). Cached under
    ``zephon_core.extend.cache_dir()``; built atomically, so concurrent processes agree.
    """
    from zephon_core import qwen_tokenizer_dir
    from zephon_core.extend import cache_dir

    target = Path(out) if out is not None else \
        cache_dir() / f"kimi-tokenizer-v{KIMI_TOKENIZER_VERSION}"
    if (target / "tokenizer.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    fast = Tokenizer.from_file(str(qwen_tokenizer_dir() / "tokenizer.json"))
    fast.add_special_tokens([AddedToken(t, special=True, normalized=False)
                             for t in KIMI_ADDED_TOKENS])
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    fast.save(str(tmp / "tokenizer.json"))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tmp / "tokenizer.json"),
                                  eos_token="<|endoftext|>", pad_token="[PAD]")
    tok.save_pretrained(str(tmp))
    if target.exists():
        return target
    try:
        tmp.rename(target)
    except OSError:  # another process won the race
        if not (target / "tokenizer.json").is_file():
            raise
    return target


@dataclass(frozen=True)
class KimiTokens:
    """Ids of Kimi's vision and chat-turn tokens."""

    media_begin: int
    media_end: int
    media_pad: int
    im_user: int
    im_assistant: int
    im_system: int
    im_middle: int
    im_end: int
    eos: int
    pad: int

    @classmethod
    def from_tokenizer(cls, tok: Any) -> KimiTokens:
        names = ["<|media_begin|>", "<|media_end|>", "<|media_pad|>", *KIMI_TURN_TOKENS[:3],
                 "<|im_middle|>", "<|im_end|>"]
        ids = tok.convert_tokens_to_ids(names)
        missing = [n for n, i in zip(names, ids, strict=True)
                   if i is None or i == tok.unk_token_id]
        if missing:
            raise ConfigError(f"the tokenizer lacks Kimi's special tokens {missing}; use "
                              "zephon_vl.kimi_tokenizer_dir() (the Qwen vocabulary with them "
                              "added) or Kimi's own tokenizer")
        pad = tok.convert_tokens_to_ids(["[PAD]"])[0]
        eos = tok.eos_token_id if tok.eos_token_id is not None else ids[-1]
        if pad is None or pad == tok.unk_token_id:
            pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        return cls(*ids, eos, pad)


_ROLE_TOKEN = {"user": "im_user", "assistant": "im_assistant", "system": "im_system"}


class KimiK25(VisionFamily):
    """Kimi K2.5's data conventions; TorchTitan's ``kimi_k2_5`` forward arguments."""

    name = "kimi_k2_5"
    #: Kimi trains with FSDP: every rank must run the vision encoder every micro-step.
    image_every_row = True
    layout = "kimi_k2_5-tpool"
    #: TorchTitan's kimi_k2_7 ``_mm_dataloader`` (``config_registry.py``).
    preset = {"patch_size": 14, "temporal_patch_size": 1, "merge_size": 2,
              "patch_order": "raster", "resize": "patches", "max_patches": 16384,
              "max_patches_per_side": 512, "min_pixels": 65536,
              "image_mean": (0.5, 0.5, 0.5), "image_std": (0.5, 0.5, 0.5)}
    #: Kimi-VL's chat template: a default system prompt, no end-of-text.
    template_framing = ChatFraming(system_prompt=KIMI_SYSTEM_PROMPT, end_of_text=False)

    def tokenizer_dir(self) -> Path:
        return kimi_tokenizer_dir()

    def special_tokens(self, tokenizer: Any) -> KimiTokens:
        return KimiTokens.from_tokenizer(tokenizer)

    def item_tokens(self, grid_thw: Any, merge_size: int) -> int:
        """MoonViT3d averages over time: ``(h/merge)(w/merge)`` tokens, whatever ``t``."""
        _, h, w = (int(x) for x in grid_thw)
        return (h // merge_size) * (w // merge_size)

    def placeholder(self, special: KimiTokens, patches: VisionPatches, merge_size: int,
                    video: bool) -> np.ndarray:
        n = self.item_tokens(patches.grid_thw, merge_size)
        return np.concatenate([[special.media_begin], np.full(n, special.media_pad),
                               [special.media_end]]).astype(np.int64)

    def chat_turn(self, special: KimiTokens, role: str,
                  encode: Callable[[str], list[int]]) -> tuple[list[int], list[int]]:
        opening = getattr(special, _ROLE_TOKEN.get(role, "im_system"))
        return [opening] + encode(role) + [special.im_middle], [special.im_end]

    def batch_token_ids(self, special: KimiTokens) -> dict[str, int]:
        return {"image_token_id": special.media_pad, "video_token_id": special.media_pad,
                "vision_start_token_id": special.media_begin,
                "vision_end_token_id": special.media_end}

    def vision_token_ids(self, special: KimiTokens) -> tuple[int, ...]:
        return (special.media_pad,)

    def titan_inputs(self, batch: dict[str, Any], collate: Any,
                     options: TitanOptions) -> dict[str, Any]:
        return to_kimi_k2_5(batch, collate.special.pad, collate.image.merge_size)

    def check_model_inputs(self, inputs: dict[str, Any], vocab_size: int | None = None) -> None:
        """``KimiK25Model``'s checks: one placeholder id, grids divisible by the merge
        kernel and within the padded patches, patch rows of 3*14*14 values, and
        ``get_vision_positions`` pairing every item with one run of ``(h/2)(w/2)``."""
        super().check_model_inputs(inputs, vocab_size)
        import torch
        from torchtitan.models.common.multimodal import get_vision_positions

        merge, patch = self.preset["merge_size"], self.preset["patch_size"]
        tokens, special = inputs["input"], inputs.get("special_tokens") or {}
        if inputs.get("pixel_values_videos") is not None and \
                inputs.get("pixel_values") is not None:
            raise ValueError("kimi_k2_5: a batch with both pixel_values and "
                             "pixel_values_videos (the model refuses mixed batches)")
        pixels, grid = inputs.get("pixel_values"), inputs.get("grid_thw")
        if pixels is None:
            pixels, grid = inputs.get("pixel_values_videos"), inputs.get("grid_thw_videos")
        if pixels is None:
            pad = special.get("image_id")
            if pad is not None and bool((tokens == pad).any()):
                raise ValueError(f"kimi_k2_5: {int((tokens == pad).sum())} placeholder tokens "
                                 "but no pixel_values")
            return
        if special.get("image_id") is None or special.get("image_id") != special.get("video_id"):
            raise ValueError(f"kimi_k2_5: special_tokens must name one placeholder for images "
                             f"and videos (image_id == video_id), got {special}")
        check_padded(self.name, pixels, grid, 3 * self.preset["temporal_patch_size"]
                     * patch * patch)
        bad = [g for g in grid.tolist() if g[1] % merge or g[2] % merge]
        if bad:
            raise ValueError(f"kimi_k2_5: grids {bad} are not divisible by the merge kernel "
                             f"({merge}, {merge})")
        per_item = (grid[:, 1] // merge) * (grid[:, 2] // merge)
        try:
            get_vision_positions(tokens, per_item.to(torch.int64), int(special["image_id"]))
        except ValueError as exc:
            raise ValueError(f"kimi_k2_5: {exc}") from None


def to_kimi_k2_5(batch: dict[str, Any], pad_id: int, merge: int = 2) -> dict[str, Any]:
    """zephon ``VLCollate`` output (no labels) -> ``input`` + ``KimiK25Model.forward`` kwargs.

    Every item (images and videos alike: one placeholder id) goes in
    ``pixel_values``, zero-padded per item, in zephon's order (the order of
    the placeholder runs).
    """
    if "pixel_frames" in batch:
        raise ValueError("this batch holds uint8 frames (ImageSettings(normalize='device')); "
                         "move it with zephon_vl.to_device(batch, device) first")
    out: dict[str, Any] = {"input": batch["input"], "positions": batch["positions"]}
    grid = batch["grid_thw"]
    if grid.shape[0]:
        out["pixel_values"] = pad_items(batch["pixel_values"], grid, merge)
        out["grid_thw"] = grid
    out["special_tokens"] = special_tokens_dict(batch, pad_id)
    return out
