"""Shared helpers of the vision-language pipeline tests (tests/test_vl_*.py).

One small demo data set (real photos, two videos) is built once per test
session, and one reference run of the VLM recipe (one rank, inline runner,
default execution) is computed once and memoized here, so the guarantee and
layout tests compare against the same global batches without recomputing them.
"""

from __future__ import annotations

import functools
import json
import math
import re
import struct
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from zephon_core import (
    IGNORE_INDEX,
    Execution,
    Loader,
    Origin,
    Recipe,
    RetryPolicy,
    StepMeta,
    batch_digest,
    load_tokenizer,
    qwen_tokenizer_dir,
    run_digests,
)
from zephon_core.extend import Row
from zephon_vl import (
    ImageSettings,
    QwenVL,
    VideoSettings,
    build_demo_dataset,
    normalize_patches,
    process_image,
    process_video,
    vlm_recipe,
)
from zephon_vl.families.qwen import QwenTokens

SEQ_LEN = 1024
GLOBAL_BATCH = 8
NUM_LANES = 8
MAX_IMAGES = 5
IMAGE = ImageSettings(max_pixels=128 * 28 * 28)
VIDEO = VideoSettings()
MERGE = IMAGE.merge_size
STEPS = 3  # global steps compared in the guarantee tests
#: Small groups and no step prefetch: less work decoded ahead and thrown away, so
#: faster tests. Execution knobs never change a batch, which the tests check by
#: giving every other run different ones.
LEAN = Execution(runner="inline", group_size=2, prefetch=2, prefetch_steps=0)
#: remote-shard tests: retries quick enough for a restarted local server
FAST = RetryPolicy(deadline=30.0, initial=0.1, maximum=1.0)
LEAN_FAST = replace(LEAN, retry=FAST)
TENSOR_KEYS = ("input", "labels", "positions", "pixel_values", "grid_thw")
SCALAR_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id",
               "vision_end_token_id")


# --- data --------------------------------------------------------------------------
_DEMO: dict[str, Any] = {}


def demo_shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The session's small demo data set: 80 image samples + 2 videos, 20 per shard."""
    if "shards" not in _DEMO:
        ds = build_demo_dataset(out_dir=tmp_path_factory.mktemp("vl-demo"), num_samples=80,
                                seed=0, videos=2, samples_per_shard=20)
        assert ds.counts["video"] == 2 and len(ds.shards) == 5, ds.counts
        _DEMO["shards"] = [str(s) for s in ds.shards]
    return _DEMO["shards"]


@functools.cache
def tokenizer_dir() -> Path:
    return qwen_tokenizer_dir()


@functools.cache
def tokenizer() -> Any:
    return load_tokenizer(tokenizer_dir())


@functools.cache
def special() -> QwenTokens:
    return QwenVL().special_tokens(tokenizer())


def text_ids(s: str) -> list[int]:
    return list(tokenizer()(s, add_special_tokens=False)["input_ids"])


def make_recipe(shards: list[str], **overrides: Any) -> Recipe:
    """The VLM recipe under test: 8 lanes, 8 rows of 1024 tokens per step, <= 5 images a row."""
    kw: dict[str, Any] = {"seq_len": SEQ_LEN, "global_batch_size": GLOBAL_BATCH,
                          "num_lanes": NUM_LANES, "image": IMAGE}
    kw.update(overrides)
    kw["pack"] = {"max_images": MAX_IMAGES, **overrides.get("pack", {})}
    return vlm_recipe(shards, tokenizer_dir(), **kw)


class RecipeFactory:
    """A `make_recipe` callable for `zephon_core.engine.simulate.run_digests`."""

    def __init__(self, shards: list[str], **overrides: Any) -> None:
        self.shards = shards
        self.overrides = overrides

    def __call__(self) -> Recipe:
        return make_recipe(self.shards, **self.overrides)


# --- the reference run ---------------------------------------------------------------
@dataclass
class Reference:
    recipe: Recipe
    batches: list[dict[str, torch.Tensor]]
    metas: list[StepMeta]
    digests: list[str]


