"""Where a record's images and videos may come from, and how much of one is read.

A record is data, not configuration: the path or URL it names for an image is
resolved against the folder the *recipe* names for it (``image_folder``,
``video_folder``), and read only when it lands inside that folder (after
symbolic links are resolved) or under one of the dataset's
``allow_references`` (extra folders or URL prefixes the recipe opts into).
Anything else is a drop, ``reference_outside_folder``, decided before any
byte is read or any host is contacted: a record cannot make the trainer read
``/etc/passwd``, a file a link in the folder points to, or a URL of a host
the recipe never named. A relative path with no folder is refused too
(``reference_without_folder``): it would be read from whatever directory the
trainer happens to run in.

A read is bounded: a referenced file must be a regular file (a FIFO or
``/dev/zero`` would block or never end) of at most ``max_image_bytes`` /
``max_video_bytes``, both checked before it is opened. Paths the operating
system cannot open (too long, or running through a file) are drops too, so a
record never stops a run with an ``OSError``. A ``data:`` URL is no place: the
record carries its bytes, decoded within the same bounds
(`zephon_vl.formats.inline`). Every drop here depends on the record and the files only, so it
is the same at every D and in every run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from zephon_core import BadSampleError, ConfigError
from zephon_core.extend import is_remote, local_path, open_shard
from zephon_vl.media.files import file_kind, inside, path_fault

#: default bounds of one referenced file (a dataset's ``max_image_bytes`` / ``max_video_bytes``)
MAX_IMAGE_BYTES = 256 << 20
MAX_VIDEO_BYTES = 2 << 30
#: the dataset options of the reference policy besides the folders
POLICY_OPTIONS = ("max_image_bytes", "max_video_bytes")
#: the dataset options this module reads (beside ``image_folder`` and ``video_folder``)
OPTIONS = ("allow_references", "max_image_bytes", "max_video_bytes")


def _short(ref: str, limit: int = 80) -> str:
    """`ref` for a message: whole when short, else its start and its length."""
    return repr(ref) if len(ref) <= limit else f"{ref[:limit - 20]!r}... ({len(ref):,} characters)"


def _segments(path: str) -> list[str] | None:
    """A URL path's non-empty segments, percent-decoded; None when one of them could climb
    (``.``, ``..``, or an encoded ``/`` or ``\\``), which no prefix check can trust."""
    out = []
    for raw in path.split("/"):
        seg = unquote(raw)
        if seg in (".", "..") or "/" in seg or "\\" in seg:
            return None
        if seg:
            out.append(seg)
    return out


def url_under(url: str, prefix: str) -> bool:
    """Whether `url` lies under `prefix`: the same scheme and host (port and user
    included), and the prefix's path segments are the first segments of the URL's path.
    ``https://a.org.evil/`` is not under ``https://a.org/``; ``https://a.org/img-x/`` is not
    under ``https://a.org/img``; a path with ``..`` (even encoded) is under nothing."""
    u, p = urlsplit(url), urlsplit(prefix)
    if u.scheme.lower() != p.scheme.lower() or u.netloc.lower() != p.netloc.lower():
        return False
    segs, base = _segments(u.path), _segments(p.path)
    return segs is not None and base is not None and len(segs) > len(base) \
        and segs[:len(base)] == base


def _positive(options: Mapping[str, Any], key: str, default: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive number of bytes, got {value!r}")
    return value


def _allowed(options: Mapping[str, Any]) -> tuple[str, ...]:
    value = options.get("allow_references", ())
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, (str, os.PathLike)) and os.fspath(v) for v in value):
        raise ConfigError("allow_references must be a list of folders or URL prefixes "
                          f"(allow_references = [\"/mnt/data\", \"https://cdn.example.org/\"]), "
                          f"got {value!r}")
    out = tuple(os.fspath(v) for v in value)
    for v in out:
        if is_remote(v) and not urlsplit(v).netloc:
            raise ConfigError(f"allow_references entry {v!r} names no host: a URL prefix "
                              "is a scheme, a host and optionally a path")
    return out


