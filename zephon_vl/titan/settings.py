"""The TorchTitan config's `Execution` fields, generated from `Execution`'s declaration.

Every `Execution` leaf (`zephon_core.extend.flat_settings`) becomes a field of
``ZephonDataLoader.Config`` under its flat name and in its unit, with its help
(``--dataloader.retry_deadline``, ``--dataloader.backlog_bytes``): the same names,
units and spellings as the command line's flags, read back by `Execution.from_flat`.
A mapping (``workers``) is a string of ``OP=N`` items there, as on the command line.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import tyro
from torchtitan.components.dataloader import BaseDataLoader

from zephon_core import Execution
from zephon_core.extend import FlatSetting, flat_settings


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
