"""Model families by name: the built-in ones, and those a user registers.

The registry starts with the built-in families (``text``, ``qwen3_5``,
``kimi_k2_5``, ``muse_glimmer``) and
changes only through explicit calls: importing a family's module registers
nothing. An installed package adds its families the way it adds formats: its
plugin (entry point group ``zephon.plugins``, docs/architecture.md) calls
`register_family`; plugins load before the first lookup here. A family's name is
the ``model_format`` that selects it in ``ZephonDataLoader.Config`` and the
``family`` of a ``vlm`` recipe file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zephon_core import ConfigError
from zephon_core.extend import ensure_plugins
from zephon_vl.families.base import ModelFamily, VisionFamily, collate_family
from zephon_vl.families.kimi import KimiK25
from zephon_vl.families.muse import MuseGlimmer
from zephon_vl.families.qwen import QwenVL
from zephon_vl.families.text import TextFamily

if TYPE_CHECKING:
    from zephon_core import Recipe

_FAMILIES: dict[str, ModelFamily] = {f.name: f for f in (TextFamily(), QwenVL(), KimiK25(),
                                                          MuseGlimmer())}


def register_family(family: ModelFamily, *, replace: bool = False) -> None:
    """Make `family` available under ``family.name``; a taken name needs ``replace=True``."""
    ensure_plugins()   # a plugin's family never replaces one registered after it
    if not isinstance(family, ModelFamily):
        raise ConfigError(f"register_family takes a ModelFamily instance, got {family!r}")
    if not family.name:
        raise ConfigError(f"{type(family).__name__} has no name; set its `name` attribute")
    if family.name in _FAMILIES and not replace:
        raise ConfigError(f"model family {family.name!r} is already registered "
                          f"({_FAMILIES[family.name]!r}); pass replace=True to replace it")
    _FAMILIES[family.name] = family


def unregister_family(name: str) -> None:
    """Remove a registered family (a test's or a plugin's); unknown names raise ConfigError."""
    get_family(name)
    del _FAMILIES[name]


def family_names() -> list[str]:
    """The registered model families' names, sorted (built-in and plugins' alike): what a
    recipe's ``family`` may name."""
    ensure_plugins()
    return sorted(_FAMILIES)


def get_family(name: str) -> ModelFamily:
    """The family registered as `name`; ConfigError names the known ones otherwise."""
    ensure_plugins()
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ConfigError(f"unknown model family {name!r}; known: "
                          f"{', '.join(family_names())}") from None


def vision_family(family: str | VisionFamily) -> VisionFamily:
    """`family` itself, or the registered vision-language family of that name."""
    found = get_family(family) if isinstance(family, str) else family
    if not isinstance(found, VisionFamily):
        known = [n for n in family_names() if isinstance(_FAMILIES[n], VisionFamily)]
        raise ConfigError(f"model family {found.name!r} takes no images; vision-language "
                          f"families: {', '.join(known)}")
    return found


def recipe_family(recipe: Recipe) -> ModelFamily:
    """The family `recipe`'s batches are laid out for: the one its collate names (a
    collate of a family's layout has a ``family`` attribute), else ``text``."""
    family = collate_family(recipe)
    return family if family is not None else get_family("text")
