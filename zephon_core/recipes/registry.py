"""Named recipes and TOML recipe files.

A TOML recipe file looks like::

    kind = "text"                 # "text" here; zephon_vl adds "vlm"
    tokenizer = "qwen"            # "qwen" = the bundled Qwen3.6 vocabulary, or a folder
    seq_len = 1024
    global_batch_size = 16
    num_lanes = 8
    seed = 0
    [[datasets]]
    name = "web"
    files = ["data/web-000.jsonl", "data/web-001.jsonl"]
    weight = 3.0

Relative file paths are relative to the TOML file.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zephon_core.errors import ConfigError
from zephon_core.recipes.assets import qwen_tokenizer_dir
from zephon_core.recipes.recipe import Recipe
from zephon_core.recipes.text import text_demo, text_recipe

RecipeFactory = Callable[..., Recipe]
_BUILTIN: dict[str, RecipeFactory] = {}
_KINDS: dict[str, RecipeFactory] = {}


def register_recipe(name: str, factory: RecipeFactory) -> None:
    _BUILTIN[name] = factory


def register_kind(kind: str, factory: RecipeFactory) -> None:
    """`factory(**toml_fields)` builds a recipe of this kind from a TOML file's fields."""
    _KINDS[kind] = factory


def _text_from_toml(tokenizer: str = "qwen", datasets: list[dict] | None = None,
                    **fields: Any) -> Recipe:
    if not datasets:
        raise ConfigError("a text recipe file needs at least one [[datasets]] table")
    files = {d["name"]: d["files"] for d in datasets}
    weights = {d["name"]: float(d.get("weight", 1.0)) for d in datasets}
    tok = qwen_tokenizer_dir() if tokenizer == "qwen" else tokenizer
    return text_recipe(files, tok, weights=weights, **fields)


register_recipe("text-demo", text_demo)
register_kind("text", _text_from_toml)


def builtin_names() -> list[str]:
    return sorted(_BUILTIN)


def load_recipe(name_or_path: str, **overrides: Any) -> Recipe:
    """A built-in recipe by name, or a TOML file; `overrides` replace fields (e.g. num_lanes)."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if name_or_path in _BUILTIN:
        return _BUILTIN[name_or_path](**overrides)
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(f"unknown recipe {name_or_path!r}: not a built-in "
                          f"({', '.join(builtin_names())}) and not a TOML file")
    try:
        fields = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None
    kind = fields.pop("kind", "text")
    if kind not in _KINDS:
        raise ConfigError(f"{path}: unknown recipe kind {kind!r}; known: {sorted(_KINDS)}")
    for d in fields.get("datasets", []):
        d["files"] = [str((path.parent / f).resolve()) for f in d.get("files", [])]
    fields.setdefault("name", path.stem)
    fields.update(overrides)
    return _KINDS[kind](**fields)
