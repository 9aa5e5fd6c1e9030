"""zephon_vl's plugin: the formats, recipes and recipe kinds it adds to the core.

``pyproject.toml`` declares ``register`` in the entry point group ``zephon.plugins``;
the core calls it before its first lookup of a format, a recipe or a kind
(`zephon_core.common.plugins`). Every name is registered as ``"module:attr"``, so
loading the plugin imports nothing but this module: a text-only run that looks up a
format pulls in no PIL, av or transformers. A new built-in format is one
`register_format` line here, with the suffixes its files have if the suffix rule
should pick it. The model families are `zephon_vl.families.registry`'s own table; a
third-party plugin adds one with `register_family`.
"""

from __future__ import annotations

from zephon_core import register_kind, register_recipe
from zephon_core.extend import register_format

FORMATS: dict[str, str] = {
    "webdataset": "zephon_vl.formats.webdataset:WebDatasetFormat",
    "llava": "zephon_vl.formats.llava:LlavaFormat",
    "parquet": "zephon_vl.formats.hf_parquet:HFParquetFormat",
    "messages": "zephon_vl.formats.messages:MessagesFormat",
    "obelics": "zephon_vl.formats.obelics:ObelicsFormat",
    "mds": "zephon_vl.formats.mds:MDSFormat",
    "litdata": "zephon_vl.formats.litdata:LitDataFormat",
    "arrow": "zephon_vl.formats.tables:ArrowFormat",
    "lance": "zephon_vl.formats.tables:LanceFormat",
}
#: suffixes the suffix rule reads as a format: all files ``.tar`` (or one ``.json``
#: manifest from ``zephon-vl index``) are WebDataset shards
SUFFIXES: dict[str, tuple[str, ...]] = {"webdataset": (".tar",)}
MANIFESTS: dict[str, tuple[str, ...]] = {"webdataset": (".json",)}
RECIPES: dict[str, str] = {
    "vlm-demo": "zephon_vl.demo.recipes:vlm_demo",
    "vlm-mix-demo": "zephon_vl.demo.recipes:vlm_mix_demo",
    "vlm-mix-demo-balanced": "zephon_vl.demo.recipes:vlm_mix_demo_balanced",
}
KINDS: dict[str, str] = {"vlm": "zephon_vl.recipes:vlm_recipe"}


def register() -> None:
    """Register zephon_vl's formats, recipes and kinds with the core (by reference)."""
    for name, ref in FORMATS.items():
        register_format(name, ref, suffixes=SUFFIXES.get(name, ()),
                        manifests=MANIFESTS.get(name, ()))
    for name, ref in RECIPES.items():
        register_recipe(name, ref)
    for kind, ref in KINDS.items():
        register_kind(kind, ref)
