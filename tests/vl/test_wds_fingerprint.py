"""The checkpoint fingerprint covers shard contents: same-size edits are refused at resume."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.helpers.vl import LEAN, demo_shards, make_recipe
from tests.vl.test_wds_index import wds_samples
from zephon_core.engine.loader import Loader
from zephon_core.errors import CheckpointError
from zephon_vl.wds.index import load_index
from zephon_vl.wds.writer import write_shards


def copy_demo(tmp_path_factory, name: str) -> list[str]:
    out = tmp_path_factory.mktemp(name)
    return [shutil.copy(s, out) for s in demo_shards(tmp_path_factory)]


def state_after_one_step(shards: list[str]) -> dict:
    with Loader(make_recipe(shards), 0, 1, LEAN) as loader:
        next(loader)
        return loader.state_dict()


def recase_captions(shard: Path) -> None:
    """Upper-case every caption in place: same size, same offsets, other bytes."""
    idx = load_index(shard)
    data = bytearray(shard.read_bytes())
    for members in idx.members:
        for ext, off, n in members:
            if ext == "txt":
                data[off:off + n] = bytes(data[off:off + n]).upper()
    shard.write_bytes(bytes(data))


def swap_two_samples(shard: Path, tmp: Path) -> None:
    """Rewrite the shard with its first two samples swapped (same members, same size)."""
    samples = wds_samples(shard)
    samples[0], samples[1] = samples[1], samples[0]
    (written,) = write_shards(samples, tmp, samples_per_shard=len(samples))
    assert written.stat().st_size == shard.stat().st_size
    shutil.copyfile(written, shard)


@pytest.mark.parametrize("edit", ["recase", "reorder"])
def test_same_size_edit_is_refused_naming_the_shard(tmp_path_factory, tmp_path, edit) -> None:
    shards = copy_demo(tmp_path_factory, edit)
    state = state_after_one_step(shards)
    victim = Path(shards[2])
    size = victim.stat().st_size
    recase_captions(victim) if edit == "recase" else swap_two_samples(victim, tmp_path)
    assert victim.stat().st_size == size
    st = victim.stat()  # a clock that did not move must not hide the edit either way
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    with Loader(make_recipe(shards), 0, 1, LEAN) as loader:
        with pytest.raises(CheckpointError) as info:
            loader.load_state_dict(state)
    msg = str(info.value)
    assert victim.name in msg and "sha256" in msg, msg


def test_a_copied_dataset_resumes(tmp_path_factory) -> None:
    """The fingerprint holds names, sizes, counts and content hashes, not paths or mtimes."""
    shards = copy_demo(tmp_path_factory, "orig")
    state = state_after_one_step(shards)
    moved = copy_demo(tmp_path_factory, "moved")
    with Loader(make_recipe(moved), 0, 1, LEAN) as loader:
        loader.load_state_dict(state)
        next(loader)