class MediaPlaces:
    """Where a dataset's records may point, and how much of a file they may make it read."""

    def __init__(self, folders: Mapping[str, str | None], options: Mapping[str, Any]) -> None:
        image = folders.get("image_folder")
        video = folders.get("video_folder") or image
        #: the folder relative references are resolved in (video: image_folder by default)
        self.folders: dict[bool, str | None] = {False: image, True: video}
        self.limits = {False: _positive(options, "max_image_bytes", MAX_IMAGE_BYTES),
                       True: _positive(options, "max_video_bytes", MAX_VIDEO_BYTES)}
        allowed = _allowed(options)
        #: the options that decide which references are read, where set (a fingerprint
        #: field: another policy drops other records, so a resume under it would diverge)
        self.policy: dict[str, Any] = {k: options[k] for k in POLICY_OPTIONS if k in options}
        if allowed:
            self.policy["allow_references"] = list(allowed)
        self.prefixes: dict[bool, tuple[str, ...]] = {}
        self.roots: dict[bool, tuple[str, ...]] = {}
        for video_kind, folder in self.folders.items():
            places = ((folder,) if folder is not None else ()) + allowed
            self.prefixes[video_kind] = tuple(p for p in places if is_remote(p))
            self.roots[video_kind] = tuple(os.path.realpath(local_path(p)) for p in places
                                           if not is_remote(p))

    def locate(self, ref: str, video: bool, where: object) -> str:
        """The path or URL a record's `ref` names, once it is known to lie where the
        recipe allows; else a `BadSampleError` naming `where` (nothing is read)."""
        kind = "video" if video else "image"
        if ref[:5].lower() == "data:":
            media_type = ref[5:64].split(",", 1)[0].split(";", 1)[0][:40] or "no media type"
            raise BadSampleError("unsupported_data_url", str(where), f"the {kind} is a data: "
                                 f"URL ({media_type}, {len(ref):,} characters), not a place "
                                 "to read: its bytes are decoded from the record")
        if "\x00" in ref:  # no system call takes it (Python raises ValueError)
            raise BadSampleError("bad_media_path", str(where), f"the {kind} path "
                                 f"{_short(ref)} holds a NUL character")
        folder = self.folders[video]
        if is_remote(ref):
            return self._url(ref, kind, ref, where)
        path = os.fspath(local_path(ref))
        if not os.path.isabs(path):
            if folder is None:
                raise BadSampleError("reference_without_folder", str(where), self.no_folder(
                    ref, kind))
            if is_remote(folder):
                return self._url(f"{folder.rstrip('/')}/{path}", kind, ref, where)
            path = os.path.join(local_path(folder), path)
        real = os.path.realpath(path)
        if any(inside(real, root) for root in self.roots[video]):
            return real
        linked = any(inside(os.path.abspath(path), root) for root in self.roots[video])
        raise self._outside(ref, kind, where, " (a symbolic link leads out)"
                            if linked else "")

    def needs_folder(self, ref: str, video: bool) -> bool:
        """Whether `ref` is a relative path the dataset has no folder for."""
        return self.folders[video] is None and not ref[:5].lower() == "data:" \
            and not is_remote(ref) and not os.path.isabs(os.fspath(local_path(ref)))

    @staticmethod
    def no_folder(ref: str, kind: str) -> str:
        return (f"the {kind} {_short(ref)} is a relative path and the dataset names no "
                f"{kind}_folder: set {kind}_folder to the folder it is in (relative paths "
                "are never read from the working directory)")

    def _url(self, url: str, kind: str, ref: str, where: object) -> str:
        video = kind == "video"
        if any(url_under(url, prefix) for prefix in self.prefixes[video]):
            return url
        raise self._outside(ref, kind, where, "")

    def _outside(self, ref: str, kind: str, where: object, why: str) -> BadSampleError:
        return BadSampleError("reference_outside_folder", str(where), f"not under "
                              f"{kind}_folder or allow_references{why}, not read: the {kind} "
                              f"{_short(ref)}")

    def read(self, location: str, video: bool, where: object) -> bytes:
        """All bytes of the file at `location` (from `locate`), read only if it is a
        regular file within the size bound."""
        return read_bounded(location, self.limits[video], "video" if video else "image",
                            where)


def _check_file(location: str, st: os.stat_result, limit: int, kind: str,
                where: object) -> None:
    special = file_kind(st.st_mode)
    if special is not None:
        raise BadSampleError("not_a_regular_file", str(where),
                             f"{_short(location)} is a {special}, not a regular file; not read")
    if st.st_size > limit:
        raise _too_large(location, st.st_size, limit, kind, where)


def _too_large(location: str, size: int, limit: int, kind: str,
               where: object) -> BadSampleError:
    return BadSampleError("media_too_large", str(where), f"{_short(location)} is {size:,} "
                          f"bytes, over max_{kind}_bytes {limit:,}; not read")


def read_bounded(location: str, limit: int, kind: str, where: object) -> bytes:
    """The bytes of a regular file (or an object behind a URL) of at most `limit` bytes.

    Local files are stat'ed before they are opened (a FIFO, a device or a folder is never
    opened), opened without blocking and checked again on the open descriptor, and read
    to at most `limit` bytes even if the file grows meanwhile. A URL's size comes from
    the storage seam's stat before its bytes are asked for. A missing file is the
    record's ``missing_media``; a path the system cannot open is ``bad_media_path``.
    """
    if is_remote(location):
        try:
            stored = open_shard(location)
        except BadSampleError as exc:
            raise BadSampleError("missing_media", str(where), exc.detail or str(exc)) from None
        try:
            if stored.size > limit:
                raise _too_large(location, stored.size, limit, kind, where)
            return stored.read_at(0, stored.size)
        finally:
            stored.close()
    try:
        _check_file(location, os.stat(location), limit, kind, where)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(location, flags | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise BadSampleError("missing_media", str(where), f"{location} does not exist (set "
                             f"the dataset's {kind}_folder)") from None
    except OSError as exc:
        why = path_fault(exc)
        if why is None:
            raise
        raise BadSampleError("bad_media_path", str(where),
                             f"{why}: {_short(location)}") from None
    try:
        st = os.fstat(fd)  # the file opened is the file checked
        _check_file(location, st, limit, kind, where)
        parts, total = [], 0
        while True:
            chunk = os.read(fd, min(limit + 1 - total, max(st.st_size - total, 0) + 1, 1 << 30))
            if not chunk:
                break
            parts.append(chunk)
            total += len(chunk)
            if total > limit:
                raise BadSampleError("media_too_large", str(where), f"{_short(location)} "
                                     f"grew over max_{kind}_bytes {limit:,} while read")
    finally:
        os.close(fd)
    return parts[0] if len(parts) == 1 else b"".join(parts)
