"""Check zephon batches where TorchTitan consumes them: the model's own input checks.

A batch is right when the model that eats it accepts it. For a TorchTitan
config, :func:`check_titan_passes` builds ``ZephonDataLoader`` as the Trainer
does (same ``build`` arguments), cuts every global batch into the micro-batches
of each rank of each rank count ``D`` asked for (the rows of a rank are the
same at every D: guarantee 1), collates and converts each with the family's
TorchTitan conversion, and runs the family's ``check_model_inputs``: the
forward-side checks of the model (for ``qwen3_5`` TorchTitan's own
``get_vision_positions`` and ``scatter_vision_embeds``), a token-range check
against the model's vocabulary, and the label shape. No model is built, so a
whole pass takes seconds on a CPU. ``zephon-vl check-batches`` is the command.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
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

    def report(self) -> dict[str, Any]:
        """The report as JSON data (``check-batches --json``), never read back."""
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
    return check_titan_passes(config, [dp], steps, {dp: local_batch_size}, **dataloader)[0]


def check_titan_passes(config: Any, dps: list[int], steps: int | None = None,
                       local_batch_sizes: dict[int, int] | None = None,
                       on_step: Callable[[int], None] | None = None,
                       **dataloader: Any) -> list[BatchCheckReport]:
    """:func:`check_titan_batches` for every rank count of `dps`, from one pipeline run.

    Rank ``r`` of ``D`` trains on rows ``r*G/D .. (r+1)*G/D`` of each global
    batch (its lanes, in lane order), and those rows are the same at every D
    (guarantee 1, which the digest tests check at many D). So the pipeline runs
    once, on one rank, and every rank count's micro-batches are cut from its
    global batches, collated and converted by the same ``ZephonDataLoader``
    code the Trainer runs. A finite pass ends where a real run does: at the
    first step some lane cannot fill. `on_step(k)` is called after k steps.
    """
    from zephon_vl.titan.resolve import check_geometry

    loader_config = dataclasses.replace(config.dataloader, background=False, **dataloader)
    if steps is None:
        loader_config = dataclasses.replace(loader_config, infinite=False)
    family = get_family(loader_config.model_format)
    vocab = model_vocab_size(config)
    sizes = {dp: (local_batch_sizes or {}).get(dp) or config.training.local_batch_size
             for dp in dps}
    G = loader_config.global_batch_size
    loader = loader_config.build(dp_world_size=1, dp_rank=0, tokenizer=None,
                                 seq_len=config.training.seq_len, local_batch_size=G or
                                 config.training.local_batch_size,
                                 snapshot_every_n_steps=None)
    reports = [BatchCheckReport(loader_config.recipe, loader_config.model_format, dp)
               for dp in dps]
    try:
        G = loader.recipe.global_batch_size
        for dp in dps:
            check_geometry(loader.recipe.num_lanes, G, dp, sizes[dp])
        step = 0
        while steps is None or step < steps:
            rows = loader.loader.next_rows()
            if rows is None:
                break
            for report in reports:
                _check_step(loader, family, vocab, rows, step, sizes[report.dp], report)
            step += 1
            if on_step is not None:
                on_step(step)
    finally:
        loader.close()
    for report in reports:
        report.steps = step
        report.steps_per_rank = [step] * report.dp
    return reports


def rank_micro_batches(rows: list[Any], dp: int,
                       per_micro: int) -> list[tuple[int, int, list[Any]]]:
    """One global batch's rows as rank ``r`` of `dp` takes them: ``(r, micro, rows)``,
    rank-major, `per_micro` rows each (``training.local_batch_size``)."""
    per_rank = len(rows) // dp
    return [(rank, micro, rows[rank * per_rank + micro * per_micro:
                               rank * per_rank + (micro + 1) * per_micro])
            for rank in range(dp) for micro in range(per_rank // per_micro)]


def _check_step(loader: Any, family: Any, vocab: int | None, rows: list[Any], step: int,
                per_micro: int, report: BatchCheckReport) -> None:
    """Every micro-batch of every rank of ``report.dp`` in one global batch."""
    for rank, micro, picked in rank_micro_batches(rows, report.dp, per_micro):
        inputs, labels = loader.convert(loader.recipe.collate(picked))
        try:
            if tuple(labels.shape) != tuple(inputs["input"].shape):
                raise ValueError(f"labels {tuple(labels.shape)} != input "
                                 f"{tuple(inputs['input'].shape)}")
            family.check_model_inputs(inputs, vocab)
        except ValueError as exc:
            raise BatchRefused(f"{report.model_format} refuses rank {rank} of {report.dp}, "
                               f"step {step}, micro-batch {micro} ({_samples(picked)}): "
                               f"{exc}") from exc
        report.micro_batches += 1
        report.rows += int(labels.shape[0])
        items = sum(int(inputs[key].shape[0]) for key in ("grid_thw", "grid_thw_videos")
                    if inputs.get(key) is not None)
        report.vision_items += items
        report.micro_batches_without_vision += items == 0


def _samples(rows: list[Any]) -> str:
    names = [f"dataset {s.origin.dataset} shard {s.origin.shard} index {s.origin.index}"
             for row in rows for s in row.segments if s.origin.dataset >= 0]
    return "samples: " + ("; ".join(names) or "row filler only")
