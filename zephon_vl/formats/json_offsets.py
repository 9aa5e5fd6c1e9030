"""Where each record of a JSON list or JSON Lines file starts: the offset index.

A JSON file's records are found once, the way the tar index is, and the
offsets cached beside the file (or in ``index_cache``, or a record manifest's
sidecar) keyed by size and identity, so `zephon_vl.formats.records` reads
record ``index`` without parsing the others.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

import numpy as np

from zephon_core import ConfigError
from zephon_core.extend import (
    atomic_write,
    base_name,
    is_remote,
    local_path,
    read_whole,
    stat_shard,
)
from zephon_core.extend import cache_dir as default_cache_dir

log = logging.getLogger(__name__)

OFFSETS_SUFFIX = ".zoffsets.json"
OFFSETS_VERSION = 1


#: a JSON string (escapes included) or a bracket: what `_value_end` steps through
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_CLOSING = {"[": "]", "{": "}"}


def _value_end(text: str, pos: int, where: str) -> int:
    """Where the JSON list or object starting at `pos` ends, found by matching brackets
    outside strings, without recursion: `json`'s decoder recurses once per level, so a
    record nested past the interpreter's stack raises `RecursionError` there (at a depth
    that depends on the caller's stack). Its syntax is checked when it is read, where it
    is a ``bad_json`` drop (`loads_sample` refuses more than 100 levels)."""
    stack: list[str] = []
    for m in _JSON_TOKEN.finditer(text, pos):
        token = m.group()
        if token in _CLOSING:
            stack.append(_CLOSING[token])
        elif token[0] != '"':
            if not stack or stack.pop() != token:
                raise ConfigError(f"{where}: not a valid JSON list (unmatched {token!r} at "
                                  f"character {m.start()})")
            if not stack:
                return m.end()
    raise ConfigError(f"{where}: not a valid JSON list (the record at character {pos} is "
                      "never closed)")


def json_offsets(data: bytes, where: str) -> np.ndarray:
    """``[2, n]`` int64: byte start and length of each record of a JSON list, or of each
    non-empty line when the file is JSON Lines (its first non-blank byte is not ``[``).
    A record nested too deeply to decode is stepped over (`_value_end`), not refused."""
    head = data.lstrip()[:1]
    if head != b"[":
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n"))
        starts = np.concatenate([[0], ends + 1])
        stops = np.concatenate([ends, [len(data)]])
        keep = stops > starts
        return np.stack([starts[keep], (stops - starts)[keep]]).astype(np.int64)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 JSON ({exc})") from None
    ascii_only = len(text) == len(data)
    decoder = json.JSONDecoder()
    starts: list[int] = []
    lengths: list[int] = []
    pos = text.index("[") + 1
    byte_pos, char_pos = pos, pos
    n = len(text)

    def skip(p: int) -> int:
        while p < n and text[p] in " \t\r\n":
            p += 1
        return p

    pos = skip(pos)
    if pos < n and text[pos] == "]":
        return np.zeros((2, 0), dtype=np.int64)
    while True:
        try:
            _, end = decoder.raw_decode(text, pos)
        except RecursionError:
            end = _value_end(text, pos, where)
        except ValueError as exc:
            raise ConfigError(f"{where}: not a valid JSON list ({exc})") from None
        if ascii_only:
            b_start, b_end = pos, end
        else:
            b_start = byte_pos + len(text[char_pos:pos].encode())
            b_end = b_start + len(text[pos:end].encode())
            byte_pos, char_pos = b_end, end
        starts.append(b_start)
        lengths.append(b_end - b_start)
        pos = skip(end)
        if pos < n and text[pos] == ",":
            pos = skip(pos + 1)
            continue
        if pos < n and text[pos] == "]":
            break
        raise ConfigError(f"{where}: not a valid JSON list (expected ',' or ']' at "
                          f"character {pos})")
    return np.array([starts, lengths], dtype=np.int64).reshape(2, -1)


def _offsets_cache(location: str, cache_dir: Path | None) -> list[Path]:
    """Where a JSON offset index is looked for; the first is where it is written."""
    name = base_name(location)
    digest = hashlib.sha256(os.fspath(location).encode()).hexdigest()[:16]
    if is_remote(location):
        folder = cache_dir if cache_dir is not None else default_cache_dir() / "record-index"
        return [folder / f"{name}.{digest}{OFFSETS_SUFFIX}"]
    beside = local_path(location).with_name(name + OFFSETS_SUFFIX)
    return [beside] if cache_dir is None else [cache_dir / f"{name}.{digest}{OFFSETS_SUFFIX}",
                                               beside]


def offsets_blob(location: str, size: int, identity: str, offsets: np.ndarray) -> str:
    """The JSON text of an offset index: the cache beside a file, or a manifest's sidecar."""
    return json.dumps({"version": OFFSETS_VERSION, "file": base_name(location), "size": size,
                       "identity": identity, "starts": offsets[0].tolist(),
                       "lengths": offsets[1].tolist()}, separators=(",", ":"))


def offsets_from_blob(text: str | bytes, size: int, identity: str) -> np.ndarray | None:
    """The offsets of an offset-index text when it describes `size` and `identity` (None:
    it describes other bytes). Raises ValueError/KeyError/TypeError on a malformed one."""
    obj = json.loads(text)
    if (obj["version"], obj["size"], obj["identity"]) != (OFFSETS_VERSION, size, identity):
        return None
    return np.array([obj["starts"], obj["lengths"]], dtype=np.int64).reshape(2, -1)


def load_json_offsets(location: str, cache_dir: str | Path | None = None) -> np.ndarray:
    """The offsets of a JSON/JSONL file, from its cache when size and identity match."""
    st = stat_shard(location)
    paths = _offsets_cache(location, Path(cache_dir) if cache_dir is not None else None)
    for p in paths:
        try:
            found = offsets_from_blob(p.read_text(), st.size, st.identity)
            if found is not None:
                return found
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.info("ignoring unusable offset index %s (%s); rebuilding", p, e)
    offsets = json_offsets(read_whole(location), location)
    try:
        atomic_write(paths[0], offsets_blob(location, st.size, st.identity, offsets))
    except OSError as e:
        log.warning("cannot write offset index %s (%s); it lives in memory only. Give the "
                    "recipe an index_cache folder for read-only data folders.", paths[0], e)
    return offsets


