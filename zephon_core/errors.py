"""Errors a user can act on: each says what was wrong, where, and how to fix it."""

from __future__ import annotations


class ZephonError(Exception):
    """Base class of every error zephon raises on purpose."""


class ConfigError(ZephonError):
    """A recipe or a combination of settings that cannot work (e.g. L % D != 0)."""


class UnknownKeyError(ConfigError):
    """A key a recipe factory or a settings table does not take. `key` names it, so an
    adapter can reword the error in its own spelling (never by matching the text)."""

    def __init__(self, message: str, key: str) -> None:
        self.key = key
        super().__init__(message)

    def __reduce__(self):
        return (UnknownKeyError, (str(self), self.key))


class CheckpointError(ZephonError):
    """A checkpoint that is corrupt, of another version, or made by another recipe."""


class NoRowsError(ZephonError):
    """A lane keeps drawing elements and drops every one: the recipe can never make a row;
    or a finite run's data ended before its first step (the simulated ranks of
    `run_digests`, ``zephon-vl digest``), every sample dropped or too few rows."""


class BadSampleError(ZephonError):
    """One sample cannot be turned into training data.

    `reason` is a short, stable word (``corrupt_image``, ``decompression_bomb``,
    ``missing_caption``...) used as the drop reason when the policy is ``drop``;
    `where` names the shard, key or pointer so a user can find the bad file.
    """

    def __init__(self, reason: str, where: str, detail: str = "") -> None:
        self.reason = reason
        self.where = where
        self.detail = detail
        msg = f"{reason} at {where}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)

    def __reduce__(self):
        return (BadSampleError, (self.reason, self.where, self.detail))
