"""Cost of decoding one clip against its length: sequential vs the default ("auto").

H.264 clips of 640x360 at 30 fps, a keyframe every 2 s (a panning photo, lossy
x264), 10 s to 5 min long; `process_video` with default `VideoSettings` (16
frames kept) and with 64 frames. Prints a table (best of `--repeat` runs, CPU
and wall milliseconds: CPU time is robust on a shared machine; one process,
one decoder thread) and writes a PNG plot of the CPU times.
Run: ``python scripts/video_cost.py --plot video_cost.png``
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image
from skimage import data as photos

from zephon_vl import ImageSettings, VideoSettings
from zephon_vl.media.video import decode_frames
from zephon_vl.testing.video import encode_test_video

W, H, FPS, GOP = 640, 360, 30, 60


def panning(seconds: int) -> Iterator[np.ndarray]:
    big = np.asarray(Image.fromarray(photos.astronaut()).resize((1280, 720)))
    for i in range(seconds * FPS):
        x = (3 * i) % (big.shape[1] - W)
        y = (i // 7) % (big.shape[0] - H)
        yield big[y:y + H, x:x + W]


def clip(seconds: int, cache: Path) -> bytes:
    path = cache / f"clip-{seconds}s-gop{GOP}.mp4"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode_test_video(panning(seconds), FPS, crf=23, gop=GOP))
    return path.read_bytes()


def time_ms(data: bytes, vs: VideoSettings, repeat: int) -> tuple[float, float, str]:
    """(CPU ms, wall ms, how): best of `repeat`. CPU time is the work done (one
    decoder thread), which other load on a shared machine does not inflate."""
    cpu, wall, how = [], [], ""
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        _, how = decode_frames(data, ImageSettings(), vs)
        cpu.append(1000 * (time.process_time() - c0))
        wall.append(1000 * (time.perf_counter() - t0))
    return min(cpu), min(wall), how


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="10,30,60,120,300", help="clip lengths in seconds")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cache", default="/tmp/zephon-video-cost")
    ap.add_argument("--plot", default="")
    args = ap.parse_args()
    lengths = [int(s) for s in args.lengths.split(",")]
    kept = {16: {}, 64: {"max_frames": 64}}
    rows = []
    print(f"{'length s':>8} {'kept':>5} {'sequential CPU ms':>17} {'auto CPU ms':>11} "
          f"{'speed-up':>8} {'seq wall':>8} {'auto wall':>9} {'packets fed':>12}  auto")
    for seconds in lengths:
        data = clip(seconds, Path(args.cache))
        for frames, extra in kept.items():
            seq, seq_wall, _ = time_ms(data, VideoSettings(decode="sequential", **extra),
                                       args.repeat)
            auto, auto_wall, how = time_ms(data, VideoSettings(**extra), args.repeat)
            rows.append((seconds, frames, seq, auto, how))
            plan, sequential = (int(x) for x in re.findall(r"\d+", how.split(":", 1)[1])[-2:])
            fed = plan if how.startswith("seek") else sequential
            print(f"{seconds:>8} {frames:>5} {seq:>17.0f} {auto:>11.0f} {seq / auto:>7.1f}x "
                  f"{seq_wall:>8.0f} {auto_wall:>9.0f} {fed:>5}/{sequential:<6}  "
                  f"{how.split(':')[0]}", flush=True)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for frames in kept:
            pts = [r for r in rows if r[1] == frames]
            xs = [r[0] for r in pts]
            ax.plot(xs, [r[2] for r in pts], "o--", label=f"sequential, {frames} kept")
            ax.plot(xs, [r[3] for r in pts], "o-", label=f"auto, {frames} kept")
        ax.set_xlabel("clip length (s), 640x360 30 fps, keyframe every 2 s")
        ax.set_ylabel("decode CPU ms per clip (best of runs)")
        ax.set_yscale("log")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
