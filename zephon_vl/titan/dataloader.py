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

import dataclasses
import hashlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.dataloader import BaseDataLoader

from zephon_core import (
    CheckpointError,
    Coalesce,
    ConfigError,
    Execution,
    Loader,
    RetryPolicy,
    load_recipe,
    parse_resources,
    parse_runners,
    parse_workers,
)
from zephon_core.engine.plan import unknown_operators
from zephon_core.engine.state_check import parse_state
from zephon_vl.families.base import TitanOptions
from zephon_vl.families.registry import family_names, get_family, recipe_family, vision_family
from zephon_vl.ops.device import to_device
from zephon_vl.titan.state import STATE_FORMAT, STATE_KEY, STATE_VERSION, wrap_state

log = logging.getLogger(__name__)


def preset_image_settings(name: str, max_pixels: int, min_pixels: int = 0,
                          max_patches: int = 0) -> Any:
    """The ImageSettings of the vision-language family `name` (``image_preset``);
    `min_pixels`, `max_patches` 0: the preset's."""
    try:
        family = vision_family(name)
        if max_patches:
            return family.image_settings(max_pixels, min_pixels or None,
                                         max_patches=max_patches)
        return family.image_settings(max_pixels, min_pixels or None)
    except ConfigError as exc:
        raise ConfigError(f"zephon dataloader: image_preset {name!r}: {exc} (set "
                          "--dataloader.max_pixels higher or --dataloader.min_pixels "
                          "lower)") from None


def check_geometry(num_lanes: int, global_batch_size: int, dp_world_size: int,
                   local_batch_size: int) -> int:
    """Refuse geometries that cannot give every rank whole lanes and whole micro-batches.

    Returns the number of micro-batches (gradient-accumulation steps) per step.
    """
    L, G, D, B = num_lanes, global_batch_size, dp_world_size, local_batch_size
    if L < 1 or D < 1 or B < 1 or G < 1:
        raise ConfigError(f"num_lanes ({L}), dp_world_size ({D}), local_batch_size ({B}) and "
                          f"global_batch_size ({G}) must all be >= 1")
    if L % D:
        ok = [d for d in range(1, L + 1) if L % d == 0]
        raise ConfigError(
            f"zephon dataloader: {D} data-parallel ranks cannot share num_lanes={L} evenly "
            f"(L % D = {L % D}). Use a data-parallel degree in {ok}, or set "
            f"--dataloader.num_lanes to a multiple of every degree you will run at (e.g. 64)")
    if G % L:
        raise ConfigError(
            f"zephon dataloader: global_batch_size={G} is not a multiple of num_lanes={L} "
            f"(G % L = {G % L}); every lane gives G / L rows per step")
    if G % (B * D):
        raise ConfigError(
            f"zephon dataloader: global_batch_size={G} is not divisible by local_batch_size x "
            f"dp_world_size = {B} x {D} = {B * D}; each rank needs a whole number of "
            "micro-batches per step. Change --training.local_batch_size or "
            "--dataloader.global_batch_size")
    return G // (B * D)


