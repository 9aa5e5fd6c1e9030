"""Named recipes and TOML recipe files, registered explicitly, resolved lazily.

Built-in recipes and TOML kinds are a table of ``"module:function"`` names,
imported only when one is asked for: nothing registers on import, every entry
point (Python, the command line, TorchTitan, torchrun jobs) sees the same
names, and the core never imports zephon_vl unless a VL recipe is loaded.
Users add their own with `register_recipe` and `register_kind`.

A TOML recipe file looks like::

    kind = "text"                 # "text" or "vlm" (zephon_vl), or a registered kind
    tokenizer = "qwen"            # "qwen" = the bundled Qwen3.6 vocabulary, or a folder;
                                  # left out: the kind's own (vlm: the family's, e.g. Kimi's)
    seq_len = 1024
    global_batch_size = 16
    num_lanes = 8
    seed = 0
    [shuffle]                     # optional: ShuffleSettings fields
    block_size = 256
    [[datasets]]
    name = "web"
    files = ["data/web-000.jsonl", "data/web-001.jsonl"]
    weight = 3.0
    [[datasets]]                  # WebDataset kinds: shard URLs, or one manifest
    name = "laion"
    manifest = "s3://bucket/laion/manifest.json"   # from `zephon-vl index`
    [[datasets]]                  # a named format (zephon_core.data.formats)
    name = "llava"
    format = "llava"
    files = ["llava_instruct_150k.json"]
    image_folder = "coco/train2017"
    fields = { conversations = "turns" }          # renamed fields, if any
    phase_lag = 32                # optional, with [[phases]]: see docs/elastic-changes.md
    mix_by = "tokens"             # optional: weights count tokens, not samples
    [[phases]]                    # optional mixture schedule: from step 1000 on, 1:1
    start_step = 1000
    weights = { web = 1.0, laion = 1.0 }   # a dataset not named weighs 0 in the phase
    [[operators]]                 # optional: the user's own (docs/operators.md)
    call = "mypkg.ops:min_side"   # an importable function
    after = "pixels"              # read, pixels (vlm), decode (vlm) or tokenize
    kind = "filter"               # map (default) or filter
    args = { min_side = 64 }      # its keyword arguments
    version = "1"                 # bump it when the function changes

Relative file paths are relative to the TOML file; URLs (``s3://``,
``https://``...) are kept as written, never resolved as local paths. Every other top-level key
is a keyword argument of the kind's factory (``text_recipe``, ``vlm_recipe``),
called as ``factory(files_by_dataset, tokenizer, weights=..., **keys)``, or a field
of one of its settings groups (`settings_groups`: ``pack_mode = "first_fit"`` is
``pack=PackSettings(pack_mode="first_fit")``); a file without ``tokenizer`` passes
None, and the factory picks its default. The tables (``[shuffle]``, ``[image]``...)
are read by `settings_from_table`: their fields, help and units are in docs/settings.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import tomllib
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zephon_core.common.deprecation import Deprecation, renamed_keys
from zephon_core.common.settings import settings_from_table
from zephon_core.data.formats import DatasetSpec, known_formats
from zephon_core.data.locations import is_remote, local_path
from zephon_core.data.sources import Phase, ShuffleSettings
from zephon_core.errors import ConfigError, UnknownKeyError
from zephon_core.ops.user import user_ops_from_tables
from zephon_core.spec import Recipe

RecipeFactory = Callable[..., Recipe]
#: a factory, or where to import it from: ``"package.module:function"``
FactoryRef = RecipeFactory | str

_RECIPES: dict[str, FactoryRef] = {
    "text-demo": "zephon_core.recipes.text:text_demo",
    "vlm-demo": "zephon_vl.demo.recipes:vlm_demo",
    "vlm-mix-demo": "zephon_vl.demo.recipes:vlm_mix_demo",
    "vlm-mix-demo-balanced": "zephon_vl.demo.recipes:vlm_mix_demo_balanced",
}
_KINDS: dict[str, FactoryRef] = {
    "text": "zephon_core.recipes.text:text_recipe",
    "vlm": "zephon_vl.recipes:vlm_recipe",
}
_DATASET_KEYS = ("name", "files", "manifest", "weight", "format", "fields")
#: dataset options that name folders: resolved relative to the TOML file like files
_FOLDER_OPTIONS = ("image_folder", "video_folder")
#: dataset options that list folders (or URL prefixes): each entry resolved like a folder
_FOLDER_LIST_OPTIONS = ("allow_references",)
#: other options a format may take (it refuses the ones it does not); ``image_every_row``
#: is a VLM recipe's per-dataset filler switch (`vlm_recipe` takes it out)
_OTHER_OPTIONS = ("row_group_cache", "image_every_row", "max_image_bytes", "max_video_bytes",
                  "version")
#: the keys of a ``[[phases]]`` table
_PHASE_KEYS = ("start_step", "weights", "global_batch_size")
#: the keys a recipe file takes besides its kind's keywords (popped before the factory)
_FILE_KEYS = ("kind", "tokenizer", "datasets", "mix_by")
#: renamed recipe-file keys, ``dict([renamed_key("old" or "table.old", "new", since), ...])``
#: (`zephon_core.common.deprecation`): each still read, with a DeprecationWarning naming the
#: file, until one minor version after `since` (docs/api.md); none so far
RENAMED_KEYS: dict[str, tuple[str, Deprecation]] = {}


def register_recipe(name: str, factory: FactoryRef) -> None:
    """Make `name` loadable by `load_recipe` everywhere; `factory(**overrides)` builds it."""
    _RECIPES[name] = factory


def register_kind(kind: str, factory: FactoryRef) -> None:
    """TOML files with ``kind = "<kind>"`` are built by
    ``factory(files_by_dataset, tokenizer, weights=..., **other_keys)``."""
    _KINDS[kind] = factory


def forwards_to(target: Callable[..., Any]) -> Callable[[RecipeFactory], RecipeFactory]:
    """Mark a factory whose ``**overrides`` go to `target` (``text_demo`` -> ``text_recipe``),
    so `load_recipe` refuses an override neither takes before calling it."""
    def mark(factory: RecipeFactory) -> RecipeFactory:
        factory.__zephon_forwards__ = target  # type: ignore[attr-defined]
        return factory
    return mark


def settings_groups(**groups: type) -> Callable[[RecipeFactory], RecipeFactory]:
    """Mark a factory whose settings parameters (``pack=PackSettings``) a recipe file and
    `load_recipe` also take as the settings' fields at the top level, under the same names
    (``pack_mode = "balanced"``): one name per setting everywhere."""
    def mark(factory: RecipeFactory) -> RecipeFactory:
        factory.__zephon_groups__ = groups  # type: ignore[attr-defined]
        return factory
    return mark


def groups_of(factory: Callable[..., Any]) -> dict[str, type]:
    """`factory`'s `settings_groups`, following `forwards_to` (its own win)."""
    target = getattr(factory, "__zephon_forwards__", None)
    inherited = groups_of(target) if target is not None else {}
    return {**inherited, **getattr(factory, "__zephon_groups__", {})}


