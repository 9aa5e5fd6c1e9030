"""TorchTitan: the dataloader's ledger (Config.ledger), `inspect` and `replay` of a DCP folder.

The DCP checkpoint is written in this process (``no_dist``), as TorchTitan's
checkpointer writes the dataloader (a Stateful under the key "dataloader").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

import torch.distributed.checkpoint as dcp  # noqa: E402

from zephon_core.engine.ledger import compare_ledgers, read_ledger  # noqa: E402
from zephon_vl.cli.main import main  # noqa: E402
from zephon_vl.titan.dataloader import ZephonDataLoader  # noqa: E402

LANES, G, S, B = 4, 8, 64, 4


def build(ledger: Path) -> ZephonDataLoader:
    return ZephonDataLoader.Config(runner="inline", recipe="text-demo", num_lanes=LANES,
                                   global_batch_size=G, ledger=str(ledger)).build(
        dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=S, local_batch_size=B,
        snapshot_every_n_steps=None)


def run_steps(dl: ZephonDataLoader, steps: int) -> None:
    it = iter(dl)
    for _ in range(steps * dl.microbatches):
        next(it)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_titan_ledger_inspect_and_replay_of_a_dcp_checkpoint(tmp_path: Path, capsys) -> None:
    ledger = tmp_path / "ckpt" / "zephon_ledger.jsonl"
    dl = build(ledger)
    run_steps(dl, 2)
    dcp.save({"dataloader": dl}, checkpoint_id=str(tmp_path / "ckpt" / "step-2"), no_dist=True)
    run_steps(dl, 2)
    dl.close()
    assert sorted(read_ledger(ledger).steps) == [0, 1, 2, 3]

    resumed = build(ledger)  # the restarted job appends to the same ledger
    dcp.load({"dataloader": resumed}, checkpoint_id=str(tmp_path / "ckpt" / "step-2"),
             no_dist=True)
    run_steps(resumed, 3)
    resumed.close()
    again = read_ledger(ledger)
    assert again.resumes == [0, 2] and sorted(again.steps) == [0, 1, 2, 3, 4]

    assert main(["inspect", str(tmp_path / "ckpt" / "step-2"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step"] == 2 and summary["num_lanes"] == LANES
    assert summary["global_batch_size"] == G and summary["seq_len"] == S

    out = tmp_path / "replay.jsonl"
    assert main(["replay", str(tmp_path / "ckpt" / "step-2"), "--steps", "3", "--dp", "2",
                 "--runner", "inline", "--against", str(ledger), "--ledger", str(out)]) == 0
    assert "verified 3 steps against" in capsys.readouterr().out
    assert compare_ledgers(read_ledger(out), again).common == [2, 3, 4]

    (tmp_path / "other").mkdir()
    assert main(["inspect", str(tmp_path / "other")]) == 2
    assert "not a torch.distributed.checkpoint" in capsys.readouterr().err
    (tmp_path / "other" / ".metadata").write_bytes(b"not a pickle")
    assert main(["inspect", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert "DCP metadata cannot be read" in err and "Traceback" not in err
