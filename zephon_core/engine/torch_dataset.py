"""A `Loader` as a torch `IterableDataset`, for frameworks that insist on a DataLoader.

Hugging Face Trainer and Accelerate, Lightning and hand-written loops built on
torchdata's `StatefulDataLoader` want a `torch.utils.data` dataset and call its
``state_dict()``/``load_state_dict()`` from their own checkpointing. The
dataset here hands the framework the loader's local batches unchanged and
puts zephon's checkpoint state (JSON text, global when torch.distributed is
up) where the framework keeps a dataset's state. docs/frameworks.md shows the
frameworks' side.

Two DataLoader settings would break the batches, so they are refused rather
than tolerated: ``num_workers > 0`` (each worker would hold a copy of the whole
loader and deliver this rank's batches again; zephon runs its operators in its
own processes, sized by `Execution`) and a ``batch_size`` (each item already is
a collated local batch; a DataLoader batch would stack several of them).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import torch.utils.data

from zephon_core.engine.state_check import parse_state
from zephon_core.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from zephon_core.engine.loader import Loader

#: the key of zephon's state in `LoaderDataset.state_dict()` (the same key as TorchTitan's)
STATE_KEY = "zephon_state"

NO_WORKERS = (
    "zephon's LoaderDataset cannot run in a DataLoader worker process (num_workers > 0): "
    "each worker would hold a copy of the whole loader (its lanes and its own worker "
    "processes) and deliver this rank's batches again. zephon already runs its operators "
    "in its own processes; size them with Execution(workers=..., runner=...). Build the "
    "DataLoader with num_workers=0 and batch_size=None.")

NO_BATCH_SIZE = (
    "zephon's LoaderDataset needs a DataLoader with batch_size=None: each item it yields is "
    "already a collated local batch (this rank's rows of the global batch), and a "
    "DataLoader batch_size would stack several of them under a new leading dimension. Set "
    "the batch size in the recipe (global_batch_size) and build the DataLoader with "
    "batch_size=None and num_workers=0.")


def _refuse_worker() -> None:
    if torch.utils.data.get_worker_info() is not None:
        raise ConfigError(NO_WORKERS)


class LoaderDataset(torch.utils.data.IterableDataset):
    """This rank's local batches, in order, as an `IterableDataset` with checkpoint state.

    Build it with `Loader.as_torch_dataset()` and iterate it with
    ``torchdata.stateful_dataloader.StatefulDataLoader(ds, batch_size=None,
    num_workers=0)`` (or a plain `torch.utils.data.DataLoader` with the same
    arguments; a ``collate_fn`` there sees one batch at a time, e.g. to rename
    keys for a model's forward). With ``microbatches=k`` on the loader each
    step is yielded as its `k` micro-batches, one item each.

    The dataset is a view of the loader's one stream: a new ``iter()`` (a new
    epoch of the framework's DataLoader) continues where the last one stopped;
    only `load_state_dict` moves it. ``state_dict()`` is taken at a step
    boundary (between the last micro-batch of one step and the first of the
    next); with torch.distributed initialized it gathers every rank's lanes
    (a collective: every rank calls it, as the frameworks' save calls do), so
    every rank returns the same state and it restores on any rank count that
    divides the lane count.
    """

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self._pending: list[Any] = []

    def __iter__(self) -> Iterator[Any]:
        _refuse_worker()
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        _refuse_auto_collation(self, inspect.currentframe())
        while True:
            if not self._pending:
                try:
                    got = next(self.loader)
                except StopIteration:
                    return
                self._pending = list(got) if self.loader.microbatches > 1 else [got]
            yield self._pending.pop(0)

    def state_dict(self) -> dict[str, str]:
        """``{"zephon_state": <JSON text>}``: the loader's state after the last step
        consumed (one JSON string, so any checkpoint format keeps it byte for byte)."""
        _refuse_worker()
        if self._pending:
            raise CheckpointError(
                f"zephon LoaderDataset: state requested with {len(self._pending)} of "
                f"{self.loader.microbatches} micro-batches of step {self.loader.step - 1} not "
                "consumed; a zephon state is taken at a step boundary. Make the framework's "
                "gradient-accumulation steps equal the loader's microbatches "
                f"({self.loader.microbatches}) and save after an optimizer step")
        return {STATE_KEY: json.dumps(self.loader.state_dict(), sort_keys=True)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue after the step `state_dict` was taken at, on this loader's rank count.

        Takes what `state_dict()` returned (the JSON text, or the parsed state under
        the same key); any other dict is refused rather than restarting silently.
        """
        _refuse_worker()
        raw = state_dict.get(STATE_KEY) if isinstance(state_dict, Mapping) else None
        if raw is None:
            keys = sorted(state_dict) if isinstance(state_dict, Mapping) else type(state_dict)
            raise CheckpointError(
                f"zephon LoaderDataset: the dataset state has no {STATE_KEY!r} (found "
                f"{keys}); pass what LoaderDataset.state_dict() returned")
        state = (parse_state(raw, f"zephon LoaderDataset: {STATE_KEY!r}")
                 if isinstance(raw, str | bytes | bytearray) else raw)
        self.loader.load_state_dict(state)
        self._pending = []

    def __getstate__(self) -> NoReturn:
        # DataLoader workers started by spawn or forkserver receive the dataset pickled.
        raise ConfigError(NO_WORKERS + " (The dataset is bound to its live loader, so it "
                          "cannot be pickled or copied either.)")


def _refuse_auto_collation(dataset: LoaderDataset, frame: Any) -> None:
    """Refuse a DataLoader that batches the dataset's items (``batch_size`` not None).

    torch's DataLoader gives the dataset no sign of its arguments; the only place the
    batch size shows is the fetcher that calls ``next()`` on this iterator (its
    ``auto_collation`` is True when it batches). Best effort: a caller that is not such
    a fetcher (a plain ``for`` loop) is left alone.
    """
    caller = frame.f_back if frame is not None else None
    try:
        fetcher = caller.f_locals.get("self") if caller is not None else None
        if getattr(fetcher, "dataset", None) is dataset \
                and getattr(fetcher, "auto_collation", False) is True:
            raise ConfigError(NO_BATCH_SIZE)
    finally:
        del frame, caller
