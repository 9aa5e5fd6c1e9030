"""The text-only family: token ids and per-document positions, nothing else."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zephon_vl.families.base import ModelFamily, TitanOptions

if TYPE_CHECKING:
    from zephon_core import Recipe


class TextFamily(ModelFamily):
    """Any decoder-only language model, on the tokens of any recipe."""

    name = "text"

    def check_recipe(self, recipe: Recipe) -> None:
        """Every recipe qualifies: a VLM recipe's vision inputs are left out of the batch."""

    def titan_inputs(self, batch: dict[str, Any], collate: Any,
                     options: TitanOptions) -> dict[str, Any]:
        return {"input": batch["input"], "positions": batch["positions"]}
