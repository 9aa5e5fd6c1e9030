"""Issue 22, item 5: `resolve_config` turns a ``ZephonDataLoader.Config`` into the recipe,
execution and family in one pure step, building the recipe once, with errors reworded
from what they carry (never from their text)."""

from __future__ import annotations

import pytest

import zephon_vl.titan.resolve as resolve
from zephon_core import ConfigError, Execution, UnknownKeyError, register_recipe
from zephon_vl.titan.dataloader import ZephonDataLoader
from zephon_vl.titan.resolve import resolve_config


@pytest.fixture
def builds(monkeypatch):
    """How many times the recipe is built (each build indexes the shards)."""
    count = []
    real = resolve.load_recipe

    def counting(*args, **kwargs):
        count.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(resolve, "load_recipe", counting)
    return count


def config(**kw) -> ZephonDataLoader.Config:
    return ZephonDataLoader.Config(**{"runner": "inline", "num_lanes": 4, **kw})


def test_the_recipes_own_batch_size_is_found_with_one_build(builds):
    got = resolve_config(config(recipe="text-demo"), dp_world_size=2, seq_len=64,
                         local_batch_size=2)
    assert builds == ["text-demo"]
    assert (got.recipe.global_batch_size, got.recipe.seq_len, got.recipe.num_lanes) == \
        (16, 64, 4)
    assert got.microbatches == 16 // (2 * 2)
    assert got.family.name == "text" and got.execution == Execution(runner="inline")


def test_a_bad_geometry_is_refused_before_any_build(builds):
    with pytest.raises(ConfigError, match="cannot share num_lanes=4"):
        resolve_config(config(global_batch_size=8), dp_world_size=3, seq_len=64,
                       local_batch_size=1)
    assert builds == []


def test_execution_fields_resolve_through_from_flat():
    got = resolve_config(config(backlog_bytes=None, workers="tokenize=1", runner="processes",
                                retry_deadline=3.0),
                         dp_world_size=1, seq_len=64, local_batch_size=4)
    assert got.execution == Execution.from_flat(
        {"backlog_bytes": None, "workers": {"tokenize": 1}, "runner": "processes",
         "retry_deadline": 3.0})
    with pytest.raises(ConfigError, match=r"zephon dataloader: group_size: cannot read"):
        resolve_config(config(group_size="many"), dp_world_size=1, seq_len=64,
                       local_batch_size=4)


def test_image_settings_on_a_text_recipe_file_are_reworded(tmp_path):
    docs = tmp_path / "d.jsonl"
    docs.write_text('{"text": "a short document"}\n')
    recipe = tmp_path / "t.toml"
    recipe.write_text('kind = "text"\n[[datasets]]\nname = "d"\nfiles = ["d.jsonl"]\n')
    with pytest.raises(ConfigError, match=r"image_preset='qwen3_5' on recipe .*t.toml', which "
                                          r"takes no image settings"):
        resolve_config(config(recipe=str(recipe), model_format="qwen3_5",
                              image_preset="qwen3_5", global_batch_size=4),
                       dp_world_size=1, seq_len=64, local_batch_size=4)


def test_a_type_error_inside_a_recipe_is_not_mistaken_for_an_unknown_key():
    """The old adapter turned any TypeError mentioning "image" into "takes no image
    settings"; a bug inside a factory must surface as itself."""
    def broken(**overrides):
        raise TypeError("image: unsupported operand")

    register_recipe("test-broken-vlm", broken)
    with pytest.raises(TypeError, match="unsupported operand"):
        resolve_config(config(recipe="test-broken-vlm", model_format="qwen3_5",
                              image_preset="qwen3_5", global_batch_size=4),
                       dp_world_size=1, seq_len=64, local_batch_size=4)


def test_unknown_keys_carry_the_key():
    from zephon_core import load_recipe

    with pytest.raises(UnknownKeyError) as err:
        load_recipe("text-demo", image=object())
    assert err.value.key == "image"
