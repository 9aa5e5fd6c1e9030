"""Run by tests/core/test_torch_dataset_frameworks.py, under torchrun or alone: a training
loop of a Hugging Face framework fed by `Loader.as_torch_dataset()`, the way
docs/frameworks.md shows it.

``python -m tests.helpers.frameworks trainer|accelerate OUT [CHECKPOINT]`` trains 4
optimizer steps of a tiny model on CPU, checkpointing after step 2 with the framework's
own save (into OUT); with CHECKPOINT it resumes from that folder instead. Each rank writes
the ``input`` rows of every micro-batch it trained on to ``OUT/seen-rank{r}.pt``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.helpers.core import VOCAB, DataSpec, Spec, build_recipe
from zephon_core import Execution, Loader

SPEC = Spec(datasets=(DataSpec((30, 17, 25), max_len=50, data_seed=1),), num_lanes=4,
            rows_per_lane=2, seq_len=32)
STEPS, SAVE_AT, MICRO = 4, 2, 2
STATE_FILE = "zephon_dataloader.json"


def to_model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A zephon text batch as a transformers causal LM's keywords: zephon's ``labels``
    are next-token targets already, so they go in as ``shift_labels`` too (no second
    shift); ``positions`` restart at every packed document."""
    return {"input_ids": batch["input"], "position_ids": batch["positions"],
            "labels": batch["labels"], "shift_labels": batch["labels"]}


def trainer_main(out: str, resume: str | None) -> None:
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    class ZephonTrainer(Trainer):
        def __init__(self, *args: Any, train_loader: StatefulDataLoader, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.train_loader = train_loader
            self.seen: list[torch.Tensor] = []

        def get_train_dataloader(self) -> StatefulDataLoader:
            return self.train_loader  # not through accelerator.prepare: no re-sharding

        def compute_loss(self, model: Any, inputs: dict, *args: Any, **kw: Any) -> Any:
            self.seen.append(inputs["input_ids"].cpu())
            return super().compute_loss(model, inputs, *args, **kw)

    class SaveZephonState(TrainerCallback):
        def __init__(self, dl: StatefulDataLoader) -> None:
            self.dl = dl

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            text = json.dumps(self.dl.state_dict())  # every rank: a collective
            if state.is_world_process_zero:
                folder = Path(args.output_dir, f"checkpoint-{state.global_step}")
                (folder / STATE_FILE).write_text(text)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = TrainingArguments(
        output_dir=out, max_steps=STEPS, save_steps=SAVE_AT, gradient_accumulation_steps=MICRO,
        ignore_data_skip=True, use_cpu=True, ddp_backend="gloo" if world > 1 else None,
        per_device_train_batch_size=SPEC.global_batch_size // (world * MICRO), report_to=[],
        learning_rate=1e-3)
    loader = Loader(build_recipe(SPEC), args.process_index, world, Execution(runner="inline"),
                    microbatches=MICRO)
    dl = StatefulDataLoader(loader.as_torch_dataset(), batch_size=None, num_workers=0,
                            collate_fn=to_model_inputs)
    if resume:
        dl.load_state_dict(json.loads(Path(resume, STATE_FILE).read_text()))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))
    trainer = ZephonTrainer(model=model, args=args, train_loader=dl,
                            callbacks=[SaveZephonState(dl)])
    trainer.train(resume_from_checkpoint=resume)
    torch.save(trainer.seen, Path(out, f"seen-rank{args.process_index}.pt"))
    loader.close()


def accelerate_main(out: str, resume: str | None) -> None:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    loader = Loader(build_recipe(SPEC), accelerator.process_index, accelerator.num_processes,
                    Execution(runner="inline"))
    dl = StatefulDataLoader(loader.as_torch_dataset(), batch_size=None, num_workers=0)
    model = torch.nn.Linear(SPEC.seq_len, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)  # the DataLoader is not prepared
    accelerator.register_for_checkpointing(dl)
    start = 0
    if resume:
        accelerator.load_state(resume)
        start = SAVE_AT
    seen = []
    # range first: zip stops before drawing a batch past the last step
    for step, batch in zip(range(start, STEPS), dl, strict=False):
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        seen.append(batch["input"].cpu())
        accelerator.backward(model(batch["input"].float()).mean())
        opt.step()
        opt.zero_grad()
        if step + 1 == SAVE_AT and not resume:
            accelerator.save_state(str(Path(out, f"checkpoint-{SAVE_AT}")))
    torch.save(seen, Path(out, f"seen-rank{accelerator.process_index}.pt"))
    loader.close()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main = {"trainer": trainer_main, "accelerate": accelerate_main}[sys.argv[1]]
    main(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