_REFERENCE: dict[str, Reference] = {}


def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """`STEPS` global batches of one rank, inline runner, `LEAN` execution (memoized)."""
    if "ref" not in _REFERENCE:
        recipe = make_recipe(demo_shards(tmp_path_factory))
        batches, metas = [], []
        with Loader(recipe, 0, 1, LEAN) as loader:
            for _ in range(STEPS):
                batches.append(next(loader))
                metas.append(loader.last_meta)
        _REFERENCE["ref"] = Reference(recipe, batches, metas,
                                      [batch_digest(b) for b in batches])
    return _REFERENCE["ref"]


# --- walking loaders ---------------------------------------------------------------
def leftovers(loader: Loader) -> tuple[list[Row], list[tuple[Origin, str]]]:
    """Rows a loader made but never delivered (the `end_of_data` remainder), and their drops.

    Reaches into the loader's lane runs: the public API only reports how many
    rows are left per lane (`Loader.end_of_data`), not which samples they hold.
    Drops recorded after a lane's last row (no row to carry them) are included.
    """
    rows: list[Row] = []
    drops: list[tuple[Origin, str]] = []
    for run in loader._runs:
        rest = run.leftover()
        rows += rest.rows
        drops += [*rest.drops, *rest.after]
    return rows, drops


@dataclass
class Epoch:
    """Everything one rank produced over a finite run: delivered steps, then the remainder."""

    step_rows: list[list[Row]]  # delivered local batches (rows)
    metas: list[StepMeta]
    end_of_data: list[tuple[int, int]]
    left_rows: list[Row]
    left_drops: list[tuple[Origin, str]]

    def origins(self) -> list[Origin]:
        """Every segment's origin, delivered or left over (one entry per segment)."""
        out = [o for m in self.metas for row in m.rows for o, _, _ in row]
        return out + [s.origin for row in self.left_rows for s in row.segments]

    def drops(self) -> list[tuple[Origin, str]]:
        return [d for m in self.metas for d in m.drops] + self.left_drops


def run_epoch(loader: Loader, max_steps: int = 1000) -> Epoch:
    """Iterate a finite loader (epochs=1) to its end; the loader is closed afterwards."""
    rows_per_step, metas = [], []
    try:
        for _ in range(max_steps):
            rows = loader.next_rows()
            if rows is None:
                break
            rows_per_step.append(rows)
            metas.append(loader.last_meta)
        else:
            raise AssertionError(f"loader did not end within {max_steps} steps")
        left_rows, left_drops = leftovers(loader)
        return Epoch(rows_per_step, metas, list(loader.end_of_data), left_rows, left_drops)
    finally:
        loader.close()


# --- independent decoding of a sample --------------------------------------------------
_INDEXED = re.compile(r"^(\d+)\.(jpg|jpeg|png|webp)$")


def expected_vision(sample: dict) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """(normalized float32 patch rows, grid_thw, is_video) of each vision input, in order.

    Decoded here with `process_image` / `process_video` directly, independently
    of the pipeline's operators, row grouping and collation.
    """
    if "mp4" in sample:
        vp = process_video(sample["mp4"], IMAGE, VIDEO)
        return [(normalize_patches(vp.pixel_values, IMAGE), vp.grid_thw, True)]
    indexed = sorted((int(m.group(1)), k) for k in sample if (m := _INDEXED.match(k)))
    keys = [k for _, k in indexed] or [next(e for e in ("jpg", "jpeg", "png", "webp")
                                            if e in sample)]
    out = []
    for k in keys:
        vp = process_image(sample[k], IMAGE)
        out.append((normalize_patches(vp.pixel_values, IMAGE), vp.grid_thw, False))
    return out


def sample_kind(sample: dict) -> str:
    """caption, conversation, interleaved or video (the demo data's four kinds)."""
    if "mp4" in sample:
        return "video"
    if any(_INDEXED.match(k) for k in sample):
        return "interleaved"
    if "json" in sample and "conversations" in json.loads(sample["json"]):
        return "conversation"
    return "caption"


