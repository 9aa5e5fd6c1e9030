"""Plugins: a package adds formats, recipe kinds and recipes through one entry point
(group ``zephon.plugins``), the way zephon_vl adds its own. Here the package is a
``*.dist-info`` folder written by the test, naming `tests.helpers.tiny_plugin:register`,
so the whole path is the real one: installed metadata -> entry point -> register ->
a dataset read by the plugin's format, by name and by the suffix it declares."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from zephon_core import ConfigError, DatasetSpec, Execution, Loader, load_recipe
from zephon_core.common import plugins
from zephon_core.data import formats
from zephon_core.extend import dataset_format, dataset_reader, known_formats, load_plugins
from zephon_core.recipes import registry


def install(folder: Path, monkeypatch: pytest.MonkeyPatch, value: str,
            name: str = "tiny") -> None:
    """What ``pip install`` of a package declaring ``name = value`` leaves on sys.path."""
    info = folder / "zephon_tiny_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zephon-tiny-plugin\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text(f"[zephon.plugins]\n{name} = {value}\n")
    monkeypatch.syspath_prepend(str(folder))
    importlib.invalidate_caches()


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The tiny plugin installed and loaded; its names removed afterwards."""
    install(tmp_path / "site", monkeypatch, "tests.helpers.tiny_plugin:register")
    assert "tiny" in load_plugins()
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.lines").write_text("1 5\n\n2 7\n3 4\n")
    (data / "b.lines").write_text("4 6\n5 3\n")
    yield data
    plugins._loaded.pop("tiny", None)
    formats._FORMATS.pop("tiny-lines", None)
    formats._SUFFIXES.pop(".lines", None)
    registry._KINDS.pop("tiny-lines", None)
    registry._RECIPES.pop("tiny-lines-demo", None)


def test_a_plugin_format_reads_a_dataset_by_name_and_by_its_suffix(tiny: Path) -> None:
    files = [str(tiny / "a.lines"), str(tiny / "b.lines")]
    assert "tiny-lines" in known_formats()
    assert dataset_format(files) == "tiny-lines"
    by_suffix = dataset_reader(files)
    assert [by_suffix.read(0, i) for i in range(by_suffix.shard_len(0))] == \
        [{"id": 1, "n": 5}, {"id": 2, "n": 7}, {"id": 3, "n": 4}]
    named = dataset_reader(DatasetSpec(files, "tiny-lines", options={"skip_blank": False}))
    assert named.shard_len(0) == 4 and named.shard_len(1) == 2
    with pytest.raises(ConfigError, match=r"a dataset mixes \.lines files \(format "
                       r"'tiny-lines'\) with \['\.jsonl'\]"):
        dataset_format([*files, str(tiny / "c.jsonl")])


def test_a_plugin_recipe_runs(tiny: Path) -> None:
    recipe = load_recipe("tiny-lines-demo", folder=str(tiny))
    assert recipe.datasets[0].format == "tiny-lines"
    loader = Loader(recipe, 0, 1, Execution(runner="inline"))
    batch = next(iter(loader))
    assert tuple(batch["input"].shape) == (recipe.global_batch_size, 16)
    loader.close()


def test_a_recipe_file_checks_options_against_the_format(tiny: Path) -> None:
    path = tiny / "r.toml"
    table = '[[datasets]]\nname = "l"\nfiles = ["a.lines", "b.lines"]\n'
    path.write_text(f'kind = "tiny-lines"\n{table}notes_folder = "notes"\nskip_blank = false\n')
    recipe = load_recipe(str(path))
    assert recipe.datasets[0].reader.shard_len(0) == 4
    path.write_text(f'kind = "tiny-lines"\n{table}colour = "red"\n')
    with pytest.raises(ConfigError, match=r"r\.toml: unknown key 'colour' in \[\[datasets\]\] "
                       r"#1; known: .*fields, skip_blank, notes_folder \(format 'tiny-lines' "
                       r"takes skip_blank, notes_folder\)"):
        load_recipe(str(path))
    with pytest.raises(ConfigError, match=r"unknown option 'colour' for a 'tiny-lines' "
                       r"dataset; its options: skip_blank, notes_folder"):
        dataset_reader(DatasetSpec([str(tiny / "a.lines")], options={"colour": 1}))


def test_path_options_resolve_relative_to_the_recipe_file(tiny: Path) -> None:
    sub = tiny / "conf"
    sub.mkdir()
    path = sub / "r.toml"
    path.write_text('kind = "tiny-lines"\n[[datasets]]\nname = "l"\nfiles = ["../a.lines"]\n'
                    'notes_folder = "../notes"\nskip_blank = true\n')
    files, _ = registry._datasets([{"name": "l", "files": ["../a.lines"],
                                    "notes_folder": "../notes"}], sub, ())
    assert files["l"].options == {"notes_folder": str((tiny / "notes").resolve())}
    assert load_recipe(str(path)).datasets[0].reader.shard_len(0) == 3


def test_a_plugin_that_fails_to_load_is_named(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path, monkeypatch, "tests.helpers.tiny_plugin:no_such_function", "broken")
    with pytest.raises(ConfigError, match=r"the zephon plugin 'broken' \(tests\.helpers\."
                       r"tiny_plugin:no_such_function.*failed to load: AttributeError"):
        load_plugins()
    assert "broken" not in plugins._loaded


def test_an_unknown_format_says_where_formats_come_from() -> None:
    with pytest.raises(ConfigError, match=r"unknown dataset format 'nope'; known: .*llava.*"
                       r"plugins loaded: zephon_vl.*zephon\.plugins"):
        dataset_reader(DatasetSpec(["x.jsonl"], "nope"))


class Undeclared:
    """A format that does not say whether its datasets may be folders."""

    name = "undeclared"
    fields: dict = {}
    options: tuple[str, ...] = ()
    path_options: tuple[str, ...] = ()

    def reader(self, spec, fields, index_cache):
        raise AssertionError("never read")


def test_a_format_declares_whether_it_reads_folders(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`reads_folders` is part of the format contract (`DataFormat`), not probed with a
    default: a format without it is refused when registered, naming what it lacks (before,
    it registered, and a folder given to it was refused as if it had said False)."""
    monkeypatch.setattr(formats, "_FORMATS", dict(formats._FORMATS))
    with pytest.raises(ConfigError, match=r"register_format\('undeclared'\).* lacks "
                       r"reads_folders"):
        formats.register_format("undeclared", Undeclared())
    assert "undeclared" not in known_formats()
    folders = {name: formats.data_format(name).reads_folders for name in known_formats()}
    assert folders["text"] is False and folders["webdataset"] is False
    assert folders["mds"] is True and folders["litdata"] is True
    with pytest.raises(ConfigError, match="is a folder"):
        dataset_reader(DatasetSpec([str(tmp_path)], "text"))
