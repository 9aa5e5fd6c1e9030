"""What a model family decides about the data, as one object per family.

A *model family* is the set of conventions a model's checkpoint fixes and
the data must follow: which special tokens frame an image, how many
placeholder tokens an image of a given patch grid takes, how a conversation
turn is framed, which image settings its vision encoder was trained with,
which token ids ride along with a batch, and the keyword arguments of its
TorchTitan ``forward``. The pipeline's operators stay generic and ask the
recipe's family; adding a family is one module with a subclass and one
:func:`~zephon_vl.families.registry.register_family` call.

A vision family owns its encoder's geometry as :attr:`VisionFamily.preset`:
the ``ImageSettings`` fields its vision encoder fixes (patch size, temporal
patch size, merge size, patch order, resize rule and its limits, mean/std).
:meth:`VisionFamily.image_settings` builds the settings from it, the
recipe check refuses a recipe whose encoder geometry differs, and
:meth:`VisionFamily.item_tokens` says how many placeholders an item's grid
takes (``t*h*w / merge**2`` unless the encoder pools time, as Kimi's does).

Two levels: :class:`ModelFamily` is all TorchTitan needs (a name, a recipe
check, the batch conversion), so the text-only family fits it;
:class:`VisionFamily` adds the tokens and layout a VLM recipe is built from.
A family object travels to process-pool workers inside the operators, so it
must be picklable (a module-level class with plain attributes is). Importing
a family does not import PIL: text-only TorchTitan jobs resolve ``text`` here.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from zephon_core import ChatFraming, ConfigError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from zephon_core import Recipe
    from zephon_vl.media.image import ImageSettings, VisionPatches


class SpecialTokens(Protocol):
    """A family's resolved special token ids: a frozen dataclass with at least these two."""

    eos: int
    pad: int


@dataclass(frozen=True)
class TitanOptions:
    """How a family's TorchTitan conversion lays out a batch (never the data itself)."""

    video_mode: str = "merge"
    mrope: bool = True


class ModelFamily(ABC):
    """A model family as TorchTitan's ``model_format`` names it.

    ``name`` is the registry key, hence the ``model_format`` value that
    selects it in ``ZephonDataLoader.Config``.
    """

    name: str = ""
    #: True when the family's models take images and videos.
    vision: bool = False

    @abstractmethod
    def check_recipe(self, recipe: Recipe) -> None:
        """Raise ConfigError when this family's models cannot train on `recipe`'s batches."""

    @abstractmethod
    def titan_inputs(self, batch: dict[str, Any], collate: Any,
                     options: TitanOptions) -> dict[str, Any]:
        """A collated micro-batch -> ``input`` plus the model's ``forward`` keyword arguments.

        `collate` is the recipe's collate (it knows the special tokens and
        image settings the batch was made with); ``labels`` are not touched.
        """

    def check_model_inputs(self, inputs: dict[str, Any], vocab_size: int | None = None) -> None:
        """Raise ValueError when the model's ``forward`` would refuse `inputs` (or misuse them).

        `inputs` is what :meth:`titan_inputs` returned. The checks are the
        model's own forward-side ones, run without the model; `vocab_size`
        (the model's embedding size) adds a range check of the token ids.
        """
        check_token_range(inputs["input"], vocab_size)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def collate_family(recipe: Recipe) -> ModelFamily | None:
    """The family `recipe`'s collate names (a collate of a family's layout has a ``family``
    attribute), None for a collate of no family (text). `registry.recipe_family` reads
    None as ``text``; the families' `check_recipe` read it here, below the registry."""
    family = getattr(recipe.collate, "family", None)
    return family if isinstance(family, ModelFamily) else None


def check_token_range(tokens: Any, vocab_size: int | None) -> None:
    """Every id of `tokens` is a row of an embedding table of `vocab_size` rows."""
    if vocab_size is None or not tokens.numel():
        return
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"token ids span [{low}, {high}] but the model's vocabulary has "
                         f"{vocab_size} ids; enlarge the model's vocab_size or use the "
                         "tokenizer it was built for")


#: The `VisionFamily.preset` fields a vision encoder's weights fix: a recipe that differs
#: in one of them cannot train that encoder (the others, e.g. mean/std, only warn).
ENCODER_FIELDS = ("patch_size", "temporal_patch_size", "merge_size", "patch_order")


