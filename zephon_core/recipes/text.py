"""The text-only Python API: files + a tokenizer folder -> batches for one rank.

    loader = text_loader(["a.jsonl", "b.parquet"], "path/to/tokenizer", seq_len=2048,
                         global_batch_size=64, num_lanes=16, dp_rank=rank, dp_world_size=world)
    for batch in loader:            # {"input", "labels", "positions"}: int64 [rows, seq_len]
        ...
    state = loader.state_dict()     # JSON-compatible; resume on any rank count dividing 16
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from zephon_core.common.deprecation import moved_keywords
from zephon_core.common.settings import settings_from_table
from zephon_core.data.formats import DatasetSpec, as_spec, dataset_format, dataset_reader
from zephon_core.data.sources import Dataset, Phase, ShuffleSettings
from zephon_core.engine.execution import Execution
from zephon_core.engine.loader import Loader
from zephon_core.errors import ConfigError
from zephon_core.ops.chat import ChatFraming, chat_framing
from zephon_core.ops.pack import Pack, PackSettings
from zephon_core.ops.read import Read
from zephon_core.ops.shuffle import Shuffle
from zephon_core.ops.text import MinTokens, Tokenize, load_tokenizer
from zephon_core.ops.user import UserOp, as_user_ops, insert_user_ops
from zephon_core.recipes.assets import qwen_tokenizer_dir, text_corpus
from zephon_core.recipes.registry import forwards_to, settings_groups
from zephon_core.spec import Recipe

Files = Sequence[str | os.PathLike]

#: `text_recipe`'s packing keywords before 0.4, now `pack`'s fields (PackSettings)
PACK_KEYWORDS = {k: f"pack.{k}" for k in ("pack_mode", "max_open_bins", "overlong")}


@moved_keywords("text_recipe", "0.4.0", PACK_KEYWORDS)
@settings_groups(pack=PackSettings)
def text_recipe(files: Files | Mapping[str, Files], tokenizer: str | os.PathLike | None, *,
                seq_len: int = 2048, global_batch_size: int = 8, num_lanes: int = 8,
                seed: int = 0, weights: Mapping[str, float] | None = None,
                text_key: str = "text", shuffle_buffer: int = 1024,
                shuffle: ShuffleSettings | Mapping[str, Any] | None = None,
                pack: PackSettings | Mapping[str, Any] | None = None, min_tokens: int = 1,
                epochs: int | None = None, on_error: str = "raise",
                name: str = "text", phases: Sequence[Phase | Mapping[str, Any]] = (),
                phase_lag: int = 32,
                chat: ChatFraming | Mapping[str, Any] | None = None,
                operators: Sequence[UserOp | Mapping[str, Any]] = ()) -> Recipe:
    """A text recipe: shuffle pointers, read, tokenize, drop short documents, pack.

    Records are ``{text_key: str}`` (all trained) or chats under
    ``conversations``/``messages``, framed as ChatML with only assistant turns
    trained; `chat` (a `ChatFraming` or its ``[chat]`` table) changes the framing
    (docs/data-formats.md). `pack` (a `PackSettings` or its fields) packs the rows;
    `shuffle` orders each dataset. `phases` and `phase_lag` make the mixture a schedule
    (`Recipe`). `operators` are the user's own (`UserOp`, docs/operators.md), after
    ``read`` or ``tokenize``. `tokenizer` None: the bundled Qwen vocabulary."""
    if tokenizer is None:
        tokenizer = qwen_tokenizer_dir()
    pack = settings_from_table(PackSettings, pack or {}, "pack")
    datasets = _datasets(files, weights, text_key)
    pad_id = load_tokenizer(tokenizer).pad_token_id or 0
    ops = []
    if shuffle_buffer > 0:
        ops.append(Shuffle(shuffle_buffer))
    ops += [
        Read([d.reader for d in datasets], on_error=on_error),
        Tokenize(tokenizer, text_key="text", on_error=on_error,  # readers rename text_key
                 chat=chat_framing(chat)),
        MinTokens(min_tokens),
        Pack(seq_len, pack, pad_id=pad_id),
    ]
    ops = insert_user_ops(ops, as_user_ops(operators), {"read": "read", "tokenize": "tokenize"},
                          "text")
    return Recipe(datasets, ops, global_batch_size, num_lanes, seed=seed, epochs=epochs,
                  shuffle=settings_from_table(ShuffleSettings, shuffle or {}, "shuffle"),
                  name=name, phases=list(phases),
                  phase_lag=phase_lag)


def _datasets(files: Files | Mapping[str, Files], weights: Mapping[str, float] | None,
              text_key: str) -> list[Dataset]:
    """`text_recipe`'s datasets by name (one unnamed dataset is ``data``), with weights;
    each reader renames `text_key` to ``text``."""
    named = dict(files) if isinstance(files, Mapping) else {"data": files}
    weights = dict(weights or {})
    unknown = set(weights) - set(named)
    if unknown:
        raise ConfigError(f"weights name datasets that do not exist: {sorted(unknown)}")
    datasets = []
    for n, f in named.items():
        spec = as_spec(f)
        if spec.fields:
            raise ConfigError(f"dataset {n!r}: a text recipe reads the key text_key names "
                              f"({text_key!r}); set text_key instead of fields")
        spec = DatasetSpec(spec.files, spec.format, {"text": text_key}, spec.options)
        try:
            reader = dataset_reader(spec, allowed=("text",))
        except ConfigError as exc:
            raise ConfigError(f"dataset {n!r}: {exc}") from None
        datasets.append(Dataset(n, reader, float(weights.get(n, 1.0)), dataset_format(spec)))
    return datasets


@moved_keywords("text_loader", "0.4.0", PACK_KEYWORDS)
def text_loader(files: Files | Mapping[str, Files], tokenizer: str | os.PathLike, *,
                dp_rank: int = 0, dp_world_size: int = 1, execution: Execution | None = None,
                microbatches: int = 1, **recipe_args) -> Loader:
    """A `Loader` for one rank over `text_recipe(files, tokenizer, **recipe_args)`."""
    recipe = text_recipe(files, tokenizer, **recipe_args)
    return Loader(recipe, dp_rank, dp_world_size, execution, microbatches)


@moved_keywords("text_demo", "0.4.0", PACK_KEYWORDS)
@forwards_to(text_recipe)
def text_demo(num_lanes: int = 8, global_batch_size: int = 16, seq_len: int = 512,
              seed: int = 0, **overrides: Any) -> Recipe:
    """Real English text (stdlib docstrings), the real Qwen vocabulary, two datasets 3:1."""
    shards = text_corpus()
    return text_recipe({"docs-a": shards[:3], "docs-b": shards[3:]}, qwen_tokenizer_dir(),
                       weights={"docs-a": 3.0, "docs-b": 1.0}, seq_len=seq_len,
                       global_batch_size=global_batch_size, num_lanes=num_lanes, seed=seed,
                       shuffle_buffer=256, min_tokens=8, name="text-demo", **overrides)
