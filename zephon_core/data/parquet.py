"""Damaged Parquet files: told apart from I/O errors, refused naming the file.

A ``.parquet`` whose footer does not read (empty, not Parquet, cut short, its
metadata garbled) cannot be planned: the recipe build refuses it with one line
naming the file and the fix. A row group whose pages do not decode is damage
of that group alone: the readers (`ParquetReader` for ``text``, the record
formats' `RecordFiles`) make each of its rows a ``corrupt_row_group`` bad
sample (docs/reliability.md). pyarrow reports both as `ArrowInvalid` or as an
`OSError` without an errno ("Couldn't deserialize thrift"); an OS read error
carries its errno and storage raises its own errors, and those stop the run.
pyarrow is imported inside the functions: the core does not need it to load.
"""

from __future__ import annotations

from typing import Any

from zephon_core.errors import ConfigError

#: the drop reason of a row in a row group that does not decode
CORRUPT_ROW_GROUP = "corrupt_row_group"


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's text on one line (control characters, which pyarrow copies from
    garbled bytes, dropped), cut at `limit` characters."""
    text = " ".join("".join(c for c in str(exc) if c.isprintable() or c.isspace()).split())
    text = text or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def is_parquet_damage(exc: BaseException) -> bool:
    """Whether pyarrow's `exc` says the bytes are not valid Parquet (invalid data, a page
    header or footer that does not deserialize, a checksum mismatch), not that reading
    failed: pyarrow raises an OS error with its errno, and storage its own errors."""
    import pyarrow as pa

    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowIndexError, pa.ArrowTypeError)):
        return True
    return type(exc) is OSError and exc.errno is None


def open_parquet(source: Any, location: str) -> Any:
    """``pq.ParquetFile`` of `source` (checking page checksums where the writer stored
    them, with pyarrow 14 or later), or a one-line `ConfigError` naming `location` and
    what is wrong with it."""
    import inspect

    import pyarrow.parquet as pq

    checks = "page_checksum_verification" in inspect.signature(pq.ParquetFile).parameters
    try:
        return pq.ParquetFile(source, **({"page_checksum_verification": True} if checks
                                         else {}))
    except Exception as exc:
        if not is_parquet_damage(exc):
            raise
        raise parquet_refusal(location, exc) from None


def parquet_refusal(location: str, exc: BaseException) -> ConfigError:
    text = one_line(exc, 120)
    if "file size is 0 bytes" in text:
        what = "is empty (0 bytes)"
    elif "magic bytes not found" in text:
        what = ("is not a Parquet file (no 'PAR1' at its end): a file of another kind, or "
                "one cut short by an interrupted download or copy")
    else:
        what = f"its footer is damaged ({text})"
    return ConfigError(f"{location}: {what}; re-create or re-download it, or remove it from "
                       "the dataset's files")


def parquet_layout(pf: Any, location: str, size: int) -> tuple[list[int], list[str]]:
    """Rows of each row group and the columns of an open Parquet file, from its footer;
    a footer that does not describe a file of `size` bytes is refused naming it."""
    try:
        meta = pf.metadata
        rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        columns = list(pf.schema_arrow.names)
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                chunk = meta.row_group(g).column(c)
                start = chunk.dictionary_page_offset or chunk.data_page_offset
                if start < 0 or start + chunk.total_compressed_size > size:
                    raise ValueError(f"row group {g} column {c} lies outside its {size} "
                                     "bytes")
        if any(n < 0 for n in rows) or sum(rows) != meta.num_rows:
            raise ValueError(f"row groups of {sum(rows)} rows for {meta.num_rows}")
    except Exception as exc:
        if not (is_parquet_damage(exc) or isinstance(exc, ValueError)):
            raise
        raise parquet_refusal(location, exc) from None
    return rows, columns


def read_checked_group(pf: Any, group: int, columns: list[str] | None = None) -> Any:
    """Row group `group` of the open file `pf`, decoded and checked (`validate(full=True)`:
    offsets, UTF-8, so damage shows here and not as one odd row later)."""
    table = pf.read_row_group(group, columns=columns)
    table.validate(full=True)
    return table


def corrupt_group_detail(name: str, group: int, first: int, stop: int,
                         exc: BaseException) -> str:
    """What a ``corrupt_row_group`` drop (or error) says: the file, the group, its rows
    ``[first, stop)``, pyarrow's words and the fix."""
    return (f"row group {group} (rows {first}-{stop - 1}) of {name} does not decode "
            f"({one_line(exc, 60)}): the file is damaged; re-create or re-download it")