class VisionFamily(ModelFamily):
    """A vision-language family: the tokens and layout its VLM recipes are built from."""

    vision = True
    #: Names the placeholder layout (checkpoint settings): change it when
    #: `placeholder` lays items out differently, so old checkpoints are refused.
    layout: str = ""
    #: Every row must carry an image (guarantee 10): the default of a recipe's
    #: ``image_every_row``. True where the models train with FSDP/ZeRO-3 and a
    #: rank without an image would skip the vision encoder's collectives.
    image_every_row: bool = False
    #: The ``ImageSettings`` fields of the family's vision encoder (its preset), e.g.
    #: ``{"patch_size": 16, "patch_order": "raster", "resize": "patches", ...}``; fields
    #: not named keep ``ImageSettings``' defaults. ``max_pixels`` is the caller's.
    preset: dict[str, Any] = {}
    #: How this family's recipes frame documents unless the recipe's ``chat`` says
    #: otherwise (`zephon_core.ChatFraming`): no default system prompt, assistant turns
    #: and their closing tokens trained, a trained end-of-text after every document.
    chat_framing: ChatFraming = ChatFraming()
    #: The framing under which the family's tokens equal its chat template's
    #: (``apply_chat_template``) token for token: ``chat = "template"`` in a recipe.
    template_framing: ChatFraming = ChatFraming(end_of_text=False)

    def framing(self, chat: ChatFraming | Any = None) -> ChatFraming:
        """A recipe's ``chat`` setting as a framing: None is `chat_framing`, ``"template"``
        `template_framing`, a table (``[chat]``) sets fields over `chat_framing`."""
        from zephon_core.extend import chat_framing

        if isinstance(chat, str):
            if chat == "template":
                return self.template_framing
            if chat == "default":
                return self.chat_framing
            raise ConfigError(f"chat = {chat!r}: a string names a framing, \"template\" (the "
                              f"{self.name} chat template's) or \"default\"; or give a [chat] "
                              "table of ChatFraming fields")
        return chat_framing(chat, self.chat_framing)

    def tokenizer_dir(self) -> Any:
        """A local tokenizer folder with the family's special tokens (built-in recipes
        use it): the bundled Qwen vocabulary unless the family says otherwise."""
        from zephon_core import qwen_tokenizer_dir

        return qwen_tokenizer_dir()

    def item_tokens(self, grid_thw: Any, merge_size: int) -> int:
        """Placeholder tokens of one image or video of patch grid ``(t, h, w)``: one per
        ``merge_size x merge_size`` block of every temporal patch."""
        t, h, w = (int(x) for x in grid_thw)
        return t * h * w // (merge_size * merge_size)

    @abstractmethod
    def special_tokens(self, tokenizer: Any) -> SpecialTokens:
        """The family's special token ids in `tokenizer`; ConfigError when it lacks them."""

    @abstractmethod
    def placeholder(self, special: Any, patches: VisionPatches, merge_size: int,
                    video: bool) -> np.ndarray:
        """The token ids that stand for one image (or video) in the text, int64 1-D.

        The collate puts the patches in the same order as these runs, so a
        model finds each item's embeddings where its placeholders are.
        """

    @abstractmethod
    def chat_turn(self, special: Any, role: str,
                  encode: Callable[[str], list[int]]) -> tuple[list[int], list[int]]:
        """Token ids that open and close one conversation turn of `role`.

        What else a chat template decides (a default system prompt, an
        end-of-text) is the recipe's `ChatFraming`. `encode` tokenizes text the
        way the operator tokenizes the turn's content (``add_special_tokens=False``);
        an empty string gives ``[]``.
        """

    @abstractmethod
    def batch_token_ids(self, special: Any) -> dict[str, int]:
        """Token ids every batch carries as 0-d int64 tensors, by tensor name."""

    @abstractmethod
    def vision_token_ids(self, special: Any) -> tuple[int, ...]:
        """The ids that stand for one merged patch each (e.g. ``<|image_pad|>``).

        The collate counts them in every document against its items' patch
        grids and refuses a batch where they disagree, naming the sample.
        """

    def image_settings(self, max_pixels: int, min_pixels: int | None = None,
                       max_patches: int | None = None) -> ImageSettings:
        """The image settings the family's vision encoder was trained with (its `preset`),
        at most `max_pixels` pixels an image (the "pixels" rule) or `max_patches` patches
        (the "patches" rule); None: the preset's `min_pixels` / `max_patches`."""
        from zephon_vl.media.image import ImageSettings

        fields = {**self.preset, "max_pixels": max_pixels}
        if min_pixels is not None:
            fields["min_pixels"] = min_pixels
        if max_patches is not None:
            fields["max_patches"] = max_patches
        return ImageSettings(**fields)

    def check_recipe(self, recipe: Recipe) -> None:
        """Refuse a text-only recipe, or one built for another family."""
        got = collate_family(recipe)
        if got is None or not got.vision:
            raise ConfigError(f"model family {self.name!r} needs a VLM recipe; "
                              f"{recipe.name!r} is text-only (use model_format='text')")
        if got.name != self.name:
            raise ConfigError(f"recipe {recipe.name!r} is built for model family {got.name!r}, "
                              f"not {self.name!r}; build it with family={self.name!r} (in a "
                              f"recipe file: family = \"{self.name}\")")
        self.check_geometry(recipe.collate.image)

    def check_geometry(self, image: ImageSettings) -> None:
        """Refuse image settings whose encoder geometry (`ENCODER_FIELDS`) is not the preset's;
        warn when the normalization differs."""
        want = {k: v for k, v in self.preset.items() if k in ENCODER_FIELDS}
        got = {k: getattr(image, k) for k in want}
        if got != want:
            raise ConfigError(
                f"the {self.name} vision encoder needs image settings {want}, the recipe has "
                f"{got}. Build it with get_family({self.name!r}).image_settings(max_pixels) "
                f"(--dataloader.image_preset {self.name} for a built-in recipe), or fix the "
                "[image] table of the recipe file")
        for key in ("image_mean", "image_std", "resize"):
            if key in self.preset and tuple(np.atleast_1d(getattr(image, key))) != \
                    tuple(np.atleast_1d(self.preset[key])):
                log.warning("%s models are trained with %s %s; the recipe has %s", self.name,
                            key, self.preset[key], getattr(image, key))
