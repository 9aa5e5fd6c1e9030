"""The per-sample work every loader in the benchmark does, built from zephon's own operators.

All loaders run *the same* functions on the same shards: zephon's ``Read``
(WebDataset random access), ``DecodeVision`` (pillow-simd decode, optional
``draft``, bicubic resize to the ``ImageSettings`` patch grid, uint8 patch
rows) and ``TokenizeMultimodal`` (Qwen vocabulary, vision placeholder
tokens), fused into one ``StageFn`` exactly as a zephon worker runs them, and
zephon's ``Packer`` (best fit, same open-bin count, same image limit, same
``seq_len``) for rows. The operators are taken from the zephon recipe itself,
so a change to the recipe changes every loader's work alike.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from zephon_core import Dropped, Element, Origin, Pointer, Transform
from zephon_core.extend import CombinerOp, Row, StageFn


@dataclass(frozen=True)
class WorkSpec:
    """Everything that decides the per-sample work (identical for every loader)."""

    shards: tuple[str, ...]
    tokenizer: str
    seq_len: int = 2048
    batch_rows: int = 16
    num_lanes: int = 8
    max_pixels: int = 512 * 28 * 28
    draft: bool = False
    max_images: int = 8
    #: zephon's per-lane pointer shuffle buffer. The recipe default (256) is as large as a
    #: lane's whole share of the 2,000-sample demo set (250), so every lane would hold
    #: all its pointers and flush them at once at the end of the epoch, outside the
    #: lane's in-flight budget; on a real corpus it never does. 32 keeps the bound.
    shuffle_buffer: int = 32
    #: passes over the data: with 2, the second pass is measured with every loader warm
    epochs: int = 1
    seed: int = 0
    #: ``ImageSettings.normalize`` of the collate: "device" (uint8 rows + table, normalized
    #: by ``to_device`` on the accelerator) or "collate" (float32 rows made on the CPU)
    normalize: str = "device"
    #: the folder the samples' video references are relative to (the video workload)
    video_folder: str | None = None
    #: ``VideoSettings.max_pixels_per_frame`` (None: the image settings' max_pixels)
    video_max_pixels: int | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        d["shards"] = list(self.shards)
        return d

    @classmethod
    def from_json(cls, d: dict) -> WorkSpec:
        return cls(**{**d, "shards": tuple(d["shards"])})

    def image_settings(self) -> Any:
        from zephon_vl import ImageSettings

        return ImageSettings(max_pixels=self.max_pixels, draft=self.draft,
                             normalize=self.normalize)

    def video_settings(self) -> Any:
        """The recipe's `VideoSettings` (None: the recipe's default, as before workloads)."""
        from zephon_vl import VideoSettings

        if self.video_folder is None and self.video_max_pixels is None:
            return None
        return VideoSettings(max_pixels_per_frame=self.video_max_pixels,
                             video_folder=self.video_folder)

    def recipe(self, pack: dict | None = None) -> Any:
        """zephon's VLM recipe over the shards, one epoch (every sample exactly once);
        `pack`: more of the recipe's pack settings (a configuration's)."""
        from zephon_vl import vlm_recipe

        return vlm_recipe(list(self.shards), self.tokenizer, seq_len=self.seq_len,
                          global_batch_size=self.batch_rows, num_lanes=self.num_lanes,
                          seed=self.seed, image=self.image_settings(),
                          video=self.video_settings(),
                          pack={"max_images": self.max_images, **(pack or {})},
                          shuffle_buffer=self.shuffle_buffer,
                          epochs=self.epochs, name="vlm-bench")

    def per_sample_recipe(self) -> Any:
        """The recipe with every sample decoded by its own worker call, before the packer
        (`decode_after_pack = false`): the work a per-sample loader's users do, and what
        the worker-stage runs time (zephon's default decodes after its packer, in a row
        stage those loaders do not have)."""
        return self.recipe({"decode_after_pack": False})


@dataclass
class Work:
    """The recipe's stateless operators fused into one call, its packer (the recipe's
    combiner), and the sample list (every sample once per epoch)."""

    spec: WorkSpec
    fn: StageFn
    pack: CombinerOp
    pointers: list[Pointer] = field(default_factory=list)
    #: the recipe's collate (rows -> training tensors), for the delivered-batch runs
    collate: Any = None
    #: the stateless operators after ``read`` (decode + tokenize), for a loader that reads
    #: the samples' bytes itself (Energon)
    after_read: StageFn | None = None

    @classmethod
    def build(cls, spec: WorkSpec) -> Work:
        recipe = spec.per_sample_recipe()
        transforms = [op for op in recipe.ops if isinstance(op, Transform)]
        names = [t.name for t in transforms]
        if names != ["read", "decode", "tokenize"]:
            raise RuntimeError(f"the vlm recipe's transforms changed ({names}); update the "
                               "benchmark so that every loader still does the same work")
        pack = recipe.combiner
        reader = recipe.datasets[0].reader
        pointers = [Pointer(0, s, i) for s in range(reader.num_shards)
                    for i in range(reader.shard_len(s))]
        # One fixed shuffle for the loaders that take a sample list (Grain, DataLoader,
        # the raw limit); zephon shuffles by itself. The order changes no per-sample work.
        rng = np.random.default_rng(spec.seed)
        order = np.concatenate([rng.permutation(len(pointers)) for _ in range(spec.epochs)])
        return cls(spec, StageFn(transforms), pack, [pointers[i] for i in order],
                   recipe.collate, StageFn(transforms[1:]))

    def process(self, seq: int, p: Pointer) -> tuple[Origin, Any]:
        """One sample through read + decode + tokenize (a zephon worker's exact call)."""
        origin = Origin(seq, p.dataset, p.shard, p.index, 0)
        return origin, self.fn([Element(0, p, origin)])[0]

    def process_read(self, seq: int, p: Pointer, sample: dict) -> tuple[Origin, Any]:
        """`process` for a loader that read the sample itself: `sample` is what ``read``
        returns (``__key__``, ``__shard__`` and each member's bytes by extension)."""
        assert self.after_read is not None
        origin = Origin(seq, p.dataset, p.shard, p.index, 0)
        return origin, self.after_read([Element(0, sample, origin)])[0]


def sample_checksum(shard: int, index: int, tokens: int) -> int:
    """Order-free fingerprint of one delivered sample (sum these mod 2**64)."""
    h = hashlib.blake2b(struct.pack("<qqq", shard, index, tokens), digest_size=8).digest()
    return int.from_bytes(h, "little")


@dataclass
class Tally:
    """What a loader delivered: samples, tokens, images, rows, drops and a checksum."""

    samples: int = 0
    tokens: int = 0
    images: int = 0
    rows: int = 0
    dropped: int = 0
    checksum: int = 0
    #: delivered-batch runs only: patch rows, and (when asked) an exact sum of their values
    patches: int = 0
    pixel_sum: int = 0

    def add_rows(self, rows: Iterable[Row]) -> tuple[int, int, int]:
        s = t = im = 0
        for row in rows:
            self.rows += 1
            for seg in row.segments:
                n = seg.end - seg.start
                s += 1
                t += n
                im += int((seg.payload.get("costs") or {}).get("images", 0))
                self.checksum = (self.checksum + sample_checksum(
                    seg.origin.shard, seg.origin.index, n)) % (1 << 64)
        self.samples += s
        self.tokens += t
        self.images += im
        return s, t, im

    def report(self) -> dict:
        return {**asdict(self), "checksum": f"{self.checksum:016x}"}


class RowBatcher:
    """zephon's packer in the main process, for loaders that deliver documents (Grain, torch)."""

    def __init__(self, pack: CombinerOp, batch_rows: int, seed: int = 0) -> None:
        self.packer = pack.make(0, seed)
        self.batch_rows = batch_rows
        self.rows: list[Row] = []
        self.dropped = 0

    def push(self, origin: Origin, doc: Any) -> list[list[Row]]:
        """Absorb one document; returns the batches of `batch_rows` rows now complete."""
        if isinstance(doc, Dropped):
            self.dropped += 1
        elif self.packer.push(origin, doc) is not None:
            self.dropped += 1
        while (row := self.packer.pop_row()) is not None:
            self.rows.append(row)
        out = []
        while len(self.rows) >= self.batch_rows:
            out.append(self.rows[:self.batch_rows])
            del self.rows[:self.batch_rows]
        return out

    def finish(self) -> list[Row]:
        """The rows left after the last full batch (flushed from the open bins)."""
        self.packer.flush()
        while (row := self.packer.pop_row()) is not None:
            self.rows.append(row)
        rest, self.rows = self.rows, []
        return rest


def stand_in(doc: dict) -> dict:
    """A document's packing-relevant part (token count, costs) without its arrays."""
    return {"tokens": np.empty(len(doc["tokens"]), dtype=np.int8), "costs": doc["costs"]}
