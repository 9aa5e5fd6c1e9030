"""Check zephon batches where TorchTitan consumes them: the model's own input checks.

A batch is right when the model that eats it accepts it. For a TorchTitan
config, :func:`check_titan_batches` builds ``ZephonDataLoader`` on every rank
of ``D`` exactly as the Trainer does (same ``build`` arguments, one rank after
another in this process), converts every micro-batch with the family's
TorchTitan conversion, and runs the family's ``check_model_inputs``: the
forward-side checks of the model (for ``qwen3_5`` TorchTitan's own
``get_vision_positions`` and ``scatter_vision_embeds``), a token-range check
against the model's vocabulary, and the label shape. No model is built, so a
whole pass takes seconds on a CPU. ``zephon-vl check-batches`` is the command.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any

from zephon_core import ConfigError
from zephon_vl.families.registry import get_family


class BatchRefused(ValueError):
    """A micro-batch the model's forward would refuse; the message says where and why."""


@dataclass
class BatchCheckReport:
    """What :func:`check_titan_batches` walked through, for one rank count."""

    recipe: str
    model_format: str
    dp: int
    steps: int = 0
    micro_batches: int = 0
    rows: int = 0
    #: vision items as the model receives them (a video's frames count one each for qwen3_5)
    vision_items: int = 0
    micro_batches_without_vision: int = 0
    #: per rank, the steps it delivered (equal on every rank, or the pass was cut short)
    steps_per_rank: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_titan_config(name: str, module: str = "zephon_vl.titan") -> Any:
    """The TorchTitan config that ``--module MODULE --config NAME`` names.

    On a CPU-only torch without torchvision, TorchTitan's multimodal modules
    need the stand-in that ``zephon_vl.testing.titan_cpu`` installs.
    """
    import transformers  # noqa: F401  (before any torchvision stand-in)

    from zephon_vl.testing.titan_cpu import stub_torchvision

    stub_torchvision()
    registry = importlib.import_module(module if module != "zephon_vl.titan"
                                       else "zephon_vl.titan.config_registry")
    factory = getattr(registry, name, None)
    if factory is None or not callable(factory):
        known = [n for n in getattr(registry, "__all__", dir(registry)) if n.startswith("zephon")]
        raise ConfigError(f"{module} has no config {name!r}; known: {', '.join(known)}")
    return factory()


def model_vocab_size(config: Any) -> int | None:
    """The embedding size of a TorchTitan config's model, when it has one."""
    model = getattr(getattr(config, "model_spec", None), "model", None)
    size = getattr(model, "vocab_size", None)
    return int(size) if size else None


def check_titan_batches(config: Any, dp: int, steps: int | None = None,
                        local_batch_size: int = 0, **dataloader: Any) -> BatchCheckReport:
    """Walk `steps` steps (None: one full pass) of `config`'s dataloader on `dp` ranks.

    `local_batch_size` (0: the config's ``training.local_batch_size``) sets
    the rows per micro-batch; `dataloader` overrides fields of
    ``config.dataloader`` (``recipe``, ``runner``, ``video_mode``, ...).
    Raises :class:`BatchRefused` at the first micro-batch the model would
    refuse, naming rank, step, micro-batch and its samples.
    """
    loader_config = dataclasses.replace(config.dataloader, **dataloader)
    if steps is None:
        loader_config = dataclasses.replace(loader_config, infinite=False)
    family = get_family(loader_config.model_format)
    vocab = model_vocab_size(config)
    report = BatchCheckReport(loader_config.recipe, loader_config.model_format, dp)
    for rank in range(dp):
        loader = loader_config.build(dp_world_size=dp, dp_rank=rank, tokenizer=None,
                                     seq_len=config.training.seq_len,
                                     local_batch_size=local_batch_size
                                     or config.training.local_batch_size,
                                     snapshot_every_n_steps=None)
        try:
            done = _check_rank(loader, family, vocab, rank, steps, report)
        finally:
            loader.close()
        report.steps_per_rank.append(done)
    report.steps = min(report.steps_per_rank, default=0)
    return report


def _check_rank(loader: Any, family: Any, vocab: int | None, rank: int, steps: int | None,
                report: BatchCheckReport) -> int:
    per_step = loader.microbatches
    done = 0
    for k, (inputs, labels) in enumerate(loader):
        step, micro = divmod(k, per_step)
        if steps is not None and step >= steps:
            break
        try:
            if tuple(labels.shape) != tuple(inputs["input"].shape):
                raise ValueError(f"labels {tuple(labels.shape)} != input "
                                 f"{tuple(inputs['input'].shape)}")
            family.check_model_inputs(inputs, vocab)
        except ValueError as exc:
            raise BatchRefused(f"{report.model_format} refuses rank {rank} of {report.dp}, "
                               f"step {step}, micro-batch {micro} "
                               f"({_samples(loader, micro, labels.shape[0])}): {exc}") from exc
        report.micro_batches += 1
        report.rows += int(labels.shape[0])
        items = sum(int(inputs[key].shape[0]) for key in ("grid_thw", "grid_thw_videos")
                    if inputs.get(key) is not None)
        report.vision_items += items
        report.micro_batches_without_vision += items == 0
        done = step + 1
    return done


def _samples(loader: Any, micro: int, rows: int) -> str:
    meta = loader.loader.last_meta
    if meta is None:
        return "no step metadata"
    picked = meta.rows[micro * rows:(micro + 1) * rows]
    names = [f"dataset {o.dataset} shard {o.shard} index {o.index}"
             for row in picked for o, _, _ in row if o.dataset >= 0]
    return "samples: " + ("; ".join(names) or "row filler only")
