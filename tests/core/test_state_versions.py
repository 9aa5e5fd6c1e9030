"""Issue 36, item 3: compatibility is declared, not kept by hand. A settings field added in
a later release says so (`setting(..., since=...)`) and fingerprints leave it out at its
default; older checkpoint states go through one migration table
(`zephon_core.engine.checkpoint.MIGRATIONS`), and a newer version is refused naming it."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from tests.helpers.core import DataSpec, Spec, World
from zephon_core import ChatFraming, CheckpointError
from zephon_core.common import later
from zephon_core.engine.checkpoint import MIGRATIONS, VERSION, migrate_state
from zephon_core.engine.state_check import CHECKSUM_KEY, later_fields_note, without_later_fields
from zephon_core.extend import flat_settings, later_shard_field, setting, settings_fingerprint
from zephon_vl import ImageSettings

SPEC = Spec(datasets=(DataSpec((12, 7, 20), data_seed=1), DataSpec((5, 9), weight=0.5)),
            num_lanes=4, rows_per_lane=2, shuffle_pos="payloads", seq_len=32)


@dataclasses.dataclass(frozen=True)
class Grown:
    """A throwaway settings class that grew a field in a later release."""

    size: int = setting(4, help="a field of the first release")
    order: tuple[str, ...] = setting(("a", "b"), since="0.9.0", help="added in 0.9.0")


def test_a_later_field_is_left_out_at_its_default_by_its_declaration():
    assert settings_fingerprint(Grown()) == {"size": 4}
    assert settings_fingerprint(Grown(order=("b",))) == {"size": 4, "order": ["b"]}
    assert settings_fingerprint(Grown(size=5)) == {"size": 5}


def test_image_and_chat_settings_declare_their_later_fields():
    later = {s.name for s in flat_settings(ImageSettings) if s.info.since}
    assert later == {"patch_order", "resize", "max_patches", "max_patches_per_side"}
    assert set(ImageSettings().settings()).isdisjoint(later)
    assert ImageSettings(resize="patches").settings()["resize"] == "patches"
    assert all(s.info.since for s in flat_settings(ChatFraming))
    assert ChatFraming().settings() == {}
    assert ChatFraming(train_roles=("user", "assistant")).settings() == {
        "train_roles": ["user", "assistant"]}


@pytest.fixture(scope="module")
def saved() -> tuple[dict, list[str]]:
    """A state at step 3 and the digests of the 3 steps after it."""
    with World(SPEC, 2) as w:
        w.digests(3)
        state = w.state()
        return state, w.digests(3)


def as_version_1(state: dict) -> dict:
    """`state` as version 1 wrote it: lanes unnamed, no SHA-256 of itself, the combiner's
    state under "packer"."""
    old = copy.deepcopy(state)
    old["version"] = 1
    del old[CHECKSUM_KEY]
    for snap in old["lanes"].values():
        del snap["lane"]
        snap["packer"] = snap.pop("combiner")
    return old


def test_a_version_1_state_is_migrated_and_restores_the_same_batches(saved):
    state, after = saved
    old = as_version_1(state)
    kept = copy.deepcopy(old)
    migrated = migrate_state(old)
    assert old == kept  # the caller's state is left as it is
    assert migrated["version"] == VERSION == max(MIGRATIONS) + 1
    assert migrated == state
    with World(SPEC, 2, state=old) as w:
        assert w.digests(3) == after


@pytest.mark.parametrize("version, match", [
    (VERSION + 1, rf"checkpoint version {VERSION + 1} was written by a newer zephon"),
    (0, r"checkpoint version 0 is not one zephon wrote \(known: 1, 2 and 3\)"),
    ("2", r"checkpoint version '2' is not one zephon wrote"),
])
def test_other_versions_are_refused_naming_them(saved, version, match):
    state = {**saved[0], "version": version}
    with pytest.raises(CheckpointError, match=match):
        migrate_state(state)
    with pytest.raises(CheckpointError, match=match), World(SPEC, 2, state=state):
        pass


def test_a_later_shard_field_is_read_from_its_declaration(monkeypatch):
    """A field a shard identity gained is no mismatch against a fingerprint written before it
    because the code that writes it declared it (`later_shard_field`), not because a list
    beside the check names it; an undeclared one is the mismatch to name."""
    monkeypatch.setattr(later, "_DECLARED", copy.deepcopy(later._DECLARED))
    recorded = {"datasets": [{"shards": [{"name": "a", "samples": 3}]}]}
    ours = {"datasets": [{"shards": [{"name": "a", "samples": 3, "notes": {"n": 1}}]}]}
    assert without_later_fields(recorded, ours) == (ours, [])
    assert later_shard_field("notes", since="0.9.0", covers="the notes beside it") == "notes"
    left, missing = without_later_fields(recorded, ours)
    assert left == recorded and missing == ["fingerprint.datasets[0].shards[0].notes"]
    note = later_fields_note(missing)
    assert "zephon-vl 0.9.0" in note and "the notes beside it" in note
    # the built-in ones, each declared where it is written
    import zephon_vl.formats.base  # noqa: F401  (declares the record formats' "media")

    assert later.later_fields(later.SHARD_IDENTITY)["media"].since == "0.4.0"
    assert set(later.later_fields(later.LEDGER_ENTRY)) == {"key", "detail"}
