"""``webdataset``: tar shards (or one ``.json`` manifest from ``zephon-vl index``).

A sample is the members of one key: an image (``jpg``/``png``/``webp``) with
a ``txt`` caption or a ``json`` ``caption``; numbered images (``0.jpg``,
``1.jpg``...) with a ``json`` of interleaved ``{"text": [..., null, ...]}``
or of a ``conversations``/``messages`` chat whose ``<image>`` placeholders
(or image parts) take the numbered images in order, or of OBELICS's parallel
``{"texts": [...], "images": [...]}`` lists (an interleaved document whose
non-null ``images`` entries take the numbered images in order); or an
``mp4`` with a ``txt``. See `zephon_vl.ops.multimodal.DecodeVision`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zephon_core import ConfigError, DatasetSpec


class WebDatasetFormat:
    name = "webdataset"
    fields: Mapping[str, str] = {}
    options: tuple[str, ...] = ()
    path_options: tuple[str, ...] = ()
    reads_folders = False

    def reader(self, spec: DatasetSpec, fields: Mapping[str, str],
               index_cache: str | None) -> Any:
        from zephon_vl.wds.index import WebDatasetReader
        from zephon_vl.wds.manifest import reader_from_manifest

        if isinstance(spec.files, str):
            from zephon_vl.formats.manifest import manifest_records_format

            indexed = manifest_records_format(spec.files)
            if indexed is not None:
                raise ConfigError(f"{spec.files} is a manifest of {indexed} record files, "
                                  f"not of tar shards; set the dataset's format = "
                                  f"\"{indexed}\"")
            return reader_from_manifest(spec.files)
        return WebDatasetReader(spec.file_list, cache_dir=index_cache)
