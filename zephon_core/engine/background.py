"""The loader's background threads: a driver runs the lanes ahead of the consumer and a
collate thread (``Execution.collate_in="thread"``) turns steps into batches.

Both hand their items through bounded queues in step order, so running ahead
never changes a batch; `stop_background` returns what they made beyond the
consumer's step (for `Loader.drain`).
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from zephon_core.engine.execution import Execution
from zephon_core.engine.steps import Step


class BackgroundSteps:
    """Mixin of `Loader`: the driver and collate threads over its `_advance` and
    `_collate_step`."""

    execution: Execution
    _failed: BaseException | None
    _thread: threading.Thread | None
    _unsent: dict[str, Any]

    def _advance(self) -> Step | None:
        raise NotImplementedError

    def _collate_step(self, step: Step) -> Any:
        raise NotImplementedError

    def _start_background(self) -> None:
        depth = max(1, self.execution.prefetch_steps)
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._unsent = {}
        self._steps: queue.Queue | None = None
        if self.execution.collate_in == "thread":
            self._steps = queue.Queue(maxsize=1)
            self._collator = threading.Thread(target=self._collate_steps,
                                              name="zephon-collate", daemon=True)
            self._collator.start()
        self._thread = threading.Thread(target=self._produce, name="zephon-driver", daemon=True)
        self._thread.start()

    def _put(self, q: queue.Queue, item: Any, who: str) -> bool:
        """Queue `item` unless the loader stops first (then it is kept for `drain`)."""
        while True:
            if self._stop.is_set():
                self._unsent[who] = item
                return False
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue

    def _produce(self) -> None:
        """Background driver: run the lanes ahead of the consumer; collate here or hand the
        step to the collate thread, so the lanes keep running while a step is collated."""
        out = self._steps if self._steps is not None else self._queue
        try:
            while not self._stop.is_set():
                if self._steps is not None and not self._steps.empty():
                    # the collate thread has not taken the last step yet: making another
                    # now would only hold one more step's documents, never deliver sooner
                    self._stop.wait(0.002)
                    continue
                step = self._advance()
                if self._steps is not None:
                    item = None if step is None else (step, None)
                elif step is None:
                    item = None
                else:
                    try:
                        item = (step, self._collate_step(step))
                    except BaseException as exc:
                        self._failed = exc  # a step was taken and cannot be delivered
                        raise
                if not self._put(out, item, "driver") or item is None:
                    return
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            self._put(out, exc, "driver")

    def _collate_steps(self) -> None:
        """Collate thread: steps from the driver, in order, to batches for the consumer."""
        assert self._steps is not None
        while not self._stop.is_set():
            try:
                item = self._steps.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is not None and not isinstance(item, BaseException):
                step = item[0]
                try:
                    item = (step, self._collate_step(step))
                except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
                    self._failed = exc  # a step was taken and cannot be delivered
                    item = exc
            if not self._put(self._queue, item, "collate") or item is None \
                    or isinstance(item, BaseException):
                return

    def _stop_background(self) -> list[Any]:
        """Stop the background threads; return what they made beyond the consumer's step,
        in order.

        Items are ``(step, batch)`` (batch None for a step not collated yet),
        None (end of data) or the exception that stopped the driver. `drain`
        uses the steps; the other callers drop them.
        """
        if self._thread is None:
            return []
        self._stop.set()
        self._thread.join()
        if self._steps is not None:
            self._collator.join()
        items: list[Any] = []
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        if "collate" in self._unsent:
            items.append(self._unsent["collate"])
        if self._steps is not None:
            while not self._steps.empty():
                items.append(self._steps.get_nowait())
        if "driver" in self._unsent:
            items.append(self._unsent["driver"])
        self._thread = None
        self._unsent = {}
        return items
