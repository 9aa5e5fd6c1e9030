"""Random access into WebDataset tar shards by ``(shard, index)``.

WebDataset is a streaming format; zephon needs pointers (``(dataset, shard,
index)``) so that shuffling, lanes and resume are decided without I/O. This
module scans each tar's headers once (``tarfile``, no member data parsed),
groups members into samples with WebDataset's own key rule, hashes the shard's
bytes (SHA-256, so a same-size edit changes the checkpoint fingerprint), and
caches the result as a JSON sidecar keyed by the shard's size and identity
(mtime, or ETag for objects), so a changed shard is noticed and re-indexed.
Reads are ``read_at`` calls at recorded offsets through
`zephon_core.data.storage` (``pread`` for local files, range requests for
URLs): no scanning and no parsing per sample.

Damaged tar structure never hides samples. When a header cannot be read (bad
checksum, a flipped bit in a name, a non-octal or absurd size, a directory
typeflag on a member with data, a zeroed header block), the scan steps forward
in 512-byte blocks to the next valid header and carries on. The unreadable
bytes become an index entry of their own (key ``damaged@START-END``) that
carries the error, and the samples on either side (which may have lost a
member to the damage) are marked too; each becomes a ``damaged_tar`` drop
naming the shard and byte range when its pointer is drawn (or stops the run
under ``on_error="raise"``). The count of entries depends only on the bytes,
so it stays deterministic.

Index file (``<shard>.zidx.json`` beside a local shard, or
``<cache_dir>/<shard>.<location hash>.zidx.json``)::

    {"format": "zephon-wds-index", "version": 2, "shard": "shard-000000.tar",
     "size": 1234567, "identity": "mtime_ns:1700000000000000000",
     "sha256": "9f2c...", "samples": [["000123", [["jpg", 1536, 40211], ...]], ...],
     "bad": [[249, "truncated_member", "jpg needs bytes up to 1234999 ..."]]}

``samples`` is in tar order; each member is ``[extension, data offset, size]``.
``bad`` lists entries that are indexed but cannot be read.

The module is the front of two: `shard_index` (scan, hash, sidecar cache) and
`reader` (`WebDatasetReader`); it offers the names of both.
"""

from __future__ import annotations

from zephon_vl.wds.reader import ShardEntry, WebDatasetReader
from zephon_vl.wds.shard_index import (
    INDEX_FORMAT,
    INDEX_SUFFIX,
    INDEX_VERSION,
    ShardIndex,
    content_sha256,
    load_index,
    read_index_file,
    scan_shard,
    shard_changed_error,
)
from zephon_vl.wds.tarscan import DAMAGED, Member

#: the names this module has always offered (`zephon_vl.__all__` points here)
__all__ = ["DAMAGED", "INDEX_FORMAT", "INDEX_SUFFIX", "INDEX_VERSION", "Member", "ShardEntry",
           "ShardIndex", "WebDatasetReader", "content_sha256", "load_index", "read_index_file",
           "scan_shard", "shard_changed_error"]