_SAMPLES: dict[str, dict[str, list[dict]]] = {}


def demo_samples_by_kind(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """The raw samples of the demo data (member bytes, without __key__/__shard__) by kind."""
    if "by_kind" not in _SAMPLES:
        from zephon_vl import WebDatasetReader

        reader = WebDatasetReader(demo_shards(tmp_path_factory))
        by_kind: dict[str, list[dict]] = {}
        for s in range(reader.num_shards):
            for i in range(reader.shard_len(s)):
                raw = reader.read(s, i)
                sample = {k: v for k, v in raw.items() if not k.startswith("__")}
                by_kind.setdefault(sample_kind(sample), []).append(sample)
        reader.close()
        _SAMPLES["by_kind"] = by_kind
    return _SAMPLES["by_kind"]


# --- crafted bad input ---------------------------------------------------------------
def png_header_only(width: int, height: int) -> bytes:
    """A PNG signature + IHDR (valid CRC) + IEND: a header that claims a size, no pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def video_duration_from_caption(caption: str) -> float:
    """The demo data's video captions start with 'A {dur}-second clip at {fps} frames ...'."""
    m = re.match(r"A ([0-9.]+)-second clip at (\d+) frames per second", caption)
    assert m is not None, caption
    return float(m.group(1))


def expected_video_t(duration: float) -> int:
    """Temporal patches of a clip sampled at VIDEO.fps: ceil(dur*fps) frames, padded to 2."""
    frames = min(max(math.ceil(duration * VIDEO.fps), VIDEO.min_frames), VIDEO.max_frames)
    return -(-frames // IMAGE.temporal_patch_size)


def json_bytes(obj: Any) -> bytes:
    return json.dumps(obj).encode()


IGNORE = IGNORE_INDEX


# --- end of data across ranks (run in spawned processes) -----------------------------------
def _ten_tokens(sample: dict) -> dict:
    return {"tokens": np.arange(10, dtype=np.int32) + 100 * int(sample["id"])}


def uneven_lanes_recipe() -> Recipe:
    """3 documents of 10 tokens over L=2 lanes, rows of 16: lane 0 packs 2 rows, lane 1 one.

    Text only and in memory (no tokenizer, no files), so spawned ranks start fast.
    """
    from zephon_core import Dataset, InMemoryReader, Map, Pack, Read

    reader = InMemoryReader([[{"id": i} for i in range(3)]])
    ops = [Read([reader]), Map(_ten_tokens, name="ten"), Pack(16, {"overlong": "drop"})]
    return Recipe([Dataset("mem", reader)], ops, global_batch_size=2, num_lanes=2, epochs=1)


def count_batches_job(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """One rank of a gloo job: iterate the loader to its end, write how many batches it gave."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        with Loader(uneven_lanes_recipe(), rank, world, Execution(runner="inline")) as loader:
            n = sum(1 for _ in loader)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(n))
    finally:
        dist.destroy_process_group()


def digests(shards: Any, D: int, ex: Execution, steps: int = STEPS, **kw: Any) -> list[str]:
    """The gathered digests of `steps` global batches of `make_recipe(shards, **kw)` at `D`."""
    return [r.sha256 for r in run_digests(RecipeFactory(shards, **kw), D, steps, ex)]


def hf_image_processor(s: ImageSettings) -> Any:
    """transformers' Qwen2-VL PIL image processor with the geometry of `s`: the reference
    zephon's pixels are compared with (transformers 5 names it ...Pil, 4.x
    Qwen2VLImageProcessor)."""
    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil as cls,
        )
    except ImportError:
        from transformers import Qwen2VLImageProcessor as cls
    return cls(min_pixels=s.min_pixels, max_pixels=s.max_pixels, patch_size=s.patch_size,
               merge_size=s.merge_size, temporal_patch_size=s.temporal_patch_size,
               image_mean=list(s.image_mean), image_std=list(s.image_std))
