"""Write samples into WebDataset tar shards that :mod:`zephon_vl.wds.index` can read.

Shards are written with ``webdataset.ShardWriter`` and a fixed member mtime, so
the same samples give the same bytes (checkpoint fingerprints hold shard sizes,
and demo data must be reproducible). Each shard is written under a temporary
name and renamed when complete, so a crash never leaves a half shard under a
final name.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from zephon_core import ConfigError
from zephon_vl.media.image import IMAGE_EXTS

log = logging.getLogger(__name__)

#: image file suffix -> member extension (``.jpeg`` files become ``jpg`` members)
IMAGE_SUFFIXES = {f".{e}": "jpg" if e == "jpeg" else e for e in IMAGE_EXTS}
CAPTION_EXTS = {".txt": "txt", ".json": "json"}
_PARTIAL = ".partial"
_MTIME = 0  # fixed member mtime: reproducible bytes (an int: a float adds a pax header per member)


def _checked(samples: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Refuse keys that would not read back as the same key (WebDataset cuts at the first dot)."""
    for sample in samples:
        key = sample.get("__key__")
        if not isinstance(key, str) or not key or "." in key.rsplit("/", 1)[-1]:
            raise ValueError(
                f"sample key {key!r} must be a non-empty string without '.' in its last "
                "path part: WebDataset reads the key up to the first dot"
            )
        yield sample


def write_shards(
    samples: Iterable[dict[str, Any]],
    out_dir: str | Path,
    prefix: str = "shard",
    samples_per_shard: int = 256,
) -> list[Path]:
    """Write `samples` to ``out_dir/<prefix>-NNNNNN.tar`` and return the shard paths.

    A sample is ``{"__key__": "000001", "jpg": bytes, "txt": str, "json": dict, ...}``:
    bytes are stored as is, ``str`` as UTF-8, other values with WebDataset's
    encoder for the extension. Older shards with the same prefix are left alone.
    """
    import webdataset as wds  # heavy import, only needed when writing

    if samples_per_shard < 1:
        raise ValueError("samples_per_shard must be >= 1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def finish(tmp_name: str) -> None:
        final = Path(tmp_name[: -len(_PARTIAL)])
        os.replace(tmp_name, final)
        written.append(final)

    pattern = str(out / f"{prefix}-%06d.tar{_PARTIAL}")
    writer = wds.ShardWriter(
        pattern,
        maxcount=samples_per_shard,
        maxsize=float("inf"),
        post=finish,
        verbose=0,
        mtime=_MTIME,
    )
    total = 0
    try:
        for sample in _checked(samples):
            writer.write(sample)
            total += 1
    finally:
        writer.close()
    if total == 0:  # ShardWriter opens its first shard eagerly
        for p in written:
            p.unlink(missing_ok=True)
        return []
    return written


def _folder_samples(folder: Path, skipped: list[tuple[Path, str]]) -> Iterator[dict[str, Any]]:
    """Samples of `folder`: each image with the caption files of the same name.

    Every file that becomes no part of a sample is appended to `skipped` with
    the reason, in path order.
    """
    groups: dict[Path, dict[str, Path]] = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file():
            continue
        ext = p.suffix.lower()
        if ext in IMAGE_SUFFIXES or ext in CAPTION_EXTS:
            groups.setdefault(p.with_suffix(""), {})[ext] = p
        else:
            skipped.append((p, f"not an image ({', '.join(IMAGE_EXTS)}) or a caption "
                               "(.txt, .json)"))
    no_caption = 0
    seen: dict[str, Path] = {}
    for stem in sorted(groups, key=lambda q: q.relative_to(folder).as_posix()):
        files = groups[stem]
        images = sorted(e for e in files if e in IMAGE_SUFFIXES)
        if not images:
            skipped += [(files[e], "a caption without an image of the same name")
                        for e in sorted(files)]
            continue
        skipped += [(files[e], f"another image has the same name ({files[images[0]].name} "
                               "is used)") for e in images[1:]]
        rel = stem.relative_to(folder).as_posix()
        # WebDataset keys end at the first dot of the basename.
        head, _, base = rel.rpartition("/")
        key = (head + "/" if head else "") + base.replace(".", "_")
        if key in seen:
            raise ValueError(f"{stem} and {seen[key]} map to the same key {key!r}; rename one")
        seen[key] = stem
        sample: dict[str, Any] = {"__key__": key}
        img = images[0]
        sample[IMAGE_SUFFIXES[img]] = files[img].read_bytes()
        captions = [e for e in CAPTION_EXTS if e in files]
        if not captions:
            no_caption += 1
        for e in captions:
            sample[CAPTION_EXTS[e]] = files[e].read_bytes()
        yield sample
    if no_caption:
        log.warning(
            "%s: %d image(s) have no .txt/.json caption; kept as image-only samples "
            "(the pipeline's missing-caption policy decides)",
            folder,
            no_caption,
        )


def _counted(items: Iterable[Any], progress: Callable[[int], None]) -> Iterator[Any]:
    for n, item in enumerate(items, 1):
        yield item
        progress(n)


def shards_from_folder(
    folder: str | Path,
    out_dir: str | Path,
    samples_per_shard: int = 256,
    prefix: str = "shard",
    skipped: list[tuple[Path, str]] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Path]:
    """Shard a folder (searched recursively) of images (`IMAGE_EXTS`) + ``name.txt|json``.

    Sorted by relative path so the shards are the same on every run. The key
    is the relative path without extension, dots in the file name replaced by
    ``_`` (a dot would end the WebDataset key). Files that become no part of a
    sample go to `skipped` as ``(path, reason)``; a folder without any image
    is refused (ConfigError) rather than giving an empty data set. `progress` is
    called with the number of samples read so far.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    skipped = [] if skipped is None else skipped
    samples = _folder_samples(folder, skipped)
    if progress is not None:
        samples = _counted(samples, progress)
    written = write_shards(samples, out_dir, prefix, samples_per_shard)
    if not written:
        raise ConfigError(f"{folder}: no images to shard ({len(skipped)} file(s) skipped); "
                          f"images are {', '.join(IMAGE_EXTS)} files, each with an optional "
                          "caption name.txt or name.json beside it")
    return written
