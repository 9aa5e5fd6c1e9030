"""TorchTitan Trainer runs for the tests: a tiny qwen3_5 on vlm-mix-demo, and recipe files."""

from __future__ import annotations

from pathlib import Path

from zephon_core import text_corpus
from zephon_vl import build_demo_dataset

#: The qwen3_5 debug model made tiny for a 2-core CPU (torchrun + gloo + FSDP): 2,048
#: folded token ids, 4 decoder layers (3 gated delta-net + 1 full attention), 1 vision block.
TINY = {"fold_vocab": 2048, "layers": 4, "vision_layers": 1}
#: L=4 lanes, G=4 rows of 256 tokens, 1 row per micro-batch: D in {1, 2, 4}; images of at
#: 4 to 16 merged tokens.
SHAPE = ["--module", "zephon_vl.titan", "--config", "zephon_qwen35_debug",
         "--training.seq_len", "256", "--training.local_batch_size", "1",
         "--training.global_batch_size", "4", "--dataloader.num_lanes", "4",
         "--dataloader.global_batch_size", "4", "--dataloader.max_pixels", "16384",
         "--dataloader.min_pixels", "4096",
         "--dataloader.runner", "inline"]


def mix_demo_toml(path: Path, image_every_row: bool) -> Path:
    """`vlm-mix-demo` (demo photos + bundled text, 1:8) as a recipe file, filler on or off."""
    demo = build_demo_dataset(num_samples=2000)
    shards = ", ".join(f'"{s}"' for s in demo.shards)
    texts = ", ".join(f'"{p}"' for p in text_corpus())
    path.write_text(
        'kind = "vlm"\nname = "vlm-mix-demo"\nmax_images = 8\n'
        f"image_every_row = {str(image_every_row).lower()}\n"
        f'[[datasets]]\nname = "photos"\nfiles = [{shards}]\nweight = 1.0\n'
        f'[[datasets]]\nname = "text"\nfiles = [{texts}]\nweight = 8.0\n')
    return path
