"""``ZephonDataLoader``'s config resolved in one pure function: config -> recipe,
execution, family (`resolve_config`), built once and checked before a worker starts.

Every error names the TorchTitan field to change (``--dataloader.<field>``); errors from
the core carry what went wrong as data (`UnknownKeyError.key`), which is reworded here
for the config's spelling.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from zephon_core import ConfigError, Execution, Recipe, UnknownKeyError, load_recipe
from zephon_core.extend import TokenizerTransform, check_lane_geometry, unknown_operators
from zephon_vl.families.base import ModelFamily, TitanOptions
from zephon_vl.families.registry import family_names, get_family, recipe_family, vision_family
from zephon_vl.titan.settings import execution_of, image_overrides


@dataclass(frozen=True)
class Resolved:
    """What a ``ZephonDataLoader.Config`` means for one rank, checked."""

    recipe: Recipe
    execution: Execution
    family: ModelFamily
    titan_options: TitanOptions
    #: micro-batches (gradient-accumulation steps) per optimizer step
    microbatches: int


def resolve_config(config: Any, *, dp_world_size: int, seq_len: int, local_batch_size: int,
                   tokenizer: Any = None) -> Resolved:
    """Resolve and check a ``ZephonDataLoader.Config``; builds the recipe once (one index
    of the shards). `tokenizer`: the trainer's, checked against the recipe's."""
    check_ignored_fields(config)
    family = _family(config)
    if config.video_mode not in ("merge", "split"):
        raise ConfigError(f"zephon dataloader: video_mode must be 'merge' or 'split', got "
                          f"{config.video_mode!r}")
    try:
        execution = execution_of(config)
    except ConfigError as exc:
        raise ConfigError(f"zephon dataloader: {exc} (--dataloader.<name>)") from None
    G = config.global_batch_size
    if G:  # known before the recipe: refuse a bad geometry before indexing any shard
        check_trainer_batch(G, config.trainer_global_batch_size, local_batch_size,
                            dp_world_size)
        check_geometry(config.num_lanes, G, dp_world_size, local_batch_size)
    recipe = build_recipe(config, seq_len, recipe_overrides(config, family), G or None)
    if not G:  # the recipe's own: a property of the data, the same at every D
        G = recipe.global_batch_size
        check_trainer_batch(G, config.trainer_global_batch_size, local_batch_size,
                            dp_world_size)
    microbatches = check_geometry(config.num_lanes, G, dp_world_size, local_batch_size)
    if recipe.seq_len != seq_len or recipe.global_batch_size != G:
        raise ConfigError(f"recipe {config.recipe!r} ignored seq_len/global_batch_size "
                          f"overrides (got S={recipe.seq_len}, G={recipe.global_batch_size})")
    try:
        family.check_recipe(recipe)
    except ConfigError as exc:
        raise ConfigError(f"zephon dataloader: model_format={config.model_format!r}, "
                          f"recipe {config.recipe!r}: {exc}") from None
    if tokenizer is not None:
        check_tokenizer(tokenizer, recipe, config.recipe)
    problem = unknown_operators([*recipe.ops, *recipe.row_ops], execution)
    if problem:
        raise ConfigError(f"zephon dataloader: {problem} (--dataloader.workers, "
                          "--dataloader.runners)")
    return Resolved(recipe, execution, family,
                    TitanOptions(video_mode=config.video_mode, mrope=config.mrope), microbatches)


def _family(config: Any) -> ModelFamily:
    if config.model_format not in family_names():
        raise ConfigError(f"zephon dataloader: model_format must be a registered model "
                          f"family ({', '.join(family_names())}), got "
                          f"{config.model_format!r}")
    return get_family(config.model_format)


def recipe_overrides(config: Any, family: ModelFamily) -> dict[str, Any]:
    """The recipe fields the config replaces besides geometry and seed."""
    overrides: dict[str, Any] = {}
    if not config.infinite:
        overrides["epochs"] = 1
    if config.image_preset:
        if not family.vision:
            raise ConfigError(
                f"zephon dataloader: image_preset={config.image_preset!r} sets a vision "
                f"encoder's image settings, but model_format={config.model_format!r} takes "
                "no images; use a VLM recipe with a vision model_format (e.g. "
                "--dataloader.model_format qwen3_5), or leave image_preset empty")
        image = preset_image_settings(config.image_preset, **image_overrides(config))
        if config.normalize_on_device:
            image = dataclasses.replace(image, normalize="device")
        overrides["image"] = image
        overrides["family"] = family.name
    return overrides


def build_recipe(config: Any, seq_len: int, overrides: dict[str, Any],
                 global_batch_size: int | None) -> Recipe:
    """The config's recipe (`global_batch_size` None: the recipe's own)."""
    try:
        return load_recipe(config.recipe, num_lanes=config.num_lanes,
                           global_batch_size=global_batch_size, seq_len=seq_len,
                           seed=config.seed, **overrides)
    except UnknownKeyError as exc:
        if exc.key == "image":
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


def preset_image_settings(name: str, max_pixels: int, min_pixels: int | None = None,
                          max_patches: int | None = None) -> Any:
    """The ImageSettings of the vision-language family `name` (``image_preset``);
    `min_pixels`, `max_patches` None: the preset's."""
    try:
        family = vision_family(name)
        if max_patches is not None:
            return family.image_settings(max_pixels, min_pixels, max_patches=max_patches)
        return family.image_settings(max_pixels, min_pixels)
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
    try:
        check_lane_geometry(L, G, D, hint=" (--dataloader.num_lanes)")
    except ConfigError as exc:
        raise ConfigError(f"zephon dataloader: {exc}") from None
    if G % (B * D):
        raise ConfigError(
            f"zephon dataloader: global_batch_size={G} is not divisible by local_batch_size x "
            f"dp_world_size = {B} x {D} = {B * D}; each rank needs a whole number of "
            "micro-batches per step. Change --training.local_batch_size or "
            "--dataloader.global_batch_size")
    return G // (B * D)


def check_ignored_fields(config: Any) -> None:
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

    path = next((op.tokenizer_path for op in recipe.ops
                 if isinstance(op, TokenizerTransform)), None)
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
