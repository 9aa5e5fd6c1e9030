"""Decode cost of full-size JPEG photos: the exact path against ``ImageSettings.draft``.

skimage's astronaut photo upscaled to 1-12 MP (JPEG quality 90), decoded to the
default budget (about 1 MP) by `process_image`; best of `--repeat` runs, in
milliseconds, with the PSNR and max abs difference of the draft rows. Run:
``python scripts/photo_cost.py``
"""

from __future__ import annotations

import argparse
import io
import math
import time

import numpy as np
from PIL import Image
from skimage import data as photos

from zephon_vl import ImageSettings, process_image


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    src = Image.fromarray(photos.astronaut())
    print(f"{'MP':>3} {'exact ms':>9} {'draft ms':>9} {'speed-up':>8} {'PSNR dB':>8} "
          f"{'max diff':>8}")
    for mp in (1, 2, 4, 8, 12):
        side = round(math.sqrt(mp * 1e6))
        buf = io.BytesIO()
        src.resize((side, side), Image.BICUBIC).save(buf, "JPEG", quality=90)
        jpg = buf.getvalue()
        best, rows = {}, {}
        for draft in (False, True):
            s = ImageSettings(draft=draft)
            runs = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                rows[draft] = process_image(jpg, s).pixel_values
                runs.append(1000 * (time.perf_counter() - t0))
            best[draft] = min(runs)
        a, b = rows[False].astype(np.float64), rows[True]
        mse = float(((a - b) ** 2).mean())
        psnr = math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)
        print(f"{mp:>3} {best[False]:>9.0f} {best[True]:>9.0f} {best[False] / best[True]:>7.1f}x "
              f"{psnr:>8.1f} {int(np.abs(a - b).max()):>8}", flush=True)


if __name__ == "__main__":
    main()
