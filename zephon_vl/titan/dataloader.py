"""``ZephonDataLoader``: zephon-vl as TorchTitan 0.3.0's dataloader.

TorchTitan's trainer builds it with::

    config.dataloader.build(dp_world_size=..., dp_rank=..., tokenizer=...,
                            seq_len=..., local_batch_size=...,
                            snapshot_every_n_steps=...)

and iterates ``(input_dict, labels)`` pairs: ``input_dict["input"]`` is the
token tensor, every other key is a keyword argument of the model's forward
(``positions`` restart at 0 at every document, so the trainer builds
document-causal masks from them; labels are -100 where there is no target).

Geometry. ``global_batch_size`` (``G``, rows per optimizer step; 0 means the
recipe's own, never a product with ``D``, so a resume on another ``D`` keeps
it) is zephon's global batch, and must equal TorchTitan's
``training.global_batch_size`` (whose default, -1, is ``local_batch_size *
dp_world_size``); with :class:`ZephonTrainer`'s config a mismatch is refused
when the dataloader is built. Each rank's local batch, ``G / D`` rows, is
cut into ``G / (D * local_batch_size)`` micro-batches of ``local_batch_size``
rows: TorchTitan's gradient-accumulation steps. TorchTitan's ``seq_len`` is the
recipe's context length.

Checkpoint. ``state_dict()`` returns ``{"zephon_state": <JSON>}``: zephon's
*global* state (all lanes, gathered over gloo), the same bytes on every rank,
which is what TorchTitan's distributed checkpoint needs (DCP keeps one copy of
a key that every rank saves). Before returning it, the ranks compare SHA-256s
of it and raise if any differs. ``load_state_dict`` restores it on any rank
count that divides the lane count.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.dataloader import BaseDataLoader

from zephon_core import CheckpointError, Loader
from zephon_core.extend import gloo_group, parse_state
from zephon_vl.ops.device import to_device
from zephon_vl.titan.resolve import resolve_config
from zephon_vl.titan.settings import ImageConfig
from zephon_vl.titan.state import STATE_FORMAT, STATE_KEY, STATE_VERSION, wrap_state

log = logging.getLogger(__name__)


class ZephonDataLoader(BaseDataLoader):
    """Elastically deterministic zephon batches for TorchTitan's trainer."""

    @dataclass(kw_only=True, slots=True)
    class Config(ImageConfig):
        """The dataloader's fields; every `Execution` setting is one more, generated under
        its flat name (``runner``, ``workers``, ``retry_deadline``, ``backlog_bytes``...;
        `zephon_vl.titan.settings`), and so are the image settings ``image_preset`` takes
        (``max_pixels``, ``min_pixels``, ``max_patches``: `IMAGE_OVERRIDES`)."""

        recipe: str = "text-demo"
        """A built-in recipe name (``text-demo``, ``vlm-demo``) or a recipe TOML file. With
        ``image_preset`` a built-in VLM recipe is built for ``model_format``'s family, with
        that family's tokenizer (``VisionFamily.tokenizer_dir``)."""

        num_lanes: int = 8
        """``L``: every DP degree you use must divide it. A resume with another value is
        refused unless ``allow_lane_change`` is set."""

        allow_lane_change: bool = False
        """Opt in to resuming a checkpoint saved with another ``num_lanes``: its remaining
        work is re-dealt to this run's lanes (docs/elastic-changes.md), the same batches at
        every DP degree."""

        global_batch_size: int = 0
        """Rows per optimizer step; 0 = the recipe's own (16 for the built-in recipes), never
        derived from the rank count, so a resume on another D keeps it. Must equal
        TorchTitan's ``training.global_batch_size``."""

        trainer_global_batch_size: int = 0
        """Set by ``ZephonTrainer.Config`` from ``training.global_batch_size`` (-1: local x D),
        so a mismatch is refused at build time; 0 = not known (a plain ``Trainer.Config``)."""

        seed: int = 0
        infinite: bool = True
        """TorchTitan's validator sets this. False = one pass (the recipe's ``epochs=1``)."""

        model_format: str = "text"
        """A registered model family (``zephon_vl.families``). ``text``: input/positions.
        ``qwen3_5``: plus padded pixel_values, grid_thw, mrope_positions and the
        special_tokens dict (VLM recipes of that family only)."""

        video_mode: str = "merge"
        """qwen3_5 only: ``merge`` (one vision-encoder call per micro-step; FSDP-safe) or
        ``split`` (videos in pixel_values_videos); see zephon_vl.families.qwen."""

        mrope: bool = True
        """qwen3_5 only: compute ``mrope_positions`` (the model does not)."""

        image_preset: str = ""
        """Built-in VLM recipes only: a vision-language family's image settings, e.g.
        ``qwen3_5`` = Qwen3.5's (patch 16, temporal patch 2, merge 2, mean/std 0.5, at most
        ``max_pixels`` pixels). Empty = the recipe's own. A TOML recipe sets them in its
        ``[image]`` table."""

        background: bool = False
        """Run the lanes and collation in a driver thread, ``prefetch_steps`` ahead."""

        normalize_on_device: bool = True
        """With ``image_preset``: ship uint8 pixels and normalize them on ``device`` (a
        quarter of the bytes through the host and the copy; the same floats). A recipe file
        chooses with ``normalize = "device"`` in its ``[image]`` table."""

        device: str = "auto"
        """Where batches with uint8 pixels are normalized: ``auto`` = this rank's CUDA device
        when there is one, else the CPU (the same floats either way)."""

        verify_state: bool = True
        """Compare the state's SHA-256 across ranks at every save (one small all_gather)."""

        ledger: str = ""
        """A ledger file (one JSON line per step, written by rank 0; see docs/torchtitan.md),
        e.g. beside the checkpoints; compare two runs with ``zephon-vl verify``. Empty: off."""

    def __init__(self, config: Config, *, dp_world_size: int = 1, dp_rank: int = 0,
                 tokenizer: Any = None, seq_len: int, local_batch_size: int,
                 **kwargs: Any) -> None:
        # tokenizer: zephon tokenizes with the recipe's own tokenizer (its content hash is in
        # the checkpoint fingerprint); TorchTitan's is only checked against it.
        # snapshot_every_n_steps and other trainer kwargs are not needed: the state is
        # taken at every step boundary at no cost.
        del kwargs
        self.config = config
        resolved = resolve_config(config, dp_world_size=dp_world_size, seq_len=seq_len,
                                  local_batch_size=local_batch_size, tokenizer=tokenizer)
        self.recipe, self.execution = resolved.recipe, resolved.execution
        self.family, self.titan_options = resolved.family, resolved.titan_options
        self.microbatches = resolved.microbatches
        self.device = torch.device(
            (f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
            if config.device == "auto" else config.device)
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.local_batch_size = local_batch_size
        self.loader = Loader(self.recipe, dp_rank, dp_world_size, self.execution,
                             microbatches=self.microbatches, background=config.background,
                             ledger=config.ledger or None)
        self._pending: list[dict[str, Any]] = []
        self._warned_no_vision = False
        self._waited_s = 0.0  # the trainer's time blocked in __iter__ (zephon_vl.titan.metrics)
        self._patches = 0  # vision patches handed to the trainer (zephon_vl.titan.metrics)
        log.info("zephon dataloader: %s", self.loader.explain().splitlines()[0])

    # --- iteration -----------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[dict[str, Any], torch.Tensor]]:
        while True:
            started = time.perf_counter()
            if not self._pending:
                try:
                    got = next(self.loader)
                except StopIteration:
                    return
                self._pending = list(got) if isinstance(got, list) else [got]
            out = self.convert(self._pending.pop(0))
            self._waited_s += time.perf_counter() - started
            yield out

    def take_wait(self) -> float:
        """Seconds the trainer was blocked in this iterator since the previous call."""
        waited, self._waited_s = self._waited_s, 0.0
        return waited

    def take_vision_patches(self) -> int:
        """Vision patches (before the merge: the encoder's input rows) of the micro-batches
        converted since the previous call."""
        patches, self._patches = self._patches, 0
        return patches

    def convert(self, batch: dict[str, Any]) -> tuple[dict[str, Any], torch.Tensor]:
        """One collated zephon micro-batch -> TorchTitan's ``(input_dict, labels)``.

        A batch with uint8 pixels (``ImageSettings(normalize="device")``) is
        moved to the trainer's device here and normalized there (`to_device`).
        """
        grid = batch.get("grid_thw")
        if grid is not None and len(grid):
            self._patches += int(torch.as_tensor(grid).prod(-1).sum())
        if "pixel_lut" in batch:
            batch = to_device(batch, self.device)
        out = self.family.titan_inputs(batch, self.recipe.collate, self.titan_options)
        if self.family.vision and "pixel_values" not in out and not self._warned_no_vision:
            self._warned_no_vision = True
            log.warning("zephon dataloader: rank %d got a micro-batch without images; with "
                        "FSDP every rank must call the vision encoder the same number of times "
                        "per micro-step (see docs/torchtitan.md)", self.dp_rank)
        return out, batch["labels"]

    # --- checkpoint ------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._pending:
            raise CheckpointError(
                f"zephon dataloader: checkpoint requested with {len(self._pending)} of "
                f"{self.microbatches} micro-batches of the step not consumed. TorchTitan "
                "checkpoints at optimizer-step boundaries, so this means "
                "training.global_batch_size differs from dataloader.global_batch_size "
                f"({self.recipe.global_batch_size}); make them equal")
        state = self.loader.state_dict()
        if len(state["lanes"]) != self.recipe.num_lanes:
            raise CheckpointError(
                f"zephon dataloader: the state holds {len(state['lanes'])} of "
                f"{self.recipe.num_lanes} lanes: torch.distributed is not initialized on "
                f"{self.dp_world_size} ranks, so it cannot be gathered into a global state")
        blob = wrap_state(state)
        if self.config.verify_state:
            verify_identical(blob)
        return {STATE_KEY: blob}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict or STATE_KEY not in state_dict:
            log.warning("zephon dataloader: no %r in the checkpoint; starting from step 0",
                        STATE_KEY)
            return
        raw = state_dict[STATE_KEY]
        if not isinstance(raw, str | bytes | bytearray):
            raise CheckpointError(f"zephon dataloader: {STATE_KEY!r} is a "
                                  f"{type(raw).__name__}, not the JSON text zephon saved")
        blob = parse_state(raw, f"zephon dataloader: {STATE_KEY!r}")
        if not isinstance(blob, dict):
            raise CheckpointError(f"zephon dataloader: {STATE_KEY!r} is not a JSON object")
        if blob.get("format") != STATE_FORMAT or blob.get("version") != STATE_VERSION:
            raise CheckpointError(
                f"zephon dataloader: {STATE_KEY!r} has format {blob.get('format')!r} version "
                f"{blob.get('version')!r}; this zephon reads {STATE_FORMAT!r} version "
                f"{STATE_VERSION}")
        self.loader.load_state_dict(blob["zephon"],
                                    allow_lane_change=self.config.allow_lane_change)
        self._pending = []

    @property
    def mid_step(self) -> bool:
        """True while micro-batches of the current step are still to be consumed."""
        return bool(self._pending)

    @property
    def step(self) -> int:
        """Zephon steps (optimizer steps) delivered so far."""
        return self.loader.step

    def close(self) -> None:
        self.loader.close()


def verify_identical(blob: str) -> None:
    """Raise unless every rank holds the same ``blob`` (compares SHA-256s over gloo)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    group = gloo_group()
    mine = torch.frombuffer(bytearray(hashlib.sha256(blob.encode()).digest()),
                            dtype=torch.uint8).clone()
    every = [torch.zeros(32, dtype=torch.uint8) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    digests = [bytes(t.tolist()).hex()[:16] for t in every]
    if len(set(digests)) != 1:
        raise CheckpointError(
            "zephon dataloader: the ranks' dataloader states differ (SHA-256 prefixes by rank: "
            f"{digests}); DCP would keep one of them and resume the others wrongly. This is a "
            "bug: please report it")


def step_rows(micro: list[tuple[dict[str, Any], torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One step's micro-batches ``(input_dict, labels)`` as one dict of rows.

    The form batch digests hash (`batch_digest`, `gathered_batch_digest`):
    ``input``, ``positions``, ``labels`` stacked along the row dimension, and the
    patch rows of every image (``pixel_values``, ``grid_thw``) and video
    (``pixel_values_videos``, ``grid_thw_videos``). A family's conversion pads each
    item's patches to the longest item of its micro-batch; the padding depends on how
    a rank count cuts the step, so only each item's own rows are kept, and the
    digest is the same at every D.
    """
    rows = {"input": torch.cat([x["input"] for x, _ in micro]),
            "positions": torch.cat([x["positions"] for x, _ in micro]),
            "labels": torch.cat([y for _, y in micro])}
    for pixels, grid in (("pixel_values", "grid_thw"), ("pixel_values_videos", "grid_thw_videos")):
        given = [x for x, _ in micro if x.get(pixels) is not None]
        if given:
            rows[pixels] = torch.cat([_item_rows(x[pixels], x[grid]) for x in given])
            rows[grid] = torch.cat([x[grid] for x in given])
    return rows


def next_global_step(loaders: list[ZephonDataLoader],
                     iters: list[Iterator[tuple[dict[str, Any], torch.Tensor]]]
                     ) -> list[tuple[dict[str, Any], torch.Tensor]]:
    """One optimizer step of ranks simulated in one process: every rank's micro-batches
    (`iters[d]` iterates `loaders[d]`), in rank order; `step_rows` of it is the global batch."""
    return [next(it) for it, dl in zip(iters, loaders, strict=True)
            for _ in range(dl.microbatches)]


def _item_rows(pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Patch rows ``[patches, dim]``: as given when flat, else each padded item's first
    ``t*h*w`` rows."""
    if pixels.dim() == 2:
        return pixels
    return torch.cat([pixels[i, :n] for i, n in enumerate(grid.prod(-1).tolist())])


def merged_state(loaders: list[ZephonDataLoader]) -> dict[str, Any]:
    """The ``state_dict()`` of ranks simulated in one process (no torch.distributed).

    Same content as what every rank of a real run returns; load it with
    ``load_state_dict`` on any rank count dividing the lane count.
    """
    from zephon_core import merge_states

    if any(dl.mid_step for dl in loaders):
        raise CheckpointError("zephon dataloader: a simulated rank is in the middle of a step")
    state = merge_states([dl.loader.local_state_dict() for dl in loaders])
    return {STATE_KEY: wrap_state(state)}
