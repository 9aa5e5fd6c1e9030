"""`zephon-vl digest` ends with a message a user can act on (issue 34).

``--resume-lanes 0`` on a VLM recipe once raised `ZeroDivisionError`, ``--resume-dp 0``
an `IndexError` after the whole uninterrupted run; a finite data set whose every
record is dropped exited 0 printing nothing and writing no ledger; the hint of a
lane that drops everything named a ``zephon-vl ledger`` command that does not exist.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers.formats import recipe_toml, write_images
from zephon_core import ConfigError, Execution, Filter, Loader, NoRowsError, qwen_tokenizer_dir
from zephon_vl.cli.main import main
from zephon_vl.cli.registry import COMMANDS
from zephon_vl.recipes import vlm_recipe


@pytest.mark.parametrize("args", [["--resume-lanes", "0"], ["--resume-lanes", "-2"],
                                  ["--resume-dp", "0"], ["--resume-dp", "2,0"],
                                  ["--dp", "0"], ["--lanes", "0"], ["--resume-dp", "two"]],
                         ids=lambda a: "".join(a))
def test_counts_below_one_are_refused_by_the_command_line(args, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["digest", "--recipe", "vlm-demo", "--steps", "2", "--save-at", "1", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {args[0]}: " in err and "an integer >= 1" in err, err


def test_vlm_recipe_refuses_zero_lanes_naming_them(tmp_path) -> None:
    text = tmp_path / "t.jsonl"
    text.write_text('{"text": "a line"}\n')
    with pytest.raises(ConfigError, match=r"num_lanes must be >= 1, got 0"):
        vlm_recipe([str(text)], qwen_tokenizer_dir(), num_lanes=0)


def all_missing(root, records: int = 20):
    """A LLaVA list whose every record names an image that is not there."""
    write_images(root / "img", 1)
    recs = [{"id": f"r{i}", "image": "gone.jpg", "conversations": [
        {"from": "human", "value": "<image> what?"}, {"from": "gpt", "value": "x"}]}
        for i in range(records)]
    (root / "l.json").write_text(json.dumps(recs))
    return recipe_toml(root / "r.toml", [{"name": "l", "format": "llava",
                                          "files": [str(root / "l.json")],
                                          "image_folder": str(root / "img")}], epochs=1)


def test_a_run_that_delivers_nothing_fails_naming_the_drops(tmp_path, capsys) -> None:
    toml = all_missing(tmp_path)
    ledger = tmp_path / "ledger.jsonl"
    code = main(["digest", "--recipe", str(toml), "--runner", "inline", "--dp", "2",
                 "--steps", "4", "--ledger", str(ledger)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out)
    assert "delivered no batch" in err and "20 missing_media" in err, err
    assert "l.json:r" in err and "gone.jpg" in err, err  # a record and why, for one drop
    assert "Traceback" not in err
    end = [json.loads(line) for line in ledger.read_text().splitlines()][-1]
    assert len(end["drops"]) == 20 and {d["reason"] for d in end["drops"]} == {"missing_media"}
    assert all(d["key"].startswith("l.json:r") for d in end["drops"])


def _never(_payload) -> bool:
    return False


def test_the_hint_of_a_lane_that_drops_everything_names_commands_that_exist(tmp_path) -> None:
    from tests.helpers.formats import write_llava

    path, images, _ = write_llava(tmp_path, 12)
    recipe = vlm_recipe({"l": {"files": [str(path)], "format": "llava",
                               "image_folder": str(images)}}, qwen_tokenizer_dir(),
                        num_lanes=1, global_batch_size=1)
    recipe.ops.insert(-1, Filter(_never, reason="unwanted"))
    with Loader(recipe, execution=Execution(runner="inline", stall_drops=5)) as loader, \
            pytest.raises(NoRowsError) as info:
        loader.next_rows()
    message = str(info.value)
    named = re.findall(r"zephon-vl ([a-z-]+)", message)
    assert named, message
    assert set(named) <= set(COMMANDS), f"{named} are not all commands: {message}"
