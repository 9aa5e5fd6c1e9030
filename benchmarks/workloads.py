"""The benchmark's workloads (``zephon-vl bench --workload ...``): which data, which settings.

* ``photos``: the demo data set (scikit-image's photos cropped to 256-1024
  pixels a side, captions, conversations, interleaved documents, 6 short
  clips); S = 2048, 16 rows per batch: the benchmark as it always was.
* ``fullsize``: captioned photos of 1-12 megapixels, JPEG quality 90
  (:func:`~zephon_bench.media_data.build_fullsize_photos`); S = 2048, 8 rows
  per batch (a row holds about 3 photos at ``max_pixels`` = 512 x 28 x 28; 8
  rows, one per lane, is the smallest global batch of the 8-lane recipe, so a
  run still delivers dozens of batches to measure a rate on).
* ``video``: samples naming clips of 10 s to 5 min
  (:func:`~zephon_bench.media_data.build_video_clips`), 16 frames kept per
  clip at up to 128 x 28 x 28 pixels a frame (about 960 tokens a clip, two
  clips a row); S = 2048, 8 rows per batch.
* ``<name>+busy``: the same, with a neighbour process keeping one core busy
  for the whole run (:mod:`zephon_bench.neighbour`); each loader's rate is
  reported as a share of its rate on ``<name>`` in the same run.

Every loader runs the same recipe operators on the same samples in every workload
(:class:`~zephon_bench.workload.Work`): only the data and the settings change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASES = ("photos", "fullsize", "video")
BUSY = "+busy"
#: shards of 40 samples; --quick uses the first of them
FULL_SAMPLES = {"fullsize": 320, "video": 240}
QUICK_SHARDS = {"fullsize": 4, "video": 3}
VIDEO_MAX_PIXELS = 128 * 28 * 28


@dataclass(frozen=True)
class Workload:
    name: str  # "video+busy"
    base: str  # "video"
    busy: bool

    @property
    def label(self) -> str:
        return self.name + ("" if not self.busy else " (one core kept busy beside the loader)")


def parse_workloads(text: str) -> list[Workload]:
    """``photos,video+busy`` -> workloads in that order; ``all``: every base workload,
    then each with the busy neighbour; ``busy``: every base with the neighbour."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part == "all":
            names += [*BASES, *(b + BUSY for b in BASES)]
        elif part == "busy":
            names += [b + BUSY for b in BASES]
        else:
            names.append(part)
    out: list[Workload] = []
    for n in names:
        base = n.removesuffix(BUSY)
        if base not in BASES:
            raise SystemExit(f"--workload: unknown workload {n!r}; known: "
                             f"{', '.join(BASES)} (each also with {BUSY}), all, busy")
        w = Workload(n, base, n.endswith(BUSY))
        if w not in out:
            out.append(w)
    if not out:
        raise SystemExit("--workload names no workload")
    return out


def workload_settings(base: str, quick: bool) -> dict[str, Any]:
    """Data and `WorkSpec` fields of a base workload other than ``photos``: the data
    (built and cached on first use) and the settings that differ from the photos'."""
    from zephon_bench.media_data import build_fullsize_photos, build_video_clips

    if base == "fullsize":
        data = build_fullsize_photos(num_samples=FULL_SAMPLES["fullsize"])
        spec: dict[str, Any] = {"seq_len": 2048, "batch_rows": 8}
    elif base == "video":
        data = build_video_clips(num_samples=FULL_SAMPLES["video"])
        spec = {"seq_len": 2048, "batch_rows": 8, "video_max_pixels": VIDEO_MAX_PIXELS,
                "video_folder": str(data.video_folder)}
    else:
        raise ValueError(f"no settings for workload {base!r}")
    shards = data.shards[:QUICK_SHARDS[base]] if quick else data.shards
    per_shard = data.num_samples / max(len(data.shards), 1)
    return {"data": data, "shards": [str(s) for s in shards], "spec": spec,
            "samples": int(round(per_shard * len(shards))), "root": Path(data.root)}
