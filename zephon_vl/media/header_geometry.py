"""An image's or a clip's patch grid from its header or container index, no pixel decoded.

A packer needs each sample's token count, and an item's count follows from its
patch grid ``(t, h, w)``: the size after EXIF orientation and the resize rule for
an image; the frames `sample_frame_indices` keeps and the first frame's size for a
clip. All of these sit in the file's header (JPEG SOF and APP1, PNG IHDR, WebP
VP8X, TIFF IFD, GIF screen descriptor, BMP info header) or the container's index
(the MP4 sample table), so the grid can be known before the decode.

`image_geometry` and `video_geometry` return the grid that `process_image` and
`process_video` would give, or None where the header cannot be trusted for it;
such an item is decoded early, as before (tests/vl/test_header_geometry.py holds
both to the decode on every image kind the project reads and every test clip):

- a PNG with text or EXIF chunks after its pixel data (Pillow reads those only by
  decoding, and one may carry the EXIF orientation);
- a clip without a usable packet index (`read_video_index`: no frame count in the
  header, repeated or missing timestamps, packets an edit list discards), a
  clip larger than ``max_image_pixels`` a frame, or one PyAV cannot open.

Errors that the decode would raise at the header (not an image, a decompression
bomb, an impossible aspect ratio) are raised here the same way, so a sample is
refused for the same reason before or after planning.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from PIL import Image

from zephon_vl.media.image import (
    SWAPS_SIDES,
    ImageSettings,
    exif_orientation,
    open_image,
    target_size,
)
from zephon_vl.media.video import VideoSettings, sample_frame_indices
from zephon_vl.media.video_index import Source, VideoIndex, read_video_index

__all__ = ["ItemGeometry", "grid_for", "image_geometry", "video_geometry", "video_plan"]

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: chunks that, after IDAT, may carry EXIF or XMP (and so an orientation)
_PNG_LATE_META = (b"eXIf", b"iTXt", b"zTXt", b"tEXt")


@dataclass(frozen=True)
class ItemGeometry:
    """One image's or clip's size as the decode will make it (upright, resized) and its
    patch grid; `frames` is the number of frames kept (1 for a still image)."""

    height: int
    width: int
    frames: int
    grid_thw: tuple[int, int, int]

    def grid_array(self) -> np.ndarray:
        """`grid_thw` as `VisionPatches` holds it (int64, shape (3,))."""
        return np.array(self.grid_thw, dtype=np.int64)


def grid_for(frames: int, th: int, tw: int, settings: ImageSettings) -> ItemGeometry:
    """The grid `finish_patches` lays out for `frames` frames resized to (th, tw): padded
    to a multiple of patch x merge under the "patches" rule."""
    if settings.resize == "patches":
        th, tw = th + -th % settings.factor, tw + -tw % settings.factor
    p, tp = settings.patch_size, settings.temporal_patch_size
    return ItemGeometry(th, tw, frames, (max(1, frames // tp), th // p, tw // p))


def _png_meta_after_pixels(data: bytes) -> bool:
    """Whether a PNG has a chunk after its first IDAT that may hold EXIF or XMP; walks the
    chunk headers only (8 bytes each), never the compressed data."""
    pos, seen_idat = len(_PNG_MAGIC), False
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            seen_idat = True
        elif seen_idat and kind in _PNG_LATE_META:
            return True
        elif kind == b"IEND":
            return False
        pos += 12 + length
    return True  # a chunk list that ends early: let the decode tell


def _orientation_from_header(img: Image.Image, data: bytes,
                             settings: ImageSettings) -> int | None:
    """The EXIF orientation `exif_orientation` gives, without decoding; None where only a
    decode can tell (a PNG with EXIF or XMP after its pixels)."""
    if (settings.exif_transpose and img.format == "PNG" and "exif" not in img.info
            and _png_meta_after_pixels(data)):
        return None
    return exif_orientation(img, settings, header_only=True)


def image_geometry(data: bytes, settings: ImageSettings, where: str = "?") -> ItemGeometry | None:
    """The grid `process_image(data, settings, one_frame=True)` gives, from the header;
    None where the header cannot be trusted (see the module docstring). Raises the
    BadSampleError the decode would raise at the header."""
    img = open_image(data, settings, where)
    orientation = _orientation_from_header(img, data, settings)
    if orientation is None:
        return None
    w, h = img.size
    if orientation in SWAPS_SIDES:
        w, h = h, w
    th, tw = target_size(h, w, settings, where)
    return grid_for(1, th, tw, settings)


def video_geometry(data: Source, image: ImageSettings, video: VideoSettings,
                   where: str = "?") -> ItemGeometry | None:
    """The grid `process_video` gives, from the container's index and stream header (no
    frame decoded); None where they cannot be trusted for it (see the module docstring),
    and for any error: the decode then reports it as before."""
    found = video_plan(data, image, video, where)
    return None if found is None else found[0]


def video_plan(data: Source, image: ImageSettings, video: VideoSettings,
               where: str = "?") -> tuple[ItemGeometry, VideoIndex] | None:
    """`video_geometry` and the index it was read from, which the decode then seeks with
    (`process_indexed_video`) instead of reading it again."""
    try:
        index = read_video_index(data)
        if index is None:
            return None
        w, h = index.frame_size
        if w < 1 or h < 1 or w * h > image.max_image_pixels:
            return None
        indices = sample_frame_indices(len(index.pts), index.fps, video,
                                       image.temporal_patch_size)
        th, tw = target_size(h, w, image, where, max_pixels=video.max_pixels_per_frame)
    except Exception:  # noqa: BLE001 - the decode reports what is wrong
        return None
    return grid_for(len(indices), th, tw, image), index
