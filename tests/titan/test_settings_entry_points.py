"""Issue 22, item 3: every `Execution` setting is declared once and reachable from Python,
the command line and the TorchTitan config under one name, in one unit, with one meaning."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import ConfigError, Execution
from zephon_core.extend import flat_settings
from zephon_vl.cli.common import add_execution_args, execution_from
from zephon_vl.media.image import ImageSettings
from zephon_vl.titan.dataloader import ZephonDataLoader
from zephon_vl.titan.settings import IMAGE_OVERRIDES, execution_of, image_overrides, titan_type

#: a value other than the default for every leaf, as Python holds it
OTHER = {
    "runner": "threads", "runners": {"read": "threads"}, "workers": {"decode": 3},
    "default_workers": 5, "group_size": 3, "prefetch": 7, "prefetch_steps": 2,
    "start_method": "forkserver", "fuse": False, "group_timeout": None,
    "stall_seconds": 2.5, "stall_drops": None, "retry_deadline": 7.5, "retry_initial": 0.5,
    "retry_maximum": 3.0, "retry_request_timeout": 9.0, "coalesce_max_bytes": 0,
    "coalesce_max_gap": 4096, "backlog_bytes": 3 << 20, "collate_in": "thread",
    "pin_memory": True, "ray_address": "10.0.0.1:6379", "ray_resources": {"zephon_cpu": 2.0},
    "ray_connect_timeout": 45.0,
}


def cli(argv: list[str]) -> Execution:
    p = argparse.ArgumentParser()
    add_execution_args(p)
    return execution_from(p.parse_args(argv))


def titan(**fields) -> Execution:
    return execution_of(ZephonDataLoader.Config(**fields))


def test_every_leaf_is_covered_here():
    assert {s.name for s in flat_settings(Execution)} == set(OTHER)


def test_defaults_are_the_same_from_all_three():
    assert cli([]) == titan() == Execution() == Execution.from_flat({})


@pytest.mark.parametrize("name", sorted(OTHER))
def test_each_setting_means_the_same_from_all_three(name):
    leaf = next(s for s in flat_settings(Execution) if s.name == name)
    value = OTHER[name]
    assert value != leaf.default
    python = Execution.from_flat({name: value})
    assert python.to_flat()[name] == value
    spelled = leaf.spell(value)
    assert cli([leaf.flag, spelled]) == python, spelled
    tp, _ = titan_type(leaf)
    assert titan(**{name: spelled if tp is str else value}) == python
    # the command line's and the config's strings are read by the same parser
    assert Execution.from_flat({name: spelled}) == python


def test_nested_settings_keep_their_python_path():
    ex = Execution.from_flat({"retry_deadline": "7.5", "coalesce_max_bytes": "2MiB"})
    assert ex.retry.deadline == 7.5 and ex.coalesce.max_bytes == 2 << 20
    assert ex.retry.initial == Execution().retry.initial


def test_mappings_repeat_on_the_command_line():
    assert cli(["--workers", "decode=2", "--workers", "tokenize=1"]).workers == \
        {"decode": 2, "tokenize": 1}


@pytest.mark.parametrize("flat, match", [
    ({"backlog_mb": 1}, "unknown Execution settings"),
    ({"group_size": "many"}, "group_size: cannot read 'many'"),
    ({"backlog_bytes": "3 lots"}, "backlog_bytes: cannot read"),
    ({"stall_seconds": 0}, "stall_seconds must be > 0"),
    ({"workers": "decode"}, "OP=N"),
])
def test_bad_values_are_refused_the_same_way(flat, match):
    with pytest.raises(ConfigError, match=match):
        Execution.from_flat(flat)


def test_the_titan_config_is_generated_with_help():
    names = {f.name for f in dataclasses.fields(ZephonDataLoader.Config)}
    assert {s.name for s in flat_settings(Execution)} <= names
    assert not {"backlog_mb", "coalesce_bytes"} & names


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 1 << 40))
def test_sizes_spell_and_read_back(n):
    leaf = next(s for s in flat_settings(Execution) if s.name == "backlog_bytes")
    assert leaf.parse(leaf.spell(n)) == n


def attribute_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of dataclass `cls` (what tyro shows as a field's help)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    return {a.target.id: b.value.value for a, b in zip(body, body[1:], strict=False)
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)}


@pytest.mark.parametrize("name", ["max_pixels", "min_pixels", "max_patches"])
def test_image_overrides_are_generated_from_the_image_settings(name):
    """``--dataloader.max_pixels`` overrides `ImageSettings.max_pixels`: the field is made
    from its declaration (same name, type, unit, help and bounds); None, never 0, is "the
    preset's" (max_pixels has the config's own default)."""
    leaf = next(s for s in flat_settings(ImageSettings) if s.name == name)
    field = next(f for f in dataclasses.fields(ZephonDataLoader.Config) if f.name == name)
    hints = typing.get_type_hints(ZephonDataLoader.Config, include_extras=True)
    tp, arg = typing.get_args(hints[name])
    assert tp == (leaf.annotation if name == "max_pixels" else leaf.annotation | None)
    assert field.default == IMAGE_OVERRIDES[name]
    assert (field.default is None) == (name != "max_pixels")
    doc = arg.help
    assert leaf.info.help in doc and leaf.info.unit in doc and leaf.info.bounds() in doc, doc
    assert name not in attribute_docs(ZephonDataLoader.Config)  # not hand-copied


@pytest.mark.parametrize("name", ["max_pixels", "min_pixels", "max_patches"])
def test_image_overrides_are_checked_by_their_declaration(name):
    config = ZephonDataLoader.Config(image_preset="qwen3_5", **{name: -5})
    with pytest.raises(ConfigError, match=rf"{name} must be >= 1; got -5"):
        image_overrides(config)


def test_a_zero_meant_the_preset_before_0_4_and_warns():
    old = ZephonDataLoader.Config(image_preset="qwen3_5", min_pixels=0, max_patches=0)
    with pytest.warns(DeprecationWarning, match="the preset's own"):
        assert image_overrides(old) == {"max_pixels": 128 * 32 * 32}
    new = ZephonDataLoader.Config(image_preset="qwen3_5", min_pixels=4096)
    assert image_overrides(new) == {"max_pixels": 128 * 32 * 32, "min_pixels": 4096}
