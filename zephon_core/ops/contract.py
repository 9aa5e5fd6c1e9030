"""The operator contract.

An operator is a **transform** (stateless: `process_many` is a pure function
of its input elements, so any number of workers may run it on any grouping),
an **accumulator** (stateful, one instance per lane, sees the lane's elements
in order, may reorder or hold them but keeps each one whole), or the
**combiner** that ends every pipeline (stateful, one per lane, combines
elements into rows: `Pack`, or any other `CombinerOp`). Stateful operators
keep only *origins* in their checkpointed state; payloads are recomputed from
origins on restore, so restore cost is bounded by what was buffered.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from zephon_core.common.digest import sample_digest
from zephon_core.data.storage_settings import StorageSettings, storage_settings
from zephon_core.errors import BadSampleError, ConfigError
from zephon_core.records import Dropped, Element, Origin

ON_ERROR = ("raise", "drop")
Recompute = Callable[[list[Origin]], list[Any]]


class Operator(ABC):
    """Common part: a unique name in the pipeline and fingerprinted settings."""

    name: str

    def settings(self) -> dict:
        """Settings that change the data; stored in checkpoint fingerprints."""
        return {}


class Transform(Operator):
    """Stateless per-element work, run by a runner (inline, threads or processes).

    `on_error` decides what a bad sample does: ``raise`` stops the pipeline
    with the sample's location; ``drop`` records the element as dropped with
    the error's reason (``bad_content`` for one of `CONTENT_ERRORS`). Other
    exceptions (I/O, memory, configuration) stop the run.
    """

    on_error: str = "raise"
    default_runner: str | None = None

    def setup(self) -> None:
        """Called once in each process before the first `process_many` (load models here)."""

    def release(self) -> None:
        """Drop what this operator can load again where it runs (a tokenizer, a model).

        Optional. Called in the driver when the operator's stage runs remotely (worker
        processes or Ray tasks, each of which loads its own): the driver loaded it only
        to build the recipe or to recompute payloads on restore. `setup` must load it
        again. The default holds nothing to drop.
        """

    @abstractmethod
    def process_many(self, elements: list[Element]) -> list[Any]:
        """One output (or `Dropped`) per input element, in order."""


class LaneState(ABC):
    """What every per-lane stateful object gives a checkpoint: its held elements, by origin."""

    @abstractmethod
    def state(self) -> dict:
        """JSON state; elements appear as origins (lists of ints) only."""

    @abstractmethod
    def held_origins(self) -> list[Origin]:
        """Origins of the elements it holds (each once)."""

    @abstractmethod
    def restore(self, state: dict, recompute: Recompute) -> None:
        """Rebuild from `state`; `recompute(origins)` gives the payloads of held elements."""


class Accumulator(LaneState):
    """Per-lane state of an element-preserving stateful operator (it reorders or holds)."""

    @abstractmethod
    def push(self, item: tuple[Origin, Any]) -> list[tuple[Origin, Any]]: ...

    @abstractmethod
    def flush(self) -> list[tuple[Origin, Any]]: ...


class StateChecks(Protocol):
    """What a checkpoint check offers an operator that validates its own per-lane state."""

    def origin(self, field: str, value: Any) -> None:
        """Refuse `value` unless it is an origin of this lane that points inside the data."""

    def fail(self, field: str, problem: str) -> Exception:
        """The error to raise for a bad `field` (it names the lane and the field)."""


class StatefulOp(Operator):
    """An operator with per-lane state in checkpoints (accumulators and the combiner)."""

    def check_state(self, state: Any, checks: StateChecks) -> None:
        """Refuse a damaged per-lane state before `restore` sees it (raise `checks.fail`).

        The default checks only that it is a mapping; the built-in operators
        check every field. The whole state is also covered by a checksum.
        """
        if not isinstance(state, dict):
            raise checks.fail("state", "is not a mapping")


class AccumulatorOp(StatefulOp):
    """An operator whose work is an `Accumulator` per lane."""

    def origins_in_state(self, state: dict) -> list[list[int]] | None:
        """The origins a (checked) per-lane state holds, for a lane-count change on resume
        (`engine.relane` deals them to the new lanes); None: not supported."""
        return None

    @abstractmethod
    def make(self, lane: int, seed: int) -> Accumulator: ...


@dataclass
class Segment:
    """Tokens ``[start, end)`` of one element (its `payload["tokens"]`) placed in a row."""

    origin: Origin
    payload: Any
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass
class Row:
    """One training sequence before collation; `drops` are decisions recorded with it.

    A combiner fills `segments`; the lane sets `drops` (the drops decided
    since the lane's previous row) when it takes the row.
    """

    segments: list[Segment]
    drops: list[tuple[Origin, str]] = field(default_factory=list)
    #: each drop's detail (``""`` where it has none), set by the lane with `drops`
    drop_details: list[str] = field(default_factory=list)
    #: with the ledger on: one sample digest per segment (set by the lane, like `drops`)
    digests: list[dict[str, str]] | None = None

    @property
    def num_tokens(self) -> int:
        return sum(s.length for s in self.segments)


class Combiner(LaneState):
    """Per-lane state of the pipeline's last operator: elements in, rows out.

    The lane calls `push` once per element that reaches it, in the lane's
    element order, and takes every ready row with `pop_row` after each push;
    when the lane's data ends it calls `flush` and takes the rest. Rows must
    depend only on the elements pushed and their order (never on timing), and
    every element must end up in row segments or be refused: exactly once
    (guarantee 5) is the combiner's half of the contract.

    The lane takes a snapshot between pushes: `state` must then describe the
    held elements (open rows and rows not yet popped) by origin only, so that
    `restore` rebuilds them with payloads recomputed by `recompute(origins)`.
    """

    @abstractmethod
    def push(self, origin: Origin, payload: Any) -> Dropped | None:
        """Absorb one element; a `Dropped` refuses it (the lane records the reason)."""

    @abstractmethod
    def pop_row(self) -> Row | None:
        """The oldest finished row, or None when no row is ready."""

    @abstractmethod
    def flush(self) -> None:
        """End of the lane's data: turn every partly filled row into a ready row."""


class CombinerOp(StatefulOp):
    """The operator that ends every pipeline: a `Combiner` per lane makes its rows.

    A subclass sets `seq_len` (tokens per row: the recipe's `S`, the width of
    the batch tensors) and `pad_id` (the token that fills a row's unused
    positions in the default collate). Both belong in `settings()`; a recipe
    refuses a combiner whose `seq_len` is left unset (None).
    """

    seq_len: int | None = None
    pad_id: int = 0
    #: why this combiner cannot be re-dealt over another lane count (and what to use instead),
    #: for the refusal's message when it does not implement `rows_in_state`
    lane_change_refusal: str = ""
    #: what to change when the lane drops every sample as longer than a row (``{seq_len}``
    #: is filled in): the combiner knows its settings and where users set them, the engine
    #: does not
    over_length_hint: str = ("seq_len {seq_len} is smaller than these samples: raise the "
                             "context length")
    #: the settings to check when the lane draws on and on without a row, e.g.
    #: ``"for Pack: seq_len, limits, overlong"``
    settings_hint: str = ""

    @abstractmethod
    def make(self, lane: int, seed: int) -> Combiner: ...

    def rows_in_state(self, state: dict) -> list[list[list[int]]] | None:
        """For a lane-count change on resume: the rows a (checked) per-lane state holds,
        each a list of segments ``[origin..., start, end]``, in delivery order, rows still
        open closed as they are; None: this combiner does not support the change."""
        return None

    def state_of_rows(self, rows: list[list[list[int]]]) -> dict:
        """A per-lane state that holds `rows` (from `rows_in_state`) ready to pop."""
        raise NotImplementedError(f"{type(self).__name__} does not support a lane-count change")


class Map(Transform):
    """Apply a user function to each payload. The function must be pure and picklable."""

    def __init__(self, fn: Callable[[Any], Any], name: str | None = None, on_error: str = "raise",
                 settings: dict | None = None) -> None:
        self.fn = fn
        self.name = name or f"map:{getattr(fn, '__name__', 'fn')}"
        self.on_error = check_on_error(on_error)
        self._settings = settings or {}

    def settings(self) -> dict:
        return {"fn": _qualname(self.fn), **self._settings}

    def process_many(self, elements: list[Element]) -> list[Any]:
        return [self.fn(e.payload) for e in elements]


class Filter(Transform):
    """Keep payloads for which `predicate` is true; the others are recorded as dropped."""

    def __init__(self, predicate: Callable[[Any], bool], name: str | None = None,
                 reason: str = "filtered") -> None:
        self.predicate = predicate
        self.name = name or f"filter:{getattr(predicate, '__name__', 'fn')}"
        self.reason = reason

    def settings(self) -> dict:
        return {"predicate": _qualname(self.predicate), "reason": self.reason}

    def process_many(self, elements: list[Element]) -> list[Any]:
        return [e.payload if self.predicate(e.payload) else Dropped(self.reason)
                for e in elements]


def _qualname(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def check_on_error(value: str) -> str:
    """`value` when it is an allowed ``on_error`` policy of an operator; a ConfigError
    naming the allowed ones otherwise, so a typo fails when the recipe is built, not when
    the first bad sample arrives."""
    if value not in ON_ERROR:
        raise ConfigError(f"on_error must be one of {ON_ERROR}, got {value!r}")
    return value


@dataclass
class StageFn:
    """Consecutive transforms fused into one call, as a worker runs them.

    A bad sample (a `BadSampleError`, or one of `CONTENT_ERRORS` raised on a
    sample's content) is isolated by re-running the group element by element,
    so the result does not depend on the grouping.
    """

    transforms: list[Transform]
    #: the stage that makes the combiner's payloads with the ledger on: each output goes back
    #: as `Digested`, hashed here in the worker so the driver only combines digests
    digests: bool = False
    #: `Execution.storage()`, installed around every call (so workers of any runner retry
    #: and coalesce as the Execution says; None: the calling thread's)
    storage: StorageSettings | None = None

    def setup(self) -> None:
        with storage_settings(self.storage):
            for t in self.transforms:
                t.setup()

    def __call__(self, elements: list[Element]) -> list[Any]:
        with storage_settings(self.storage):
            return self._run(elements)

    def timed(self, elements: list[Element],
              clock: Callable[[], float]) -> tuple[list[Any], tuple[float, ...]]:
        """The outputs, and the `clock` seconds each transform took (the digests counted in
        the last): what ``zephon-vl profile`` reports as each operator's CPU per sample.
        Runners pass a CPU clock (`time.thread_time`, `time.process_time`)."""
        times = [0.0] * len(self.transforms)
        with storage_settings(self.storage):
            return self._run(elements, clock, times), tuple(times)

    def _run(self, elements: list[Element], clock: Callable[[], float] | None = None,
             times: list[float] | None = None) -> list[Any]:
        outputs: list[Any] = [e.payload for e in elements]
        for k, t in enumerate(self.transforms):
            live = [i for i, o in enumerate(outputs) if not isinstance(o, Dropped)]
            if not live:
                break
            start = clock() if clock is not None else 0.0
            batch = [Element(elements[i].key, outputs[i], elements[i].origin) for i in live]
            for i, out in zip(live, _run_one(t, batch), strict=True):
                outputs[i] = out
            if times is not None and clock is not None:
                times[k] += clock() - start
        if self.digests:
            start = clock() if clock is not None else 0.0
            outputs = [o if isinstance(o, Dropped) else Digested(o, sample_digest(o))
                       for o in outputs]
            if times and clock is not None:
                times[-1] += clock() - start
        return outputs


class Digested(NamedTuple):
    """A stage output with its sample digest (`zephon_core.common.digest.sample_digest`)."""

    payload: Any
    digest: dict[str, str]


#: What a transform raises when a sample's own content is malformed (a caption that is a
#: number, JSON nested absurdly deep, a bad field type): a bad sample, not an engine fault.
#: I/O errors (OSError) and MemoryError are not here: they come from the environment, so
#: turning them into drops would make two runs differ.
CONTENT_ERRORS = (ArithmeticError, AssertionError, AttributeError, LookupError, RecursionError,
                  TypeError, ValueError)


def _run_one(t: Transform, batch: list[Element]) -> list[Any]:
    """Run `t` on a group; a bad sample is found by re-running the group one element at a time.

    So a drop or an error names the culprit, and whether a sample is dropped
    never depends on which other samples shared its group.
    """
    try:
        out = t.process_many(batch)
    except (BadSampleError, *CONTENT_ERRORS) as exc:
        if len(batch) > 1:
            return [o for e in batch for o in _run_one(t, [e])]
        bad = exc if isinstance(exc, BadSampleError) else _content_error(exc, batch[0])
        if t.on_error == "drop":
            return [Dropped(bad.reason, bad.detail or bad.where)]
        raise _located(bad, batch[0], t) from (None if bad is exc else exc)
    if len(out) != len(batch):
        raise RuntimeError(f"operator {t.name} returned {len(out)} outputs for {len(batch)} inputs")
    return out


def _content_error(exc: BaseException, element: Element) -> BadSampleError:
    text = f"{type(exc).__name__}: {exc}"
    where = element.origin.where() if element.origin is not None else "?"
    return BadSampleError("bad_content", where, text if len(text) <= 200 else text[:197] + "...")


def _located(exc: BadSampleError, element: Element, t: Transform) -> BadSampleError:
    where = exc.where
    if element.origin is not None and element.origin.where() not in where:
        where = f"{where} [{element.origin.where()}]"
    return BadSampleError(
        exc.reason, where,
        (exc.detail + "; " if exc.detail else "")
        + f"raised in operator {t.name!r}; set on_error='drop' to record and skip such samples",
    )
