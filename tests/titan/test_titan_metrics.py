"""TorchTitan's own Trainer writes zephon's loader metrics to TensorBoard (issue 24 item 1).

A tiny qwen3_5 at D=2 (torchrun, gloo) trains 3 steps with ``--metrics.enable_tensorboard``;
the event file, read back with TensorBoard's EventAccumulator, holds ``zephon/*`` scalars at
every log step, and their samples and drops agree with the same loader run on its own. At
seq_len 256 vlm-mix-demo drops its longest texts (``over_length``), so the drops compared are
not all zero.
"""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")
pytest.importorskip("fla", reason="qwen3_5 needs fla-core (scripts/setup.sh installs it)")
pytest.importorskip("tensorboard", reason="tensorboard is in the titan extra")

from tests.helpers.trainer import SHAPE, TINY  # noqa: E402
from zephon_vl.testing.titan_trainer import TrainerJob  # noqa: E402
from zephon_vl.titan.dataloader import ZephonDataLoader  # noqa: E402

STEPS, D = 3, 2


def loader_counts() -> tuple[int, Counter]:
    """Samples and drops by reason of both ranks over STEPS steps, from loaders run without
    a trainer."""
    samples, drops = 0, Counter()
    for rank in range(D):
        dl = ZephonDataLoader.Config(runner="inline", recipe="vlm-mix-demo", num_lanes=4,
                                     global_batch_size=4, model_format="qwen3_5",
                                     image_preset="qwen3_5", max_pixels=16384,
                                     min_pixels=4096).build(
            dp_world_size=D, dp_rank=rank, tokenizer=None, seq_len=256, local_batch_size=1)
        it = iter(dl)
        for _ in range(STEPS * dl.microbatches):
            next(it)
        m = dl.loader.metrics()
        samples += m.samples_total
        drops.update(m.drops_total)
        dl.close()
    return samples, drops


@pytest.mark.heavy(reason="about 30 s on 2 quiet cores: TorchTitan's Trainer with TensorBoard")
def test_trainer_tensorboard_has_the_loaders_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job = TrainerJob(tmp_path / "run", D, [
        *SHAPE, "--dataloader.recipe", "vlm-mix-demo", "--training.steps", str(STEPS),
        "--metrics.enable_tensorboard", "--metrics.save_for_all_ranks"], **TINY).start()
    result = job.wait(400)
    assert result.ok, result.output[-4000:]
    tags: dict[int, dict[str, list]] = {}
    for rank in range(D):
        [folder] = [p for p in (tmp_path / "run" / "tb").rglob(f"rank_{rank}") if p.is_dir()]
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        tags[rank] = {t: acc.Scalars(t) for t in acc.Tags()["scalars"] if t.startswith("zephon/")}
    for rank, scalars in tags.items():
        for name in ("zephon/wait_per_step_s", "zephon/ranks/wait_per_step_s_max",
                     "zephon/samples_per_s", "zephon/tokens_per_s", "zephon/images_per_s",
                     "zephon/vision_tokens_per_s", "zephon/fill", "zephon/backlog_bytes",
                     "zephon/worker_restarts", "zephon/mixture_samples/photos"):
            assert name in scalars, (rank, name, sorted(scalars))
            assert [e.step for e in scalars[name]] == list(range(1, STEPS + 1)), (rank, name)
        assert any(t.endswith("/utilisation") for t in scalars), sorted(scalars)
        ranks_max = [e.value for e in scalars["zephon/ranks/wait_per_step_s_max"]]
        ranks_mean = [e.value for e in scalars["zephon/ranks/wait_per_step_s_mean"]]
        assert all(hi >= lo >= 0 for hi, lo in zip(ranks_max, ranks_mean, strict=True))
    # both ranks saw the same max over ranks (one all_gather)
    assert ([e.value for e in tags[0]["zephon/ranks/wait_per_step_s_max"]]
            == [e.value for e in tags[1]["zephon/ranks/wait_per_step_s_max"]])
    samples, drops = loader_counts()
    assert drops["over_length"] > 0  # the run has drops to count
    assert sum(tags[r]["zephon/samples_total"][-1].value for r in range(D)) == samples
    drops_total = sum(tags[r]["zephon/drops_total"][-1].value for r in range(D))
    assert drops_total > 0 and drops_total == sum(drops.values())
    per_step = sum(e.value for r in range(D) for e in tags[r]["zephon/drops"])
    assert per_step == drops_total
    for reason, n in drops.items():  # by reason too, step by step
        assert sum(e.value for r in range(D) for e in tags[r].get(f"zephon/drops/{reason}", [])) \
            == n, reason
