"""A tiny plugin as a third-party package would write one: a format for ``.lines`` files
(one sample a line: ``<id> <n>``), a recipe kind that reads it, and a named recipe, all
registered by `register`, which the tests name in an entry point of group
``zephon.plugins`` (tests/core/test_plugins.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from zephon_core import ConfigError, DatasetSpec, register_kind, register_recipe
from zephon_core.extend import register_format


class LinesReader:
    """Each file a shard, each line a sample ``{"id": int, "n": int}``."""

    def __init__(self, paths: list[str], skip_blank: bool) -> None:
        self.paths = paths
        self._lines = []
        for path in paths:
            with open(path) as f:
                lines = [line.strip() for line in f]
            self._lines.append([ln for ln in lines if ln or not skip_blank])

    @property
    def num_shards(self) -> int:
        return len(self.paths)

    def shard_len(self, shard: int) -> int:
        return len(self._lines[shard])

    def shard_identity(self, shard: int) -> dict:
        return {"name": os.path.basename(self.paths[shard]), "samples": self.shard_len(shard)}

    def read(self, shard: int, index: int) -> Any:
        sample_id, n = self._lines[shard][index].split()
        return {"id": int(sample_id), "n": int(n)}


class LinesFormat:
    name = "tiny-lines"
    fields: Mapping[str, str] = {}
    options: tuple[str, ...] = ("skip_blank", "notes_folder")
    path_options: tuple[str, ...] = ("notes_folder",)
    reads_folders = False

    def reader(self, spec: DatasetSpec, fields: Mapping[str, str],
               index_cache: str | None) -> LinesReader:
        skip = spec.options.get("skip_blank", True)
        if not isinstance(skip, bool):
            raise ConfigError(f"skip_blank must be true or false, got {skip!r}")
        return LinesReader(spec.file_list, skip)


def lines_recipe(files: Mapping[str, Any], tokenizer: Any = None, *,
                 weights: Mapping[str, float] | None = None, seq_len: int = 16,
                 num_lanes: int = 2, global_batch_size: int = 4, seed: int = 0,
                 name: str = "lines") -> Any:
    """A recipe kind over any registered format: synthetic tokens, packed."""
    from tests.helpers.core import to_tokens
    from zephon_core import Dataset, Map, Pack, Read, Recipe
    from zephon_core.extend import dataset_format, dataset_reader

    datasets = [Dataset(n, dataset_reader(f), float((weights or {}).get(n, 1.0)),
                        dataset_format(f)) for n, f in files.items()]
    ops = [Read([d.reader for d in datasets]), Map(to_tokens, name="tokens"), Pack(seq_len)]
    return Recipe(datasets=datasets, ops=ops, global_batch_size=global_batch_size,
                  num_lanes=num_lanes, seed=seed, name=name)


def lines_demo(folder: str, **overrides: Any) -> Any:
    """A named recipe: every ``.lines`` file of `folder`, by the suffix rule."""
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".lines"))
    return lines_recipe({"lines": files}, **overrides)


def register() -> None:
    register_format("tiny-lines", "tests.helpers.tiny_plugin:LinesFormat",
                    suffixes=(".lines",))
    register_kind("tiny-lines", "tests.helpers.tiny_plugin:lines_recipe")
    register_recipe("tiny-lines-demo", "tests.helpers.tiny_plugin:lines_demo")
