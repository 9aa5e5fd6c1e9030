"""The built-in demo recipes `vlm-demo`, `vlm-mix-demo` and `vlm-mix-demo-balanced`:
`vlm_recipe` over the demo data set (`zephon_vl.demo.data`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from zephon_core import BalanceSettings, Recipe
from zephon_core.extend import forwards_to, moved_keywords, settings_from_table
from zephon_vl.families.registry import vision_family
from zephon_vl.media.image import ImageSettings
from zephon_vl.recipes import PACK_KEYWORDS, VisionPackSettings, vlm_recipe

#: the demos' packing: at most 8 images a row
DEMO_PACK = VisionPackSettings(max_images=8)


def _demo_tokenizer(overrides: dict[str, Any]) -> Any:
    """The demos' tokenizer: ``tokenizer`` if given, else the recipe family's own (the
    bundled Qwen one for ``qwen3_5``, Kimi's tokens added to it for ``kimi_k2_5``)."""
    given = overrides.pop("tokenizer", None)
    return given or vision_family(overrides.get("family", "qwen3_5")).tokenizer_dir()


def _demo_pack(overrides: dict[str, Any], base: VisionPackSettings = DEMO_PACK
               ) -> VisionPackSettings:
    """The demos' packing with the fields ``pack`` (in `overrides`) gives over `base`'s; a
    `VisionPackSettings` given whole replaces it."""
    return settings_from_table(VisionPackSettings, overrides.pop("pack", None) or {}, "pack",
                               base=base)


@moved_keywords("vlm_demo", "0.4.0", PACK_KEYWORDS)
@forwards_to(vlm_recipe)
def vlm_demo(num_lanes: int = 8, global_batch_size: int = 16, seq_len: int = 2048,
             seed: int = 0, num_samples: int = 2000, **overrides: Any) -> Recipe:
    """Real photos from skimage with real-text captions, the Qwen3.6 vocabulary, 8 lanes."""
    from zephon_vl.demo.data import build_demo_dataset

    demo = build_demo_dataset(num_samples=num_samples)
    image = overrides.pop("image", ImageSettings(max_pixels=256 * 28 * 28))
    return vlm_recipe([str(s) for s in demo.shards], _demo_tokenizer(overrides),
                      seq_len=seq_len,
                      global_batch_size=global_batch_size, num_lanes=num_lanes, seed=seed,
                      image=image, pack=_demo_pack(overrides), name="vlm-demo", **overrides)


#: `vlm-mix-demo`'s balance: its mean vision tokens per row (`zephon-vl balance`), heavy
#: steps for its 2- and 3-image documents (up to 3 x 256 vision tokens)
MIX_DEMO_BALANCE = BalanceSettings(budget=193.6, heavy_every=4, heavy_budget=800.0, tolerance=0.02)


@moved_keywords("vlm_mix_demo", "0.4.0", PACK_KEYWORDS)
@forwards_to(vlm_recipe)
def vlm_mix_demo(num_lanes: int = 8, global_batch_size: int = 16, seq_len: int = 1024,
                 seed: int = 0, num_samples: int = 2000, **overrides: Any) -> Recipe:
    """The demo photos mixed with the bundled text corpus (stdlib docstrings) 1:8.

    About half of the rows hold no image of their own, so the row filler
    (guarantee 10) and the balanced packing mode have work to do.
    """
    from zephon_core import text_corpus
    from zephon_vl.demo.data import build_demo_dataset

    demo = build_demo_dataset(num_samples=num_samples)
    image = overrides.pop("image", ImageSettings(max_pixels=256 * 28 * 28))
    overrides.setdefault("weights", {"photos": 1.0, "text": 8.0})
    pack = _demo_pack(overrides)
    if pack.pack_mode == "balanced":
        overrides.setdefault("balance", MIX_DEMO_BALANCE)
    return vlm_recipe({"photos": [str(s) for s in demo.shards],
                       "text": [str(p) for p in text_corpus()]},
                      _demo_tokenizer(overrides), seq_len=seq_len,
                      global_batch_size=global_batch_size, num_lanes=num_lanes, seed=seed,
                      image=image, pack=pack, **{"name": "vlm-mix-demo", **overrides})


@forwards_to(vlm_mix_demo)
def vlm_mix_demo_balanced(**overrides: Any) -> Recipe:
    """`vlm-mix-demo` with compute-balanced rows (``pack_mode="balanced"``)."""
    overrides["pack"] = _demo_pack(overrides, dataclasses.replace(DEMO_PACK,
                                                                  pack_mode="balanced"))
    return vlm_mix_demo(**{"name": "vlm-mix-demo-balanced", **overrides})
