"""scripts/gpu_smoke.py on CPU: D=2 uninterrupted vs resumed at D=4, digests and losses."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_smoke.py"


@pytest.mark.slow
def test_gpu_smoke_script_runs_on_cpu(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "smoke.json"
    rc = mod.main(["--device", "cpu", "--steps", "3", "--save-at", "2", "--seq-len", "64",
                   "--fold-vocab", "2048", "--dp", "2", "--resume-dp", "4",
                   "--json", str(out)])
    assert rc == 0, capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["digests_identical"]
    assert [r["step"] for r in result["resumed"]] == [2]
    # same rows in the same order on one device: the losses agree exactly
    assert result["max_abs_loss_diff"] == 0.0
    assert "all global batches identical" in capsys.readouterr().out
