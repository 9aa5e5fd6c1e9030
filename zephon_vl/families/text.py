"""The text-only family: token ids and per-document positions, nothing else."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zephon_core import ConfigError
from zephon_vl.families.base import ModelFamily, TitanOptions, collate_family

if TYPE_CHECKING:
    from zephon_core import Recipe


class TextFamily(ModelFamily):
    """Any decoder-only language model, on the tokens of any recipe."""

    name = "text"

    def check_recipe(self, recipe: Recipe) -> None:
        """Text recipes only: a VLM recipe's rows hold images a text model would never see."""
        got = collate_family(recipe)
        if got is not None and got.vision:
            raise ConfigError(
                f"recipe {recipe.name!r} is a VLM recipe (model family {got.name!r}): "
                "model_format='text' would leave its images out of every batch and keep "
                f"their placeholder tokens; use model_format={got.name!r}, or a text recipe")

    def titan_inputs(self, batch: dict[str, Any], collate: Any,
                     options: TitanOptions) -> dict[str, Any]:
        return {"input": batch["input"], "positions": batch["positions"]}
