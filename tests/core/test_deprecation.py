"""A renamed or removed public name, keyword or recipe-file key keeps working for one minor
version, with a DeprecationWarning that names its replacement (docs/api.md; issue 35)."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import warnings
from pathlib import Path

import pytest

import zephon_core
import zephon_core.extend
from zephon_core import (
    ConfigError,
    Execution,
    PackSettings,
    qwen_tokenizer_dir,
    recipe_from_toml,
    run_digests,
    text_corpus,
    text_loader,
    text_recipe,
)
from zephon_core.common import deprecation as deprecation_module
from zephon_core.common.deprecation import Deprecation, renamed_key
from zephon_core.recipes import registry

HERE = str(Path(__file__).resolve())
#: what a script written before 0.4 passed, and its 0.4 spelling
OLD = {"pack_mode": "first_fit", "max_open_bins": 2, "overlong": "truncate"}


def small_text_recipe(**kwargs):
    return text_recipe(text_corpus()[:2], qwen_tokenizer_dir(), seq_len=128,
                       global_batch_size=4, num_lanes=2, shuffle_buffer=16, **kwargs)


def digests(make) -> list[str]:
    return [r.sha256 for r in run_digests(make, dp=2, steps=3,
                                          execution=Execution(runner="inline"))]


def settings_of(recipe) -> list[dict]:
    return [op.settings() for op in recipe.ops]


def test_the_old_packing_keywords_work_warn_and_give_the_same_batches() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        old = small_text_recipe(**OLD)
    messages = [str(w.message) for w in caught]
    assert len(messages) == len(OLD)
    for key in OLD:
        line = next(m for m in messages if f"text_recipe({key}=...)" in m)
        assert f"pack={{'{key}': ...}}" in line and "0.5.0" in line, line
    assert {w.filename for w in caught} == {HERE}  # the warning points at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mapping = small_text_recipe(pack=OLD)
        settings = small_text_recipe(pack=PackSettings(**OLD))
        default = small_text_recipe()
    assert settings_of(old) == settings_of(mapping) == settings_of(settings)
    assert settings_of(old) != settings_of(default)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old_digests = digests(lambda: small_text_recipe(**OLD))
    assert old_digests == digests(lambda: small_text_recipe(pack=PackSettings(**OLD)))
    assert old_digests != digests(small_text_recipe)


def test_an_old_keyword_through_text_loader_warns_at_the_callers_line() -> None:
    with pytest.warns(DeprecationWarning, match=r"text_loader\(overlong=\.\.\.\)") as caught:
        loader = text_loader(text_corpus()[:2], qwen_tokenizer_dir(), seq_len=128,
                             global_batch_size=4, num_lanes=2, overlong="drop",
                             execution=Execution(runner="inline"))
    loader.close()
    assert [w.filename for w in caught] == [HERE]
    assert loader.recipe.ops[-1].settings()["overlong"] == "drop"


def test_an_old_keyword_merges_into_the_new_group_and_both_at_once_is_refused() -> None:
    with pytest.warns(DeprecationWarning):
        merged = small_text_recipe(overlong="truncate", pack={"pack_mode": "first_fit"})
        over_object = small_text_recipe(overlong="truncate",
                                         pack=PackSettings(pack_mode="first_fit"))
    want = small_text_recipe(pack=PackSettings(pack_mode="first_fit", overlong="truncate"))
    assert settings_of(merged) == settings_of(over_object) == settings_of(want)
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="give it once"):
        small_text_recipe(overlong="truncate", pack={"overlong": "drop"})


def test_the_old_vlm_packing_keywords_build_the_same_recipe(tmp_path) -> None:
    from zephon_vl import VisionPackSettings, build_demo_dataset, vlm_recipe

    shards = [str(s) for s in build_demo_dataset(tmp_path, num_samples=64).shards]
    old = {"pack_mode": "first_fit", "max_images": 3, "max_vision_tokens": 900,
           "image_every_row": False, "overlong": "truncate", "max_open_bins": 2}
    with pytest.warns(DeprecationWarning) as caught:
        before = vlm_recipe(shards, None, seq_len=1024, **old)
    assert {w.filename for w in caught} == {HERE} and len(caught) == len(old)
    after = vlm_recipe(shards, None, seq_len=1024, pack=VisionPackSettings(**old))
    assert settings_of(before) == settings_of(after)
    assert settings_of(before) != settings_of(vlm_recipe(shards, None, seq_len=1024))


def test_a_moved_name_resolves_to_its_new_home_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"zephon_core\.extend\.StageFn") as caught:
        from zephon_core import StageFn
    assert StageFn is zephon_core.extend.StageFn
    assert [w.filename for w in caught] == [HERE]  # one warning, at the import line
    with pytest.warns(DeprecationWarning, match=r"use zephon_core\.extend\.usable_cores"):
        assert zephon_core.usable_cores is zephon_core.extend.usable_cores
    moved = {d.old.removeprefix("zephon_core."): d.new for d in zephon_core.extend.deprecations()
             if d.old.count(".") == 1 and d.old.startswith("zephon_core.")}
    assert len(moved) == 41  # 32 to extend, 7 to internals, 2 without a replacement (0.4.0)
    for name, new in moved.items():
        assert name not in zephon_core.__all__ and name not in dir(zephon_core)
        with pytest.warns(DeprecationWarning) as caught:
            value = getattr(zephon_core, name)
        assert len(caught) == 1, f"{name}: {[str(w.message) for w in caught]}"
        if new.startswith("zephon_core."):  # a new home: the same object
            module, _, attr = new.rpartition(".")
            assert value is getattr(importlib.import_module(module), attr), name
        else:
            assert new.startswith("no replacement"), new
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        zephon_core.NoSuchName  # noqa: B018


def test_a_renamed_recipe_file_key_is_read_with_a_warning_naming_the_file(
        tmp_path, monkeypatch) -> None:
    """The mechanism, on renames declared for the test (no key has been renamed yet); the
    list of declared deprecations (what docs/api.txt shows) is restored after it."""
    monkeypatch.setattr(deprecation_module, "_DECLARED", deprecation_module.deprecations())
    monkeypatch.setattr(registry, "RENAMED_KEYS", dict([
        renamed_key("packing", "pack_mode", "0.4.0"),
        renamed_key("shuffle.blocks", "block_size", "0.4.0"),
        renamed_key("datasets.paths", "files", "0.4.0")]))
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": f"doc {i} " * 30}) + "\n"
                                              for i in range(40)))
    body = ('kind = "text"\nseq_len = 64\nglobal_batch_size = 4\nnum_lanes = 2\n'
            '{pack} = "first_fit"\n[shuffle]\n{block} = 8\n'
            '[[datasets]]\nname = "web"\n{files} = ["a.jsonl"]\n')
    old, new = tmp_path / "old.toml", tmp_path / "new.toml"
    old.write_text(body.format(pack="packing", block="blocks", files="paths"))
    new.write_text(body.format(pack="pack_mode", block="block_size", files="files"))
    with pytest.warns(DeprecationWarning) as caught:
        before = recipe_from_toml(old, name="r")
    texts = sorted(str(w.message) for w in caught)
    assert len(texts) == 3 and all(t.startswith(f"{old}: ") for t in texts)
    for old_key, new_key in (("'blocks' in [shuffle]", "'block_size'"),
                             ("'packing'", "'pack_mode'"), ("'paths' in [datasets]", "'files'")):
        assert any(f"key {old_key} is deprecated" in t and t.endswith(f"use {new_key}")
                   for t in texts), (old_key, texts)
    assert {w.filename for w in caught} == {HERE}
    after = recipe_from_toml(new, name="r")
    assert settings_of(before) == settings_of(after) and before.shuffle == after.shuffle
    both = tmp_path / "both.toml"
    both.write_text(old.read_text().replace('packing = "first_fit"',
                                            'packing = "first_fit"\npack_mode = "best_fit"'))
    with pytest.raises(ConfigError, match="'packing' is the old name of 'pack_mode'"):
        recipe_from_toml(both)


def test_a_deprecation_goes_one_minor_version_after_it_came() -> None:
    assert Deprecation("x", "y", "0.4.0").removed_in == "0.5.0"
    assert Deprecation("x", "y", "1.9.3").removed_in == "1.10.0"
    version = getattr(zephon_core, "__version__", None) or \
        importlib.metadata.version("zephon-vl")
    current = tuple(int(p) for p in version.split(".")[:2])
    import zephon_vl  # noqa: F401  (its recipes declare their own deprecations)
    import zephon_vl.demo.recipes  # noqa: F401
    overdue = [d for d in zephon_core.extend.deprecations()
               if tuple(int(p) for p in d.removed_in.split(".")[:2]) <= current]
    assert not overdue, ("deprecations past their removal version: remove them (and say so "
                         f"under Removed in CHANGELOG.md): {[d.old for d in overdue]}")
