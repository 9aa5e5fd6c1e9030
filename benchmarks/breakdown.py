"""Where the time of one sample goes: each stage timed directly, in a tight loop, one process.

Times are CPU seconds of this process (``time.process_time``), so other load
on the machine does not inflate them.

Stages: ``read`` (pread of the tar members), ``decode`` (JPEG header, optional
draft, full decode, RGB), ``resize`` (target size + bicubic resize),
``patchify`` (uint8 patch rows), ``video`` (PyAV decode + resize + patchify of
the few video samples), ``tokenize`` (multimodal tokenization), ``pack``
(zephon's best-fit packer), and ``transfer``: what zephon's default process
runner does to move one sample between processes (the request, a pointer,
pickled; the answer with its patch rows copied into a pooled shared-memory
file, pickled, mapped back and released), done in one process so only the
copy and (de)serialization cost shows, not the wait; ``collate``: the
recipe's collate of the packed rows into training tensors, batches of
``batch_rows`` rows (what a delivered batch adds to the worker stage).
"""

from __future__ import annotations

import os
import pickle
import re
import time
from collections import defaultdict

from zephon_bench.workload import Work, WorkSpec

STAGES = ("read", "decode", "resize", "patchify", "video", "tokenize", "pack", "transfer",
          "collate")
_IMG = re.compile(r"^(?:\d+\.)?(jpg|jpeg|png|webp)$")


def run_breakdown(spec: WorkSpec, num_samples: int = 200) -> dict:
    from zephon_core import Element, Origin
    from zephon_core import internals as shm
    from zephon_vl import process_video
    from zephon_vl.media.image import (
        decode_rgb,
        finish_patches,
        open_image,
        resize_rgb,
        target_size,
    )

    work = Work.build(spec)
    read, decode_op, tokenize_op = work.fn.transforms
    tokenize_op.setup()
    reader = read.readers[0]
    settings = decode_op.image
    packer = work.pack.make(0, spec.seed)
    acc: dict[str, float] = defaultdict(float)
    clock = time.process_time  # CPU time: other jobs on the machine do not inflate it
    pointers = work.pointers[:num_samples]
    n = images = 0
    pool = shm.SegmentPool(f"zephon-{os.getpid()}-breakdown-")
    released: list[str] = []
    rows: list = []
    for seq, p in enumerate(pointers):
        t = clock()
        sample = reader.read(p.shard, p.index)
        acc["read"] += clock() - t
        for key, data in sample.items():
            if not isinstance(key, str) or key.startswith("__"):
                continue
            if key == "mp4":
                t = clock()
                process_video(data, settings, decode_op.video)
                acc["video"] += clock() - t
            elif _IMG.match(key):
                images += 1
                # process_image's steps, one by one
                t0 = clock()
                img = open_image(data, settings, key)
                w, h = img.size
                th, tw = target_size(h, w, settings, key)
                rgb = decode_rgb(img, th, tw, settings, key)
                t1 = clock()
                arr = resize_rgb(rgb, th, tw, settings)
                t2 = clock()
                finish_patches(arr[None], settings, one_frame=True)
                t3 = clock()
                acc["decode"] += t1 - t0
                acc["resize"] += t2 - t1
                acc["patchify"] += t3 - t2
        doc = decode_op.decode(sample)  # untimed: the pieces were timed above
        t = clock()
        out = tokenize_op.tokenize(doc)
        acc["tokenize"] += clock() - t
        origin = Origin(seq, p.dataset, p.shard, p.index, 0)
        t = clock()
        # the process runner's two hops: request (a pointer) and answer (patch rows)
        req = pickle.dumps((0, shm.Packed([Element(0, p, origin)], None, 0), released),
                           protocol=pickle.HIGHEST_PROTOCOL)
        pool.release(pickle.loads(req)[2])
        released.clear()
        ans = pickle.dumps(pool.pack([out]), protocol=pickle.HIGHEST_PROTOCOL)
        received = shm.unpack(pickle.loads(ans), released.append)
        del received  # the packer below takes the worker's own arrays: this copy lets go
        acc["transfer"] += clock() - t
        t = clock()
        packer.push(origin, out)
        while (row := packer.pop_row()) is not None:
            rows.append(row)
        acc["pack"] += clock() - t
        n += 1
    pool.close()
    packer.flush()
    while (row := packer.pop_row()) is not None:
        rows.append(row)
    for i in range(0, len(rows), spec.batch_rows):
        t = clock()
        work.collate(rows[i:i + spec.batch_rows])
        acc["collate"] += clock() - t
    total = sum(acc[s] for s in STAGES)
    return {
        "samples": n,
        "images": images,
        "ms_per_sample": {s: 1000 * acc[s] / max(n, 1) for s in STAGES},
        "share": {s: acc[s] / total if total else 0.0 for s in STAGES},
        "total_ms_per_sample": 1000 * total / max(n, 1),
    }