class ZephonDataLoader(BaseDataLoader):
    """Elastically deterministic zephon batches for TorchTitan's trainer."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
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

        max_pixels: int = 128 * 32 * 32
        """With ``image_preset``: the largest image, in pixels (128 merged tokens)."""

        min_pixels: int = 0
        """With ``image_preset``: the smallest image, in pixels (smaller ones are scaled
        up); 0 = the preset's (qwen3_5: 65536, TorchTitan's value)."""

        max_patches: int = 0
        """With ``image_preset`` of a patch-budget family (``kimi_k2_5``): the most patches
        an image keeps (scaled down to it, never up); 0 = the preset's (16384)."""

        runner: str = Execution.runner
        """Execution knob (never changes a batch): auto (the default: processes for read,
        decode and tokenize), inline, threads, processes or ray (a Ray cluster; docs/ray.md)."""

        runners: str = ""
        """Per-operator runners, e.g. ``decode=ray`` (the others keep ``runner``)."""

        ray_address: str = ""
        """With a ray runner: the Ray cluster's head ``host:port``; empty = ``RAY_ADDRESS``,
        else the latest cluster started on this machine, else a local one."""

        ray_resources: str = ""
        """With a ray runner: custom resources every task asks for, e.g. ``zephon_cpu=1``
        (only the nodes that offer it, a CPU-only pool, run zephon tasks)."""

        workers: str = ""
        """Per-operator workers, e.g. ``decode=2,tokenize=1``, or ``auto``: the process
        stages sized from measured costs while training runs (docs/observability.md)."""

        default_workers: int = 0
        """Workers of operators not named in ``workers``; 0 = usable cores // ranks on this
        machine (torchrun's LOCAL_WORLD_SIZE)."""

        group_size: int = Execution.group_size
        prefetch: int = 0
        """Groups in flight per lane and stage; 0 = two per worker over the rank's lanes."""

        prefetch_steps: int = Execution.prefetch_steps
        retry_deadline: float = RetryPolicy.deadline
        """Seconds to keep retrying a failing read from a URL (s3://, https://...) before
        the run stops naming the shard and offset; a read is never skipped."""

        coalesce_bytes: int = Coalesce.max_bytes
        """Largest range request merging neighbouring samples of one remote shard
        (0: one request per sample)."""

        background: bool = False
        """Run the lanes and collation in a driver thread, ``prefetch_steps`` ahead."""

        backlog_mb: int = (Execution.backlog_bytes or 0) >> 20
        """MiB of finished documents this rank's lanes may hold before they stop drawing
        new samples (backpressure, never drops); 0 = no bound."""

        pin_memory: bool = Execution.pin_memory
        """Collate into page-locked memory (CUDA hosts): the copy to the device is then
        ``non_blocking`` without a staging copy."""

        normalize_on_device: bool = True
        """With ``image_preset``: ship uint8 pixels and normalize them on ``device`` (a
        quarter of the bytes through the host and the copy; the same floats). A recipe file
        chooses with ``normalize = "device"`` in its ``[image]`` table."""

        device: str = "auto"
        """Where batches with uint8 pixels are normalized: ``auto`` = this rank's CUDA device
        when there is one, else the CPU (the same floats either way)."""

        stall_seconds: float | None = Execution.stall_seconds
        """Log each lane's drops by reason after this many seconds without a row."""

        stall_drops: int | None = Execution.stall_drops
        """Stop with an error saying why when a lane drops this many samples in a row."""

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
        check_ignored_fields(config)
        if config.model_format not in family_names():
            raise ConfigError(f"zephon dataloader: model_format must be a registered model "
                              f"family ({', '.join(family_names())}), got "
                              f"{config.model_format!r}")
        self.family = get_family(config.model_format)
        self.titan_options = TitanOptions(video_mode=config.video_mode, mrope=config.mrope)
        self.device = torch.device(
            (f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
            if config.device == "auto" else config.device)
        if config.video_mode not in ("merge", "split"):
            raise ConfigError(f"zephon dataloader: video_mode must be 'merge' or 'split', got "
                              f"{config.video_mode!r}")
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.local_batch_size = local_batch_size
        overrides: dict[str, Any] = {}
        if not config.infinite:
            overrides["epochs"] = 1
        if config.image_preset:
            if not self.family.vision:
                raise ConfigError(
                    f"zephon dataloader: image_preset={config.image_preset!r} sets a vision "
                    f"encoder's image settings, but model_format={config.model_format!r} takes "
                    "no images; use a VLM recipe with a vision model_format (e.g. "
                    "--dataloader.model_format qwen3_5), or leave image_preset empty")
            image = preset_image_settings(config.image_preset, config.max_pixels,
                                          config.min_pixels, config.max_patches)
            if config.normalize_on_device:
                image = dataclasses.replace(image, normalize="device")
            overrides["image"] = image
            overrides["family"] = self.family.name
        G = config.global_batch_size
        if not G:  # the recipe's own: a property of the data, the same at every D
            G = self._load_recipe(config, seq_len, overrides).global_batch_size
        check_trainer_batch(G, config.trainer_global_batch_size, local_batch_size,
                            dp_world_size)
        self.microbatches = check_geometry(config.num_lanes, G, dp_world_size,
                                           local_batch_size)
        self.recipe = self._load_recipe(config, seq_len, overrides, G)
        if self.recipe.seq_len != seq_len or self.recipe.global_batch_size != G:
            raise ConfigError(f"recipe {config.recipe!r} ignored seq_len/global_batch_size "
                              f"overrides (got S={self.recipe.seq_len}, "
                              f"G={self.recipe.global_batch_size})")
        try:
            self.family.check_recipe(self.recipe)
        except ConfigError as exc:
            raise ConfigError(f"zephon dataloader: model_format={config.model_format!r}, "
                              f"recipe {config.recipe!r}: {exc}") from None
        if tokenizer is not None:
            check_tokenizer(tokenizer, self.recipe, config.recipe)
        self.execution = Execution(runner=config.runner, workers=parse_workers(config.workers),
                                   runners=parse_runners(config.runners),
                                   ray_address=config.ray_address or None,
                                   ray_resources=parse_resources(config.ray_resources),
                                   default_workers=config.default_workers or None,
                                   group_size=config.group_size, prefetch=config.prefetch or None,
                                   prefetch_steps=config.prefetch_steps,
                                   stall_seconds=config.stall_seconds,
                                   stall_drops=config.stall_drops,
                                   retry=RetryPolicy(deadline=config.retry_deadline),
                                   coalesce=Coalesce(max_bytes=config.coalesce_bytes),
                                   backlog_bytes=(config.backlog_mb << 20) or None,
                                   pin_memory=config.pin_memory)
        problem = unknown_operators(self.recipe.ops, self.execution)
        if problem:
            raise ConfigError(f"zephon dataloader: {problem} (--dataloader.workers, "
                              "--dataloader.runners)")
        self.loader = Loader(self.recipe, dp_rank, dp_world_size, self.execution,
                             microbatches=self.microbatches, background=config.background,
                             ledger=config.ledger or None)
        self._pending: list[dict[str, Any]] = []
        self._warned_no_vision = False
        self._waited_s = 0.0  # the trainer's time blocked in __iter__ (zephon_vl.titan.metrics)
        log.info("zephon dataloader: %s", self.loader.explain().splitlines()[0])

    @staticmethod
    def _load_recipe(config: Config, seq_len: int, overrides: dict[str, Any],
                     global_batch_size: int | None = None) -> Any:
        try:
            return load_recipe(config.recipe, num_lanes=config.num_lanes,
                               global_batch_size=global_batch_size, seq_len=seq_len,
                               seed=config.seed, **overrides)
        except TypeError as exc:
            if "image" in overrides and "image" in str(exc):
                raise ConfigError(
                    f"zephon dataloader: image_preset={config.image_preset!r} on recipe "
                    f"{config.recipe!r}, which takes no image settings (a text recipe); leave "
                    "image_preset empty, or use a VLM recipe (e.g. vlm-demo)") from None
            raise
        except ConfigError as exc:
            if global_batch_size is None:
                raise ConfigError(
                    f"{exc} (global_batch_size 0 takes the recipe's own; set "
                    "--dataloader.global_batch_size and --training.global_batch_size)") from None
            raise

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

    def convert(self, batch: dict[str, Any]) -> tuple[dict[str, Any], torch.Tensor]:
        """One collated zephon micro-batch -> TorchTitan's ``(input_dict, labels)``.

        A batch with uint8 pixels (``ImageSettings(normalize="device")``) is
        moved to the trainer's device here and normalized there (`to_device`).
        """
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


def check_ignored_fields(config: ZephonDataLoader.Config) -> None:
    """Refuse TorchTitan's dataset fields: zephon's data is what its recipe names."""
    for name in ("dataset", "dataset_path"):
        value = getattr(config, name)
        if value:
            raise ConfigError(
                f"zephon dataloader: --dataloader.{name} {value!r} is TorchTitan's Hugging Face "
                "dataset option, which zephon does not read: it reads the datasets its recipe "
                "names. Use --dataloader.recipe (a built-in name, or a recipe TOML file whose "
                "[[datasets]] list your shards and text files) and leave "
                f"--dataloader.{name} unset")


def check_trainer_batch(global_batch_size: int, trainer_global_batch_size: int,
                        local_batch_size: int, dp_world_size: int) -> None:
    """Refuse a trainer whose optimizer step takes another number of rows than zephon's step.

    `trainer_global_batch_size`: TorchTitan's ``training.global_batch_size`` (-1 means
    ``local_batch_size x dp_world_size``), 0 when unknown.
    """
    if not trainer_global_batch_size:
        return
    G, B, D = global_batch_size, local_batch_size, dp_world_size
    trainer = trainer_global_batch_size if trainer_global_batch_size > 0 else B * D
    if trainer == G:
        return
    how = (f"training.global_batch_size={trainer_global_batch_size}"
           if trainer_global_batch_size > 0 else
           f"training.global_batch_size=-1, i.e. local_batch_size x D = {B} x {D} = {trainer}")
    effect = (f"each trainer step would take {trainer // G} zephon steps"
              if trainer > G and trainer % G == 0 else
              "trainer steps would not end on zephon step boundaries, so checkpoints "
              "would be refused")
    raise ConfigError(
        f"zephon dataloader: the trainer's optimizer step takes {trainer} rows ({how}) but "
        f"dataloader.global_batch_size is {G}; {effect}. Set both to the same value: "
        f"--training.global_batch_size {G} (or --dataloader.global_batch_size {trainer} "
        "--training.global_batch_size the same)")


def check_tokenizer(tokenizer: Any, recipe: Any, name: str) -> None:
    """Refuse a trainer tokenizer whose vocabulary or special ids differ from the recipe's.

    The model embeds the ids zephon makes with the recipe's tokenizer; a trainer
    configured with another one (another ``hf_assets_path``) would size the
    model's vocabulary and read the special ids of a different table.
    Objects without ``get_vocab_size`` (not a TorchTitan tokenizer) are not checked.
    """
    if not callable(getattr(tokenizer, "get_vocab_size", None)):
        return
    from zephon_core import load_tokenizer

    path = next((op.tokenizer_path for op in recipe.ops if hasattr(op, "tokenizer_path")), None)
    if path is None:
        return
    ours = load_tokenizer(path)
    theirs_size, our_size = int(tokenizer.get_vocab_size()), len(ours)
    problems = []
    if theirs_size != our_size:
        problems.append(f"vocabulary size {theirs_size} != {our_size}")
    pairs = [("eos_id", ours.eos_token_id)]
    family = recipe_family(recipe)
    if family.vision:
        ids = family.batch_token_ids(recipe.collate.special)
        pairs += [(key.replace("_token_id", "_id"), value) for key, value in ids.items()]
    for attr, want in pairs:
        got = getattr(tokenizer, attr, None)
        if got is not None and want is not None and int(got) != int(want):
            problems.append(f"{attr} {got} != {want}")
    if problems:
        raise ConfigError(
            f"zephon dataloader: the trainer's tokenizer differs from recipe {name!r}'s "
            f"({path}): {', '.join(problems)} (trainer != recipe). zephon tokenizes with the "
            "recipe's tokenizer; point the trainer's --hf_assets_path at the same tokenizer "
            "(the bundled Qwen one: `zephon-vl tokenizer`), or build the recipe with the "
            "trainer's")


def verify_identical(blob: str) -> None:
    """Raise unless every rank holds the same ``blob`` (compares SHA-256s over gloo)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    from zephon_core.engine.checkpoint import gloo_group

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
    ``input``, ``positions``, ``labels`` stacked along the row dimension, and
    ``pixel_values`` (patches) and ``grid_thw`` when the micro-batches carry images.
    """
    rows = {"input": torch.cat([x["input"] for x, _ in micro]),
            "positions": torch.cat([x["positions"] for x, _ in micro]),
            "labels": torch.cat([y for _, y in micro])}
    if any("pixel_values" in x for x, _ in micro):
        rows["pixel_values"] = torch.cat([x["pixel_values"].flatten(0, -2)
                                          for x, _ in micro if "pixel_values" in x])
        rows["grid_thw"] = torch.cat([x["grid_thw"] for x, _ in micro if "grid_thw" in x])
    return rows


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
