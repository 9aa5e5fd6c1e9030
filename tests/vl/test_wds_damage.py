"""Damaged tar headers: the index resynchronises and nothing disappears uncounted.

Each kind of damage is made on one header of a real shard, the way a flipped
bit or a bad copy would leave it:

=====================  ==================================================  =============
damage                 how                                                  checksum
=====================  ==================================================  =============
bad checksum           the checksum field overwritten                       wrong
flipped name bit       one bit of the member name flipped                   wrong
directory typeflag     typeflag ``5`` on a member with data                 recomputed
absurd size            size field 077777777777 (past the end of the file)   recomputed
non-octal size         size field ``zzzzzzzzzzz``                           recomputed
zeroed block           the whole 512-byte header zeroed                     (none)
=====================  ==================================================  =============

The member whose header is damaged is lost, so its bytes become an index
entry of their own, and the samples on either side (which may have lost it)
are dropped too: ``damaged_tar``, naming the shard and the byte range.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

from tests.helpers.vl import demo_shards, make_recipe, run_epoch
from tests.vl.test_vl_bad_input import global_steps
from tests.vl.test_wds_index import make_samples, strip, wds_samples
from zephon_core.engine.execution import Execution
from zephon_core.engine.loader import Loader
from zephon_core.errors import BadSampleError
from zephon_vl.wds.index import DAMAGED, WebDatasetReader, load_index, scan_shard
from zephon_vl.wds.writer import write_shards

KINDS = ["checksum", "name_bit", "dirtype", "absurd_size", "nonoctal_size", "zeroed"]


def _set_checksum(header: bytearray) -> None:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)


def header_offset(shard: Path, key: str) -> int:
    """Where the header of the first member of sample `key` starts (in an undamaged shard)."""
    with tarfile.open(shard) as tf:
        return next(m for m in tf.getmembers() if m.name.startswith(key + ".")).offset


def damage_header(shard: Path, key: str, kind: str, off: int | None = None) -> int:
    """Damage the header of the first member of sample `key`; returns the header's offset."""
    off = header_offset(shard, key) if off is None else off
    data = bytearray(shard.read_bytes())
    h = bytearray(data[off:off + 512])
    if kind == "checksum":
        h[148:156] = b"0000000\0"
    elif kind == "name_bit":
        h[2] ^= 0x04
    elif kind == "dirtype":
        h[156:157] = b"5"
        _set_checksum(h)
    elif kind == "absurd_size":
        h[124:136] = b"77777777777\0"
        _set_checksum(h)
    elif kind == "nonoctal_size":
        h[124:136] = b"zzzzzzzzzzz\0"
        _set_checksum(h)
    else:
        h[:] = bytes(512)
    data[off:off + 512] = h
    shard.write_bytes(bytes(data))
    return off


@pytest.mark.parametrize("kind", KINDS)
def test_index_resynchronises_after_a_damaged_header(tmp_path: Path, kind: str) -> None:
    (shard,) = write_shards(make_samples(40), tmp_path, samples_per_shard=40)
    clean = {s["__key__"]: s for s in wds_samples(shard)}
    off = damage_header(shard, "000010", kind)
    r = WebDatasetReader([shard])
    delivered, dropped = {}, []
    for i in range(r.shard_len(0)):
        try:
            s = r.read(0, i)
        except BadSampleError as e:
            assert e.reason == DAMAGED and e.where.startswith(f"{shard.name}:"), str(e)
            dropped.append((e.where.split(":", 1)[1], e.detail))
        else:
            delivered[s["__key__"]] = strip(s)
    # Every sample after the damage is still indexed and intact; only the damaged
    # member's neighbours (which may have lost it) and its own bytes are dropped.
    assert sorted(delivered) == sorted(set(clean) - {"000009", "000010"})
    assert all(delivered[k] == clean[k] for k in delivered)
    keys = [k for k, _ in dropped]
    assert keys[0] == "000009" and keys[2] == "000010" and len(keys) == 3
    assert keys[1].startswith(f"damaged@{off}-"), keys
    assert f"bytes {off}.." in dropped[1][1]
    assert len(scan_shard(shard)) == r.shard_len(0)  # the count depends on the bytes only


def test_damage_at_the_start_and_at_the_end(tmp_path: Path) -> None:
    (shard,) = write_shards(make_samples(12), tmp_path, samples_per_shard=12)
    last = header_offset(shard, "000011")
    damage_header(shard, "000000", "checksum")
    damage_header(shard, "000011", "name_bit", last)
    idx = load_index(shard)
    assert idx.keys[0].startswith("damaged@0-")
    readable = [k for i, k in enumerate(idx.keys) if i not in idx.bad]
    assert readable == [f"{i:06d}" for i in range(1, 10)]
    assert idx.keys[-2].startswith(f"damaged@{last}-") and idx.keys[-1] == "000011"
    assert {idx.bad[len(idx) - n][0] for n in (1, 2, 3)} == {DAMAGED}


# --- through the pipeline -------------------------------------------------------------------
@pytest.fixture(scope="module")
def damaged_demo(tmp_path_factory) -> list[str]:
    """The demo shards, two of them damaged (a bad checksum; a zeroed header block)."""
    out = tmp_path_factory.mktemp("damaged")
    shards = [Path(shutil.copy(s, out)) for s in demo_shards(tmp_path_factory)]
    for shard, kind in ((shards[1], "checksum"), (shards[3], "zeroed")):
        key = load_index(shard).keys[7]
        damage_header(shard, key, kind)
    return [str(s) for s in shards]


def epochs_of(shards: list[str], D: int, ex: Execution, on_error: str = "drop"):
    recipe = make_recipe(shards, num_lanes=2, global_batch_size=2, epochs=1, on_error=on_error,
                         shuffle_buffer=4)
    return recipe, [run_epoch(Loader(recipe, d, D, ex)) for d in range(D)]


def test_damaged_entries_are_dropped_exactly_once_on_any_d_and_runner(damaged_demo) -> None:
    recipe, eps = epochs_of(damaged_demo, 1, Execution(runner="inline"))
    reader = recipe.datasets[0].reader
    every = sorted((s, i) for s in range(reader.num_shards) for i in range(reader.shard_len(s)))
    seen = [(o.shard, o.index) for e in eps for o in e.origins()]
    drops = [((o.shard, o.index), r) for e in eps for o, r in e.drops()]
    assert sorted(seen + [p for p, _ in drops]) == every, "a sample lost or counted twice"
    damaged = sorted(p for p, r in drops if r == DAMAGED)
    bad = sorted((s, i) for s in range(reader.num_shards) for i in reader.index(s).bad)
    assert damaged == bad and len(damaged) == 6  # 3 entries per damaged shard
    want = global_steps(recipe, eps)
    for D, ex in [(2, Execution(runner="inline", group_size=3)),
                  (2, Execution(runner="threads", workers={"decode": 2}, group_size=1))]:
        recipe2, eps2 = epochs_of(damaged_demo, D, ex)
        assert global_steps(recipe2, eps2) == want, f"D={D} {ex.runner}: digests or drops differ"


def test_damaged_entry_stops_a_raise_run_naming_shard_and_bytes(damaged_demo) -> None:
    recipe = make_recipe(damaged_demo[1:2], num_lanes=2, global_batch_size=2, epochs=1,
                         on_error="raise", shuffle_buffer=4)
    with Loader(recipe, 0, 1, Execution(runner="inline")) as loader:
        with pytest.raises(BadSampleError) as info:
            for _ in range(100):
                next(loader)
    assert info.value.reason == DAMAGED
    assert Path(damaged_demo[1]).name in str(info.value) and "bytes" in str(info.value)
