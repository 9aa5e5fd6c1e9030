"""Recipe names and TOML files: the same from every entry point, clear refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_core import (
    ConfigError,
    Recipe,
    builtin_names,
    load_recipe,
    register_kind,
    register_recipe,
    text_demo,
)
from zephon_vl.cli.main import main


def write_text_recipe(folder: Path, extra: str = "", dataset_extra: str = "") -> Path:
    data = folder / "data"
    data.mkdir(exist_ok=True)
    (data / "a.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n"
                                          for i in range(40)))
    path = folder / "small.toml"
    path.write_text(f"""kind = "text"
seq_len = 64
global_batch_size = 4
num_lanes = 2
{extra}
[[datasets]]
name = "web"
files = ["data/a.jsonl"]
weight = 2.0
{dataset_extra}
""")
    return path


def test_text_file_resolves_paths_and_overrides(tmp_path: Path) -> None:
    recipe = load_recipe(str(write_text_recipe(tmp_path, "[shuffle]\nblock_size = 16\n")),
                         num_lanes=4)
    assert recipe.name == "small" and recipe.num_lanes == 4 and recipe.seq_len == 64
    assert recipe.shuffle.block_size == 16
    assert [d.name for d in recipe.datasets] == ["web"] and recipe.datasets[0].weight == 2.0
    assert recipe.datasets[0].reader.num_shards == 1


@pytest.mark.parametrize(("extra", "dataset_extra", "message"), [
    ("colour = 3", "", r"small\.toml: unknown key 'colour' for kind 'text'; known: .*seq_len"),
    ("", "wieght = 1.0", r"small\.toml: unknown key 'wieght' in \[\[datasets\]\] #1"),
    ("[shuffle]\nblock = 4", "", r"small\.toml: unknown key 'block' in \[shuffle\]"),
    ('kind = "audio"', "", r"small\.toml: unknown recipe kind 'audio'"),
])
def test_bad_keys_name_the_file_and_key(tmp_path: Path, extra: str, dataset_extra: str,
                                        message: str) -> None:
    path = write_text_recipe(tmp_path, extra, dataset_extra)
    if 'kind = "audio"' in extra:
        path.write_text(path.read_text().replace('kind = "text"\n', "", 1))
    with pytest.raises(ConfigError, match=message):
        load_recipe(str(path))


def test_cli_reports_a_bad_file_in_one_line(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = write_text_recipe(tmp_path, "colour = 3")
    assert main(["digest", "--recipe", str(path), "--steps", "1", "--runner", "inline"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "'colour'" in err[0], err


def test_cli_stall_drops_stops_a_lane_that_drops_everything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--stall-drops reaches Execution: every document is longer than seq_len."""
    path = write_text_recipe(tmp_path, 'overlong = "drop"')
    path.write_text(path.read_text().replace("seq_len = 64", "seq_len = 8"))
    args = ["digest", "--recipe", str(path), "--steps", "1", "--runner", "inline"]
    assert main([*args, "--stall-drops", "7"]) == 2
    err = capsys.readouterr().err
    assert "7 over_length" in err and "seq_len 8 is smaller" in err, err


def test_user_registrations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the registrations stay in this test: later tests (the API snapshot lists every kind's
    # keys) see the registries as every process starts them (plugins loaded first)
    from zephon_core.recipes import registry

    builtin_names()
    monkeypatch.setattr(registry, "_RECIPES", dict(registry._RECIPES))
    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
    register_recipe("tiny-text-demo", lambda **kw: text_demo(**{"num_lanes": 2, **kw}))
    assert "tiny-text-demo" in builtin_names()
    assert load_recipe("tiny-text-demo", global_batch_size=4).num_lanes == 2

    seen: dict = {}

    def my_kind(files: dict, tokenizer: str, *, weights: dict, **fields: object) -> Recipe:
        seen.update(files=files, weights=weights, fields=fields)
        return text_demo(num_lanes=2)

    register_kind("mine", my_kind)
    path = write_text_recipe(tmp_path, "anything = 1")
    path.write_text(path.read_text().replace('kind = "text"', 'kind = "mine"'))
    load_recipe(str(path))
    assert seen["weights"] == {"web": 2.0} and seen["fields"]["anything"] == 1
    assert seen["files"]["web"] == [str((tmp_path / "data" / "a.jsonl").resolve())]


def test_builtins_are_known_without_importing_anything(tmp_path: Path) -> None:
    """Every entry point knows the built-ins; a text recipe imports of zephon_vl only its
    plugin's table of names (no format, recipe or vision library)."""
    path = write_text_recipe(tmp_path)
    code = ("import sys; from zephon_core.recipes.registry import builtin_names, load_recipe; "
            "assert {'text-demo', 'vlm-demo'} <= set(builtin_names()); "
            f"load_recipe({str(path)!r}); load_recipe('text-demo', num_lanes=2); "
            "print(sorted(m for m in sys.modules if m.startswith('zephon_vl') "
            "or m.split('.')[0] in ('PIL', 'av')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "['zephon_vl', 'zephon_vl.plugin']", out.stdout + out.stderr
