"""One progress line for the long commands: on a terminal only, never in a pipe or a log.

The line goes to stderr and is rewritten in place (``\\r``) at most every
`Progress.every_s` seconds, so stdout (what scripts parse) never holds it. It is
shown only when stderr is a terminal; ``ZEPHON_PROGRESS=1`` forces it on (for a
CI log that wants it), ``ZEPHON_PROGRESS=0`` off.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import TextIO

__all__ = ["Progress", "progress_wanted"]

ENV = "ZEPHON_PROGRESS"


def progress_wanted(stream: TextIO) -> bool:
    """True when `stream` is a terminal, unless ``ZEPHON_PROGRESS`` says otherwise."""
    forced = os.environ.get(ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a file
        return False


class Progress:
    """``label: done/total unit (pct) elapsed [note]``, rewritten in place.

    Use as a context manager; `advance` or `update` as work finishes. `total`
    None shows a count without a percentage.
    """

    every_s = 0.2

    def __init__(self, label: str, total: int | None = None, unit: str = "",
                 stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = progress_wanted(self.stream) if enabled is None else enabled
        self.done = 0
        self.note = ""
        self._start = time.monotonic()
        self._shown_at = -float("inf")
        self._width = 0

    def advance(self, n: int = 1, note: str = "") -> None:
        self.update(self.done + n, note)

    def update(self, done: int, note: str = "") -> None:
        self.done, self.note = done, note or self.note
        now = time.monotonic()
        if self.enabled and now - self._shown_at >= self.every_s:
            self._shown_at = now
            self._show(now)

    def line(self, now: float | None = None) -> str:
        elapsed = (time.monotonic() if now is None else now) - self._start
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            count = f"{self.done}/{self.total}{unit} ({100 * self.done / self.total:.0f}%)"
        else:
            count = f"{self.done}{unit}"
        note = f" {self.note}" if self.note else ""
        return f"{self.label}: {count} {elapsed:.1f} s{note}"

    def _show(self, now: float) -> None:
        text = self.line(now)
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def say(self, message: str) -> None:
        """`message` as a line of its own above the progress line, shown only where the line
        is: a log a person at a terminal wants (``bench``'s runs) and a pipe does not."""
        if not self.enabled:
            return
        pad = " " * max(0, self._width - len(message))
        self.stream.write("\r" + message + pad + "\n")
        self._width = 0
        now = time.monotonic()
        self._shown_at = now
        self._show(now)

    def close(self) -> None:
        """The last state, then a newline (the terminal's next output starts clean)."""
        if self.enabled and self._width:
            self._show(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
