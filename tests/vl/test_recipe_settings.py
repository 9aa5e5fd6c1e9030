"""A recipe's settings are declared once (`zephon_core.extend.setting`): every field has help, the
docs' tables are generated from the declarations, choices are checked from them, TOML
tables are read through them, and a recipe file's top-level packing keys are the fields
of `pack`, so files written before `pack` existed build the same recipe."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.helpers.vl import demo_shards
from zephon_core import (
    BalanceSettings,
    ChatFraming,
    ConfigError,
    PackSettings,
    ShuffleSettings,
    load_recipe,
    text_recipe,
)
from zephon_core.extend import flat_settings, settings_from_table, settings_table
from zephon_vl import ImageSettings, VideoSettings, VisionPackSettings, vlm_recipe

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [PackSettings, VisionPackSettings, ShuffleSettings, ImageSettings, VideoSettings,
           BalanceSettings, ChatFraming]
#: the docs that show a settings class's table (docs/settings.md shows them all)
DOCS = {ChatFraming: ["docs/settings.md", "docs/data-formats.md"]}


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_field_is_declared_with_help(cls: type) -> None:
    leaves = flat_settings(cls)
    assert [s.name for s in leaves] == [f.name for f in dataclasses.fields(cls)]
    assert all(s.info.help.strip() for s in leaves), [s.name for s in leaves]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_docs_list_every_field_from_the_declarations(cls: type) -> None:
    table = settings_table(cls)
    assert all(f"| `{f.name}` |" in table for f in dataclasses.fields(cls))
    for doc in DOCS.get(cls, ["docs/settings.md"]):
        assert table in (ROOT / doc).read_text(), (
            f"{doc} shows an old table of {cls.__name__}; replace it with "
            f"zephon_core.extend.settings_table({cls.__name__}):\n{table}")


@pytest.mark.parametrize(("cls", "name", "bad"), [
    (ImageSettings, "normalize", "gpu"), (ImageSettings, "resample", "cubic"),
    (ImageSettings, "patch_order", "zigzag"), (ImageSettings, "resize", "area"),
    (VideoSettings, "decode", "fast"), (PackSettings, "pack_mode", "balanced"),
    (VisionPackSettings, "overlong", "split"), (ChatFraming, "train_roles", ("user", "tool")),
])
def test_choices_are_checked_from_the_declaration(cls: type, name: str, bad: object) -> None:
    """The error names the field, the value and every allowed value."""
    choices = next(s.info.choices for s in flat_settings(cls) if s.name == name)
    with pytest.raises(ConfigError) as err:
        cls(**{name: bad})
    message = str(err.value)
    wrong = "tool" if isinstance(bad, tuple) else bad
    assert f"{cls.__name__}.{name}" in message and repr(wrong) in message, message
    assert ", ".join(choices) in message, message


def test_tables_are_read_through_the_declarations() -> None:
    image = settings_from_table(ImageSettings, {"max_pixels": "50176",
                                                "image_mean": "0.5,0.5,0.5"}, "image")
    assert image.max_pixels == 50176 and image.image_mean == (0.5, 0.5, 0.5)
    assert settings_from_table(ShuffleSettings, {"block_size": "16", "shards": "false"},
                               "shuffle") == ShuffleSettings(shards=False, block_size=16)
    framing = settings_from_table(ChatFraming, {"train_roles": ["user", "assistant"]},
                                  "chat", base=ChatFraming(system_prompt="Be brief."))
    assert framing == ChatFraming(system_prompt="Be brief.", train_roles=("user", "assistant"))
    with pytest.raises(ConfigError, match=r"unknown key 'max_pixel' in \[image\] \(did you "
                                          r"mean 'max_pixels'\?\); known: patch_size, "):
        settings_from_table(ImageSettings, {"max_pixel": 1}, "image")
    with pytest.raises(ConfigError, match=r"\[balance\] BalanceSettings needs budget: the "
                                          "mean cost per row"):
        settings_from_table(BalanceSettings, {"heavy_every": 4}, "balance")
    with pytest.raises(ConfigError, match=r"\[video\] fps: cannot read 'fast'.*float \(fps\)"):
        settings_from_table(VideoSettings, {"fps": "fast"}, "video")


PACK = {"pack_mode": "first_fit", "max_open_bins": 3, "overlong": "truncate",
        "max_images": 2, "max_vision_tokens": 600, "image_every_row": False}


def write_old_style(folder: Path, shards: list[str]) -> Path:
    """A recipe file as written before `pack`: the packing keys at the top level."""
    path = folder / "old.toml"
    files = ", ".join(f'"{s}"' for s in shards)
    path.write_text(f"""kind = "vlm"
seq_len = 512
global_batch_size = 4
num_lanes = 2
pack_mode = "first_fit"
max_open_bins = 3
overlong = "truncate"
max_images = 2
max_vision_tokens = 600
image_every_row = false
[image]
max_pixels = 50176
[[datasets]]
name = "demo"
files = [{files}]
""")
    return path


def test_old_top_level_packing_keys_build_the_same_recipe(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    shards = [str(Path(s).resolve()) for s in demo_shards(tmp_path_factory)]
    from_file = load_recipe(str(write_old_style(tmp_path, shards)))
    python = vlm_recipe({"demo": shards}, None, seq_len=512, global_batch_size=4,
                        num_lanes=2, image={"max_pixels": 50176}, name="old",
                        pack=VisionPackSettings(**PACK))
    assert from_file.fingerprint() == python.fingerprint()
    packer = from_file.ops[-1]
    assert (packer.mode, packer.max_open_bins, packer.overlong) == ("first_fit", 3, "drop")
    assert packer.limits == {"vision_tokens": 600, "images": 2} and packer.filler is None
    tokenize = next(o for o in from_file.ops if o.name == "tokenize")
    assert tokenize.overlong == "truncate"


def test_load_recipe_overrides_name_pack_fields_once(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = write_old_style(tmp_path, demo_shards(tmp_path_factory))
    assert load_recipe(str(path), max_images=5).ops[-1].limits["images"] == 5
    with pytest.raises(ConfigError, match="max_images is given twice"):
        load_recipe(str(path), pack={"max_images": 5})
    over = load_recipe("vlm-demo", pack_mode="first_fit").ops[-1]
    assert (over.mode, over.limits) == ("first_fit", {"images": 8})


def test_text_recipe_packs_by_its_settings(tmp_path: Path) -> None:
    data = tmp_path / "a.jsonl"
    data.write_text("".join(f'{{"text": "document {i}"}}\n' for i in range(8)))
    path = tmp_path / "t.toml"
    path.write_text(f"""kind = "text"
seq_len = 64
global_batch_size = 2
num_lanes = 2
pack_mode = "first_fit"
max_open_bins = 2
[[datasets]]
name = "data"
files = ["{data}"]
""")
    python = text_recipe({"data": [str(data)]}, None, seq_len=64, global_batch_size=2,
                         num_lanes=2, name="t", pack={"pack_mode": "first_fit",
                                                      "max_open_bins": 2})
    assert load_recipe(str(path)).fingerprint() == python.fingerprint()
    assert (python.ops[-1].mode, python.ops[-1].max_open_bins) == ("first_fit", 2)
