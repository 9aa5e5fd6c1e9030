"""The dataloader through torch.distributed.checkpoint: saved at D=2, loaded at D=4 and D=1.

Real processes (torchrun, gloo) save and load exactly as TorchTitan's
checkpointer does (the dataloader as a Stateful under the key "dataloader");
the D=1 load runs in this process with ``no_dist=True``. Every following
global batch must hash like the uninterrupted run's, and like zephon's own
global batches (``zephon_core.engine.simulate.run_digests``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

import torch.distributed.checkpoint as dcp  # noqa: E402

from zephon_core import (  # noqa: E402
    Execution,
    batch_digest,
    compare_ledgers,
    load_recipe,
    read_ledger,
    run_digests,
)
from zephon_vl.titan.dataloader import ZephonDataLoader, step_rows  # noqa: E402

STEPS, SAVE_AT, LANES, G, S = 5, 2, 4, 8, 64


def torchrun(nproc, out, *extra):
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", "zephon_vl.testing.dcp_check", "--out", str(out),
           "--steps", str(STEPS), "--lanes", str(LANES), "--global-batch", str(G),
           "--seq-len", str(S), "--runner", "inline", "--ledger", str(out / "ledger.jsonl"),
           *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return ({int(k): v for k, v in json.loads((out / "digests.json").read_text()).items()},
            json.loads((out / "state_sha.json").read_text()))


@pytest.mark.slow
def test_dcp_round_trip_across_rank_counts(tmp_path):
    saved, shas = torchrun(2, tmp_path / "d2", "--save-at", str(SAVE_AT))
    assert len(shas) == 2 and len(set(shas)) == 1, "the state must be identical on every rank"
    assert sorted(saved) == list(range(STEPS))
    # zephon's own global batches, ranks simulated in one process
    zephon = [r.sha256 for r in run_digests(
        lambda: load_recipe("text-demo", num_lanes=LANES, global_batch_size=G, seq_len=S),
        1, STEPS, Execution(runner="inline"), ledger=tmp_path / "simulated.jsonl")]
    assert [saved[t] for t in range(STEPS)] == zephon

    resumed4, _ = torchrun(4, tmp_path / "d4", "--resume", str(tmp_path / "d2" / "ckpt"),
                           "--local-batch", "2")
    assert resumed4 == {t: saved[t] for t in range(SAVE_AT, STEPS)}
    # the ledgers of real ranks (gathered over gloo, written by rank 0) match the simulated one
    simulated = read_ledger(tmp_path / "simulated.jsonl")
    on2 = compare_ledgers(simulated, read_ledger(tmp_path / "d2" / "ledger.jsonl"))
    assert on2.ok and on2.common == list(range(STEPS))
    on4 = compare_ledgers(simulated, read_ledger(tmp_path / "d4" / "ledger.jsonl"))
    assert on4.ok and on4.common == list(range(SAVE_AT, STEPS))

    # D = 1 in this process, DCP without a process group
    dl = ZephonDataLoader.Config(runner="inline", recipe="text-demo", num_lanes=LANES,
                                 global_batch_size=G).build(
        dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=S, local_batch_size=4,
        snapshot_every_n_steps=None)
    dcp.load({"dataloader": dl}, checkpoint_id=str(tmp_path / "d2" / "ckpt"), no_dist=True)
    assert dl.step == SAVE_AT
    it = iter(dl)
    for t in range(SAVE_AT, STEPS):
        micro = [next(it) for _ in range(dl.microbatches)]
        got = batch_digest(step_rows(micro))
        assert got == saved[t], f"step {t} differs after resuming at D=1"
    dl.close()
