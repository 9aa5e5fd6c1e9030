"""SHA-256 of a batch over a canonical byte layout: the proof of identity.

Layout, for each tensor in name order: the name, the dtype, the shape (as a
UTF-8 header line ``name|dtype|d0,d1,...\\n``), then the raw bytes of the
tensor in C order, little-endian.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np


def _as_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().contiguous().numpy()
    a = np.ascontiguousarray(np.asarray(x))
    return a.astype(a.dtype.newbyteorder("<"), copy=False)


def batch_digest(batch: Mapping[str, Any]) -> str:
    h = hashlib.sha256()
    for name in sorted(batch):
        a = _as_numpy(batch[name])
        h.update(f"{name}|{a.dtype.name}|{','.join(map(str, a.shape))}\n".encode())
        h.update(a.tobytes())
    return h.hexdigest()
