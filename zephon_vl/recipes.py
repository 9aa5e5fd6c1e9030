"""The vision-language recipe, `vlm_recipe` (the demos built on it: `zephon_vl.demo.recipes`).

Operators, per lane: shuffle pointers -> read samples through each
dataset's format (tar members, LLaVA/messages/OBELICS records, Parquet rows
with embedded images, or text records) -> decode + resize + patchify
(processes) -> tokenize with vision tokens (processes) -> pack with limits on
vision tokens and images per row. A dataset names its format
(:mod:`zephon_core.data.formats`; without one, ``.tar`` shards are
WebDataset data and ``.jsonl``/``.parquet`` files text), and datasets of any
formats mix by weight in one recipe. With
``image_every_row`` (the family's default: on for ``qwen3_5``) a row without
an image gets a small grey placeholder image (:mod:`zephon_vl.ops.filler`).
The recipe's model family (:mod:`zephon_vl.families`) decides the special
tokens, the placeholder layout and the collate; a ``kind = "vlm"`` recipe
file names it with ``family = "..."`` (default ``qwen3_5``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zephon_core import (
    BalancedPack,
    BalanceSettings,
    ChatFraming,
    ConfigError,
    Dataset,
    DatasetSpec,
    Pack,
    PackSettings,
    Phase,
    Read,
    Recipe,
    Shuffle,
    ShuffleSettings,
    UserOp,
    UserTransform,
    load_tokenizer,
)
from zephon_core.extend import (
    PACK_MODES,
    as_user_ops,
    check_lane_geometry,
    dataset_format,
    dataset_keys,
    dataset_reader,
    insert_user_ops,
    moved_keywords,
    setting,
    settings_from_table,
    settings_groups,
)
from zephon_vl.families.base import SpecialTokens, VisionFamily
from zephon_vl.families.registry import vision_family
from zephon_vl.media.image import ImageSettings
from zephon_vl.media.video import VideoSettings
from zephon_vl.ops.collate import VLCollate
from zephon_vl.ops.decode_rows import DecodePlanned
from zephon_vl.ops.filler import image_filler
from zephon_vl.ops.multimodal import DecodeVision, TokenizeMultimodal

#: one dataset: a list of files (their suffix picks the format: ``.tar`` WebDataset shards,
#: ``.jsonl``/``.parquet`` text), one manifest (a path or URL ending in ``.json``, written by
#: ``zephon-vl index``: building the recipe then reads that one file and no shard), a
#: `DatasetSpec` that names its ``format`` (``llava``, ``parquet``, ``messages``,
#: ``obelics``...; docs/data-formats.md), or its fields as a mapping
#: (``{"files": [...], "format": "llava", "image_folder": "..."}``)
DatasetArg = Sequence[str | os.PathLike] | str | DatasetSpec | Mapping[str, Any]


@dataclass(frozen=True)
class VisionPackSettings(PackSettings):
    """How `vlm_recipe` packs documents into rows: `PackSettings` with vision limits and
    the row filler (a recipe file names the fields at its top level: ``max_images = 8``)."""

    pack_mode: str = setting(
        "best_fit", choices=(*PACK_MODES, "balanced"), help="which open row a document goes to: "
        "the first it fits (first_fit) or the one it fills best (best_fit); balanced: "
        "compute-balanced rows (BalancedPack) under the recipe's [balance] settings")
    overlong: str = setting("drop", choices=("drop", "truncate"), help="a document longer "
                            "than seq_len: dropped, or its text truncated (a document with "
                            "images is never cut)")
    max_vision_tokens: int | None = setting(None, unit="tokens", help="the most vision "
                                            "tokens a row holds (none: no limit)")
    max_images: int | None = setting(None, unit="images", help="the most images a row "
                                     "holds (none: no limit)")
    image_every_row: bool | None = setting(
        None, help="append a small placeholder image to rows without one (guarantee 10; "
        "none: the family's default); a dataset's own image_every_row overrides it")
    decode_after_pack: bool = setting(
        True, help="decode images and clips after the packer, for the rows made only "
        "(DecodePlanned, a row transform): open rows hold encoded bytes and a restore "
        "decodes nothing; off: decoded before the packer, for the samples that fit a row "
        "(the default before 0.4; the batches are the same)")


#: `vlm_recipe`'s packing keywords before 0.4, now `pack`'s fields (VisionPackSettings)
PACK_KEYWORDS = {k: f"pack.{k}" for k in ("pack_mode", "max_open_bins", "overlong",
                                          "max_vision_tokens", "max_images", "image_every_row")}


@moved_keywords("vlm_recipe", "0.4.0", PACK_KEYWORDS)
@settings_groups(pack=VisionPackSettings)
@dataset_keys("image_every_row")
def vlm_recipe(shards: Sequence[str | os.PathLike] | Mapping[str, DatasetArg],
               tokenizer: str | os.PathLike | None, *, seq_len: int = 2048,
               global_batch_size: int = 8, num_lanes: int = 8, seed: int = 0,
               weights: Mapping[str, float] | None = None,
               image: ImageSettings | Mapping[str, Any] | None = None,
               video: VideoSettings | Mapping[str, Any] | None = None,
               pack: VisionPackSettings | Mapping[str, Any] | None = None,
               shuffle_buffer: int = 256,
               shuffle: ShuffleSettings | Mapping[str, Any] | None = None,
               on_error: str = "drop", epochs: int | None = None,
               index_cache: str | None = None, name: str = "vlm",
               family: str | VisionFamily = "qwen3_5",
               balance: BalanceSettings | Mapping[str, Any] | None = None,
               phases: Sequence[Phase | Mapping[str, Any]] = (), phase_lag: int = 32,
               chat: ChatFraming | Mapping[str, Any] | str | None = None,
               operators: Sequence[UserOp | Mapping[str, Any]] = ()) -> Recipe:
    """A VLM recipe over datasets of any registered format for a model `family`.

    `shards`: one dataset or ``{name: dataset}`` (`DatasetArg`). How reads from URLs are
    retried is an execution setting (`Execution.retry`): it never changes a batch.

    `on_error` is the bad-input policy (drop or raise). `image`, `video`, `pack`, `shuffle`
    and `balance` are settings or their fields as a mapping (docs/settings.md; `pack`'s
    fields are a recipe file's top-level keys). `pack.image_every_row`
    (None: the family's default) appends the placeholder image to rows without
    one (guarantee 10); a dataset's own ``image_every_row`` (a key of its table)
    overrides it for rows made of its documents only: a row gets the filler
    when none of its documents has an image and one of them comes from a
    dataset that wants it. `chat` frames conversations and ends documents
    (`ChatFraming`, its ``[chat]`` table over the family's `chat_framing`, or
    ``"template"``: the family's chat template exactly). ``pack_mode="balanced"``
    packs compute-balanced rows (`BalancedPack`: each lane's rows of a step
    carry the same vision tokens) under `balance`. `phases` and `phase_lag` make the
    mixture a schedule (`Recipe`; docs/elastic-changes.md). `tokenizer` None: the family's
    own (`VisionFamily.tokenizer_dir`: Kimi's special tokens over the Qwen vocabulary for
    ``kimi_k2_5``, the bundled Qwen vocabulary otherwise). `operators`: docs/operators.md."""
    family = vision_family(family)
    tokenizer = tokenizer if tokenizer is not None else family.tokenizer_dir()
    image, video, pack = _settings(image, video, pack)
    datasets, wants_image = _datasets(shards, weights, index_cache, family.image_every_row
                                      if pack.image_every_row is None else pack.image_every_row)
    special = family.special_tokens(load_tokenizer(tokenizer))
    framing = family.framing(chat)
    ops: list[Any] = [Shuffle(shuffle_buffer)] if shuffle_buffer > 0 else []
    packer = _packer(pack, balance, seq_len, _rows_per_lane(num_lanes, global_batch_size),
                     special.pad, _filler(image, family, special, wants_image))
    ops += [*_stages(datasets, image, video, tokenizer, seq_len, pack, on_error,
                     family, framing, as_user_ops(operators)), packer]
    # the tokenizer leaves planned items undecoded only where the row transform decodes them
    after_pack = not next(o for o in ops if isinstance(o, TokenizeMultimodal)).decode_planned
    return Recipe(datasets, ops, global_batch_size, num_lanes, seed=seed, epochs=epochs,
                  shuffle=settings_from_table(ShuffleSettings, shuffle or {}, "shuffle"),
                  name=name,
                  collate=VLCollate(seq_len, image, special, family),
                  phases=list(phases), phase_lag=phase_lag,
                  row_ops=[DecodePlanned(on_error=on_error)] if after_pack else [])


def _settings(image: ImageSettings | Mapping[str, Any] | None,
              video: VideoSettings | Mapping[str, Any] | None,
              pack: VisionPackSettings | Mapping[str, Any] | None,
              ) -> tuple[ImageSettings, VideoSettings | None, VisionPackSettings]:
    """`vlm_recipe`'s settings objects, each given as one or as its table's fields
    (checked by their declarations, docs/settings.md)."""
    return (settings_from_table(ImageSettings, image or {}, "image"),
            settings_from_table(VideoSettings, video, "video") if video is not None else None,
            settings_from_table(VisionPackSettings, pack or {}, "pack"))


def _rows_per_lane(num_lanes: int, global_batch_size: int) -> int:
    """`G / L`, once the geometry is checked (a lane count of 0 is a `ConfigError` naming
    it, not a division by zero)."""
    check_lane_geometry(num_lanes, global_batch_size)
    return global_batch_size // num_lanes


def _datasets(shards: Sequence[str | os.PathLike] | Mapping[str, DatasetArg],
              weights: Mapping[str, float] | None, index_cache: str | None,
              image_every_row: bool) -> tuple[list[Dataset], list[bool]]:
    """`vlm_recipe`'s datasets by name (one unnamed dataset is ``data``), with weights, and
    whether each wants the row filler (its own ``image_every_row``, else the recipe's)."""
    named = (dict(shards) if isinstance(shards, Mapping) and not isinstance(shards, DatasetSpec)
             else {"data": shards})
    weights = dict(weights or {})
    if set(weights) - set(named):
        raise ConfigError(f"weights name unknown datasets: {sorted(set(weights) - set(named))}")
    datasets, wants_image = [], []
    for n, given in named.items():
        try:
            spec, wants = _image_every_row(given, image_every_row)
            datasets.append(Dataset(n, dataset_reader(spec, index_cache),
                                    float(weights.get(n, 1.0)), dataset_format(spec)))
        except ConfigError as exc:
            raise ConfigError(f"dataset {n!r}: {exc}") from None
        wants_image.append(wants)
    return datasets, wants_image


def _image_every_row(given: DatasetArg, default: bool) -> tuple[DatasetArg, bool]:
    """A dataset without its ``image_every_row`` option, and that option (`default` when
    it has none): a recipe setting per dataset, not its format's."""
    if isinstance(given, Mapping) and "image_every_row" in given:
        given = dict(given)
        wants = given.pop("image_every_row")
    elif isinstance(given, DatasetSpec) and "image_every_row" in given.options:
        options = dict(given.options)
        wants = options.pop("image_every_row")
        given = dataclasses.replace(given, options=options)
    else:
        return given, default
    if not isinstance(wants, bool):
        raise ConfigError(f"image_every_row must be true or false, got {wants!r}")
    return given, wants


#: where the planning operators (read, headers, tokens) run by default when the decode
#: follows the packer (`_stages`)
PLANNING_RUNNER = "threads"


def _stages(datasets: list[Dataset], image: ImageSettings, video: VideoSettings | None,
            tokenizer: str | os.PathLike, seq_len: int, pack: VisionPackSettings, on_error: str,
            family: VisionFamily, framing: ChatFraming, user: list[UserOp]) -> list[Any]:
    """The per-sample operators between the shuffle and the packer: read through each
    dataset's format, decode the vision inputs (with the user's ``pixels`` operators),
    tokenize with vision tokens; the user's other operators where they say.

    Without user operators after the read, images and clips are planned from their
    headers (`zephon_vl.media.planned`): the tokenizer decodes a sample only if it fits a
    row, or, with `pack.decode_after_pack`, nothing is decoded before the packer
    (`DecodePlanned`, the recipe's row transform, decodes the rows made). An operator
    after ``decode`` or ``tokenize`` sees pixels, so with one every sample is decoded
    first.

    When nothing is decoded before the packer and the user adds no operator, the three
    run in one thread of the loader's process by default (`PLANNING_RUNNER`): reading
    bytes, headers and the tokenizer (which releases the GIL) cost a tenth of the decode,
    and a thread hands the lane its bytes without a copy into shared memory or a process
    of its own (one process fewer per rank: its memory, and no messages both ways). An
    explicit `Execution` runner for them wins."""
    plan = all(u.after == "read" for u in user)
    after = plan and pack.decode_after_pack
    ops = [
        Read([d.reader for d in datasets], on_error=on_error),
        DecodeVision(image, video, on_error=on_error, pixel_ops=_pixel_ops(user),
                     plan=plan),
        TokenizeMultimodal(tokenizer, image.merge_size, seq_len, overlong=pack.overlong,
                           on_error=on_error, family=family, chat=framing,
                           decode_planned=not after),
    ]
    if after and not user:
        for op in ops:
            op.default_runner = PLANNING_RUNNER
    return insert_user_ops(ops, [u for u in user if u.after != "pixels"],
                           {"read": "read", "decode": "decode", "tokenize": "tokenize"}, "vlm")


def _pixel_ops(user: list[UserOp]) -> list[UserTransform]:
    """The user's ``pixels`` operators, run by the decode operator (its stage ships them)."""
    out = []
    for u in user:
        if u.after == "pixels":
            t = u.operator()
            t.host = "decode"
            out.append(t)
    return out


def _limits(pack: VisionPackSettings) -> dict[str, int]:
    """The per-row limits the packer keeps (a None limit is no limit)."""
    return {key: value for key, value in (("vision_tokens", pack.max_vision_tokens),
                                          ("images", pack.max_images)) if value is not None}


def _filler(image: ImageSettings, family: VisionFamily, special: SpecialTokens,
            wants_image: list[bool]) -> Any:
    """The placeholder image for rows without one, limited to the datasets that want it
    (None when none does)."""
    if not any(wants_image):
        return None
    filler = image_filler(image, family, special)
    if not all(wants_image):
        filler = dataclasses.replace(filler, datasets=frozenset(
            i for i, wants in enumerate(wants_image) if wants))
    return filler


def _packer(pack: VisionPackSettings, balance: BalanceSettings | Mapping[str, Any] | None,
            seq_len: int, rows_per_group: int, pad_id: int, filler: Any) -> Any:
    """The combiner `pack.pack_mode` names: `BalancedPack` under `balance`, else `Pack`."""
    limits = _limits(pack)
    if pack.pack_mode == "balanced":
        if balance is None:
            raise ConfigError("pack_mode='balanced' needs balance settings with a budget of "
                              "vision tokens per row ([balance] budget = ...); `zephon-vl "
                              "balance` reports the mean of a recipe as "
                              "mean_vision_tokens_per_row")
        b = settings_from_table(BalanceSettings, balance, "balance")
        return BalancedPack(seq_len, "vision_tokens", b, rows_per_group=rows_per_group,
                            limits=limits, pad_id=pad_id, filler=filler)
    if balance is not None:
        raise ConfigError(f"balance settings apply to pack_mode='balanced', not "
                          f"{pack.pack_mode!r}")
    text_pack = PackSettings(pack.pack_mode, pack.max_open_bins, overlong="drop")
    return Pack(seq_len, text_pack, limits=limits, pad_id=pad_id, filler=filler)