def gather_groups(factory: Callable[..., Any], fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` with the top-level fields of `factory`'s settings groups moved into their
    group (``{"pack_mode": "balanced"}`` -> ``{"pack": {"pack_mode": "balanced"}}``), over
    a group given too (its object's fields, or its mapping); naming one twice is refused."""
    out = dict(fields)
    for param, cls in groups_of(factory).items():
        names = [f.name for f in dataclasses.fields(cls)]
        flat = {k: out.pop(k) for k in names if k in out}
        if not flat:
            continue
        given = out.get(param)
        if isinstance(given, cls):
            out[param] = settings_from_table(cls, flat, param, base=given)
            continue
        given = dict(given or {})
        twice = sorted(set(given) & set(flat))
        if twice:
            raise ConfigError(f"{twice[0]} is given twice: at the top level and in {param}; "
                              "give it once")
        out[param] = {**given, **flat}
    return out


def accepted_keys(factory: Callable[..., Any]) -> set[str] | None:
    """The keyword names `factory` takes (following `forwards_to`), with the fields of its
    `settings_groups`; None: any."""
    params = inspect.signature(factory).parameters
    named = {k for k, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    named |= {f.name for cls in getattr(factory, "__zephon_groups__", {}).values()
              for f in dataclasses.fields(cls)}
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return named
    target = getattr(factory, "__zephon_forwards__", None)
    if target is None:
        return None
    more = accepted_keys(target)
    return None if more is None else named | more


def builtin_names() -> list[str]:
    """Names `load_recipe` knows (built in or registered)."""
    return sorted(_RECIPES)


def _resolve(ref: FactoryRef, what: str) -> RecipeFactory:
    if callable(ref):
        return ref
    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise ConfigError(f"{what} needs {module}, which cannot be imported ({exc}); "
                          "install the package that provides it") from None


def load_recipe(name_or_path: str | Path, **overrides: Any) -> Recipe:
    """A built-in recipe by name, or a TOML file; `overrides` replace fields (e.g. num_lanes)."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    name = str(name_or_path)
    if name in _RECIPES:
        factory = _resolve(_RECIPES[name], f"recipe {name!r}")
        known = accepted_keys(factory)
        for key in overrides:
            if known is not None and key not in known:
                raise UnknownKeyError(f"recipe {name!r} takes no {key!r}; it takes "
                                      f"{', '.join(sorted(known))}", key)
        return factory(**gather_groups(factory, overrides))
    path = Path(name)
    if not path.is_file():
        raise ConfigError(f"unknown recipe {name!r}: not a built-in "
                          f"({', '.join(builtin_names())}) and not a TOML file")
    return recipe_from_toml(path, **overrides)


def recipe_from_toml(path: str | Path, **overrides: Any) -> Recipe:
    """Build the recipe a TOML file describes (see the module docstring)."""
    path = Path(path)
    try:
        fields = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None
    fields = renamed_keys(fields, RENAMED_KEYS, str(path))
    for key in ("retry", "execution"):
        if key in fields:
            raise ConfigError(f"{path}: [{key}] is an execution setting, not the recipe's (it "
                              "never changes a batch): set Execution(retry=RetryPolicy(...)), "
                              "--retry-deadline on the command line, or retry_deadline in the "
                              "TorchTitan config")
    kind = fields.pop("kind", "text")
    if kind not in _KINDS:
        raise ConfigError(f"{path}: unknown recipe kind {kind!r}; known: {sorted(_KINDS)}")
    factory = _resolve(_KINDS[kind], f"{path}: kind {kind!r}")
    try:
        files, weights = _datasets(fields.pop("datasets", None), path.parent)
        tokenizer = fields.pop("tokenizer", None)
        if tokenizer == "qwen":
            from zephon_core.recipes.assets import qwen_tokenizer_dir

            tokenizer = qwen_tokenizer_dir()
        if "phases" in fields:
            fields["phases"] = phases_from_tables(fields["phases"])
        if "operators" in fields:
            fields["operators"] = user_ops_from_tables(fields["operators"])
        mix_by = fields.pop("mix_by", None)
        if "shuffle" in fields:
            fields["shuffle"] = settings_from_table(ShuffleSettings, fields["shuffle"], "shuffle")
        fields.setdefault("name", path.stem)
        fields.update(overrides)
        _check_keys(factory, fields, kind)
        recipe = factory(files, tokenizer, weights=weights, **gather_groups(factory, fields))
        return recipe if mix_by is None else dataclasses.replace(recipe, mix_by=mix_by)
    except UnknownKeyError as exc:
        raise UnknownKeyError(f"{path}: {exc}", exc.key) from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _check_keys(factory: RecipeFactory, fields: dict[str, Any], kind: str) -> None:
    known = _keyword_keys(factory)
    if known is None:
        return  # the factory takes any key; it reports its own
    for key in fields:
        if key not in known:
            raise UnknownKeyError(f"unknown key {key!r} for kind {kind!r}; known: kind, "
                                  f"tokenizer, datasets, {', '.join(known)}", key)


def _keyword_keys(factory: RecipeFactory) -> list[str] | None:
    """The top-level keys a recipe file gives `factory` as keywords: its parameters after
    the first two (files, tokenizer), less ``weights``, and its settings groups' fields;
    None when it takes any (``**kwargs``)."""
    params = inspect.signature(factory).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    known = [k for k, p in list(params.items())[2:] if k != "weights"]
    return known + [f.name for cls in groups_of(factory).values()
                    for f in dataclasses.fields(cls)]


def recipe_file_keys() -> dict[str, dict[str, list[str]]]:
    """The keys recipe files accept, by kind and table: ``""`` (the top level),
    ``"[shuffle]"``, ``"[pack]"``... (one per settings parameter of the kind's factory),
    ``"[[datasets]]"`` and ``"[[phases]]"``; derived from the declarations the reader checks
    against (docs/api.txt lists them). A factory that takes ``**kwargs`` lists ``"*"``."""
    out = {}
    for kind, ref in sorted(_KINDS.items()):
        factory = _resolve(ref, f"kind {kind!r}")
        keywords = _keyword_keys(factory)
        tables = {"": sorted({*_FILE_KEYS, "phases",
                              *(keywords if keywords is not None else ["*"])}),
                  "[[datasets]]": sorted((*_DATASET_KEYS, *_FOLDER_OPTIONS, *_OTHER_OPTIONS)),
                  "[[phases]]": sorted(_PHASE_KEYS)}
        for param, cls in _settings_parameters(factory).items():
            tables[f"[{param}]"] = sorted(f.name for f in dataclasses.fields(cls)
                                          if not f.name.startswith("_"))
        out[kind] = tables
    return out


def _settings_parameters(factory: RecipeFactory) -> dict[str, type]:
    """`factory`'s parameters that take a settings object or its table (``shuffle:
    ShuffleSettings | Mapping | None``): parameter -> settings class."""
    hints = typing.get_type_hints(factory)
    out = {}
    for name, tp in hints.items():
        args = typing.get_args(tp) or (tp,)
        found = [a for a in args if isinstance(a, type) and dataclasses.is_dataclass(a)]
        if found and name != "return":
            out[name] = found[0]
    return out


def _datasets(tables: Any, base: Path) -> tuple[dict[str, Any], dict[str, float]]:
    """``[[datasets]]`` -> each dataset by name (relative to `base`) and weights.

    A dataset is its files list (or manifest) when the table names no format,
    fields or options, as factories always took it; else a `DatasetSpec`.
    """
    if not tables or not isinstance(tables, list):
        raise ConfigError("a recipe file needs at least one [[datasets]] table")
    files: dict[str, Any] = {}
    weights: dict[str, float] = {}
    keys = (*_DATASET_KEYS, *_FOLDER_OPTIONS, *_FOLDER_LIST_OPTIONS, *_OTHER_OPTIONS)
    for i, d in enumerate(tables):
        unknown = sorted(set(d) - set(keys))
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r} in [[datasets]] #{i + 1}; "
                              f"known: {', '.join(keys)}")
        if "name" not in d or bool(d.get("files")) == bool(d.get("manifest")):
            raise ConfigError(f"[[datasets]] #{i + 1} needs a name and either a files list "
                              "or a manifest")
        if d.get("manifest"):
            found: Any = _location(d["manifest"], base)
        else:
            if not isinstance(d["files"], list):
                raise ConfigError(f"[[datasets]] #{i + 1}: files must be a list of paths or "
                                  "URLs")
            found = [_location(f, base) for f in d["files"]]
        options = {k: _location(d[k], base) for k in _FOLDER_OPTIONS if k in d}
        options.update({k: [_location(v, base) for v in d[k]] if isinstance(d[k], list)
                        else d[k] for k in _FOLDER_LIST_OPTIONS if k in d})
        options.update({k: d[k] for k in _OTHER_OPTIONS if k in d})
        if "format" in d or "fields" in d or options:
            fmt = d.get("format")
            if fmt is not None and not isinstance(fmt, str):
                raise ConfigError(f"[[datasets]] #{i + 1}: format must be a string, got "
                                  f"{fmt!r}; known: {', '.join(known_formats())}")
            fields = d.get("fields", {})
            if not isinstance(fields, dict):
                raise ConfigError(f"[[datasets]] #{i + 1}: fields must be a table "
                                  "(fields = { field = \"column\" })")
            found = DatasetSpec(found, fmt, fields, options)
        files[d["name"]] = found
        weights[d["name"]] = float(d.get("weight", 1.0))
    return files, weights


def phases_from_tables(tables: Any) -> list[Phase]:
    """``[[phases]]`` tables -> `Phase`s; an unknown or missing key is named."""
    if not isinstance(tables, list):
        raise ConfigError("phases must be an array of tables ([[phases]])")
    out = []
    for i, t in enumerate(tables):
        known = set(_PHASE_KEYS)
        if not isinstance(t, dict) or set(t) - known or "start_step" not in t or \
                not isinstance(t.get("weights", {}), dict) or \
                not ({"weights", "global_batch_size"} & set(t)):
            keys = sorted(t) if isinstance(t, dict) else t
            raise ConfigError(f"[[phases]] #{i + 1} needs start_step (an int) and a weights "
                              "table (dataset name = weight), a global_batch_size or both; it "
                              f"has {keys}")
        weights = t.get("weights")
        out.append(Phase(t["start_step"],
                         None if weights is None else {str(k): float(v)
                                                       for k, v in weights.items()},
                         t.get("global_batch_size")))
    return out


def _location(entry: Any, base: Path) -> str:
    """A URL as written (never resolved as a local path); a path relative to `base`."""
    if not isinstance(entry, str):
        raise ConfigError(f"expected a path or URL string, got {entry!r}")
    return entry if is_remote(entry) else str((base / local_path(entry)).resolve())
