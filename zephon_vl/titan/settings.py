"""The TorchTitan config's `Execution` fields, generated from `Execution`'s declaration.

Every `Execution` leaf (`zephon_core.extend.flat_settings`) becomes a field of
``ZephonDataLoader.Config`` under its flat name and in its unit, with its help
(``--dataloader.retry_deadline``, ``--dataloader.backlog_bytes``): the same names,
units and spellings as the command line's flags, read back by `Execution.from_flat`.
A mapping (``workers``) is a string of ``OP=N`` items there, as on the command line.

The image fields that override a family's preset (``--dataloader.max_pixels`` with
``image_preset``) are generated the same way from `ImageSettings`' declarations
(`IMAGE_OVERRIDES`): the same name, unit, help and bounds; ``None`` is "the preset's",
never 0.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import tyro
from torchtitan.components.dataloader import BaseDataLoader

from zephon_core import ConfigError, Execution
from zephon_core.extend import FlatSetting, deprecation, flat_settings
from zephon_vl.media.image import ImageSettings


def titan_type(s: FlatSetting) -> tuple[Any, Any]:
    """The TorchTitan field type and default of one setting: its own, or a string for
    values the config's command line cannot spell natively (mappings)."""
    if s.mapping or s.info.parse is not None:
        return str, s.spell(s.default)
    return s.annotation, s.default


def _field(s: FlatSetting) -> tuple[str, Any, Any]:
    tp, default = titan_type(s)
    unit = f" ({s.info.unit})" if s.info.unit and s.info.unit != "bytes" else ""
    doc = f"{s.info.help}{unit}. Execution knob: never changes a batch."
    return s.name, Annotated[tp, tyro.conf.arg(help=doc)], dataclasses.field(default=default)


#: the base of ``ZephonDataLoader.Config``: one field per `Execution` setting
ExecutionConfig = dataclasses.make_dataclass(
    "ExecutionConfig", [_field(s) for s in flat_settings(Execution)],
    bases=(BaseDataLoader.Config,), kw_only=True, slots=True)
ExecutionConfig.__module__ = __name__
ExecutionConfig.__doc__ = "TorchTitan fields of every `Execution` setting (generated)."


def execution_of(config: Any) -> Execution:
    """The `Execution` a ``ZephonDataLoader.Config`` (or any object with the flat
    names as attributes) describes."""
    return Execution.from_flat({s.name: getattr(config, s.name)
                                for s in flat_settings(Execution)})


#: the `ImageSettings` fields the config overrides on a family's preset (``image_preset``),
#: with the config's defaults: None is "the preset's own"
IMAGE_OVERRIDES: dict[str, int | None] = {"max_pixels": 128 * 32 * 32, "min_pixels": None,
                                          "max_patches": None}
_ZERO_AS_NONE = deprecation("--dataloader.min_pixels 0 / --dataloader.max_patches 0",
                            "None (the preset's own; the default)", "0.4.0")


def _image_leaf(name: str) -> FlatSetting:
    return next(s for s in flat_settings(ImageSettings) if s.name == name)


def _image_field(name: str, default: int | None) -> tuple[str, Any, Any]:
    s = _image_leaf(name)
    tp = s.annotation if default is not None else s.annotation | None
    none = "; None: the preset's own" if default is None else ""
    doc = (f"With ``image_preset``: ImageSettings.{name}, {s.info.help} ({s.info.unit}, "
           f"{s.info.bounds()}{none}).")
    return name, Annotated[tp, tyro.conf.arg(help=doc)], dataclasses.field(default=default)


#: the base of ``ZephonDataLoader.Config``: every `Execution` setting and the image
#: overrides (`IMAGE_OVERRIDES`)
ImageConfig = dataclasses.make_dataclass(
    "ImageConfig", [_image_field(n, d) for n, d in IMAGE_OVERRIDES.items()],
    bases=(ExecutionConfig,), kw_only=True, slots=True)
ImageConfig.__module__ = __name__
ImageConfig.__doc__ = ("TorchTitan fields of every `Execution` setting and of the image "
                       "settings a family's preset takes (generated).")


def image_overrides(config: Any) -> dict[str, int]:
    """The image settings a config sets over the preset (None: the preset's own), each
    checked by its declaration (``--dataloader.min_pixels -5`` is refused naming it). A 0,
    which meant "the preset's" before 0.4, still does, with a DeprecationWarning."""
    out = {}
    for name in IMAGE_OVERRIDES:
        value = getattr(config, name)
        if value == 0 and name != "max_pixels":
            _ZERO_AS_NONE.warn(stacklevel=3)
            value = None
        if value is not None:
            try:
                out[name] = _image_leaf(name).coerce(value)
            except ConfigError as exc:
                raise ConfigError(f"zephon dataloader: {exc}") from None
    return out
