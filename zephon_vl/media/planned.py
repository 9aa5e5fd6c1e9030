"""Vision items planned from their headers: the grid now, the pixels later.

`plan_image` and `plan_video` give a `PlannedItem` (the encoded bytes, where they
came from, the settings and the grid `header_geometry` read) where the header can
be trusted, and the decoded `VisionPatches` as before where it cannot. A planned
item answers what the tokenizer and the packer ask of an item (`grid_thw`,
`num_tokens`) without pixels; `PlannedItem.decode` makes the same `VisionPatches`
the early decode would have made, bit for bit (the same function on the same
bytes), and refuses a decode whose grid is not the planned one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np
import xxhash

from zephon_core import BadSampleError
from zephon_core.extend import SharedBytes, shared_bytes
from zephon_vl.media.geometry import VisionPatches
from zephon_vl.media.header_geometry import ItemGeometry, image_geometry, video_plan
from zephon_vl.media.image import ImageSettings, finish_patches, process_image
from zephon_vl.media.video import (
    VideoIndex,
    VideoSettings,
    open_video_reference,
    process_indexed_video,
    process_video,
    read_video_reference,
)

__all__ = ["BytesGone", "ClipReference", "PlannedItem", "decoded_rows", "item_pixels",
           "items_for_the_packer", "plan_clip_reference", "plan_image", "plan_video"]


class ClipReference(NamedTuple):
    """A clip a sample names (``json {"video": ...}`` in `VideoSettings.video_folder`):
    a planned item keeps where the clip is, not its bytes, and its decode opens the clip
    again, by range. An open bin holds a name instead of megabytes, and nothing of the
    clip crosses a process boundary before its row is decoded."""

    ref: Any
    folder: str | None
    #: the sample's place, for the error of a clip gone missing before its decode
    sample: str


class BytesGone(Exception):
    """A planned item's bytes, sent by where they lay in shared memory, are no longer
    there (the worker that read them ended): the lane, which holds its own view of them,
    decodes the item instead."""


@dataclass(frozen=True, repr=False)
class PlannedItem:
    """One image or clip whose patch grid is known and whose pixels are not decoded yet."""

    #: the one field that can hold an array: the transport and the backlog walk every
    #: payload, and need not enter an item's settings and geometry (`zephon_core`'s leaf
    #: walk reads this)
    leaf_fields: ClassVar[tuple[str, ...]] = ("data",)
    #: the encoded bytes as a uint8 array: a process pool moves arrays through shared
    #: memory (from the planning worker to the lane: a file a group, reused); to the row
    #: decode, where they lie in that memory (`SharedBytes`) or as `bytes` (`to_send`);
    #: or where a clip named by reference is (`ClipReference`)
    data: np.ndarray | bytes | ClipReference | SharedBytes
    geometry: ItemGeometry
    where: str
    image: ImageSettings
    #: the clip's frame sampling; None for a still image
    video: VideoSettings | None = None
    #: the clip's packet index the plan read: the decode seeks with it rather than read
    #: it again (None for a still image)
    index: VideoIndex | None = None

    @property
    def grid_thw(self) -> np.ndarray:
        return self.geometry.grid_array()

    def num_tokens(self, merge_size: int) -> int:
        """LLM placeholder tokens, as `VisionPatches.num_tokens`."""
        t, h, w = self.geometry.grid_thw
        return t * h * w // (merge_size * merge_size)

    def __repr__(self) -> str:
        """What a sample digest (the ledger's) of an undecoded item hashes: where it came
        from, its grid, and a hash of its encoded bytes, so the digest changes when an
        image's bytes do (and stays short: no bytes in it). A clip named by reference is
        described by its reference (its bytes are not read to plan it)."""
        kind = "clip" if self.video is not None else "image"
        if isinstance(self.data, ClipReference):
            return (f"PlannedItem({kind} {self.where}, reference {self.data.ref!r} in "
                    f"{self.data.folder!r}, {self.geometry})")
        data = self.encoded()
        return (f"PlannedItem({kind} {self.where}, {len(data)} bytes xxh3 "
                f"{xxhash.xxh3_64_hexdigest(data)}, {self.geometry})")

    def encoded(self) -> bytes:
        """The encoded bytes (a clip named by reference: read from where it is; bytes in
        shared memory: read from there, `BytesGone` if they are no longer)."""
        if isinstance(self.data, ClipReference):
            return read_video_reference(*self.data)
        if isinstance(self.data, SharedBytes):
            data = self.data.read()
            if data is None:
                raise BytesGone(f"{self.where}: {self.data.segment} is gone")
            return data
        return self.data if isinstance(self.data, bytes) else self.data.tobytes()

    def with_bytes(self) -> PlannedItem:
        """This item with its bytes as `bytes` (a clip named by reference as it is), to be
        pickled with a row's group: what `to_send` falls back to for bytes the lane does
        not hold in a worker's shared memory."""
        if isinstance(self.data, ClipReference | bytes):
            return self
        return dataclasses.replace(self, data=self.encoded())

    def to_send(self) -> PlannedItem:
        """What a row decode in another process is sent: where the bytes lie in a planning
        worker's shared memory when the lane holds them there (`shared_bytes`: the lane
        keeps the row, so they stay put while the decode reads them), else `with_bytes`."""
        if isinstance(self.data, np.ndarray):
            where = shared_bytes(self.data)
            if where is not None:
                return dataclasses.replace(self, data=where)
        return self.with_bytes()

    def smaller_decoded(self) -> bool:
        """Its decoded pixels take less room than its encoded bytes (a large noisy PNG
        resized down to the model's budget): such an item is cheaper to hold in an open
        bin and to hand over decoded, so the decode after the packer leaves it to the
        tokenizer. A clip named by reference is a name: never."""
        if isinstance(self.data, ClipReference):
            return False
        g = self.geometry
        size = self.data.nbytes if isinstance(self.data, np.ndarray | SharedBytes) \
            else len(self.data)
        return g.frames * g.height * g.width * 3 < size

    def blank(self) -> VisionPatches:
        """The patch rows of a black item of the planned size: every pixel 0 before
        normalization (what the normalization makes of 0), laid out as the decode lays out
        this item (one frame of a still image; the planned frames of a clip). What a sample
        whose bytes fail to decode after its row was planned holds instead
        (`zephon_vl.ops.decode_rows`)."""
        g = self.geometry
        frames = np.zeros((g.frames if self.video is not None else 1, g.height, g.width, 3),
                          dtype=np.uint8)
        patches = finish_patches(frames, self.image, one_frame=self.video is None)
        got = tuple(int(x) for x in patches.grid_thw)
        if got != g.grid_thw:  # a geometry `grid_for` made always lays out to its grid
            raise AssertionError(f"blank of {self.where}: grid {got}, planned {g.grid_thw}")
        return patches

    def decode(self) -> VisionPatches:
        """The patch rows the early decode makes of these bytes. A decode failure raises its
        BadSampleError as before; a grid unlike the planned one raises
        ``planned_size_mismatch`` (the header told another size than the pixels)."""
        if isinstance(self.data, ClipReference):
            assert self.video is not None, "a reference names a clip"
            with open_video_reference(*self.data) as f:
                patches = self._clip_patches(f)
        elif self.video is None:
            patches = process_image(self.encoded(), self.image, self.where, one_frame=True)
        else:
            patches = self._clip_patches(self.encoded())
        got = tuple(int(x) for x in patches.grid_thw)
        if got != self.geometry.grid_thw:
            raise BadSampleError("planned_size_mismatch", self.where,
                                 f"the header gave a patch grid {self.geometry.grid_thw}, the "
                                 f"decoded pixels {got}")
        return patches

    def _clip_patches(self, source: Any) -> VisionPatches:
        assert self.video is not None, "a still image has no clip to decode"
        return process_indexed_video(source, self.image, self.video, self.where, self.index)


def _array(data: bytes) -> np.ndarray:
    """The bytes as a uint8 array that keeps no larger buffer alive: a view of a `bytes`
    object (it is its own buffer; a full-size photo is not copied again), a copy of a
    view into something larger (a memoryview of a shard's block)."""
    view = np.frombuffer(data, dtype=np.uint8)
    return view if type(data) is bytes else view.copy()


def plan_image(data: bytes, image: ImageSettings, where: str) -> PlannedItem | VisionPatches:
    """A still image planned from its header, or decoded now where the header cannot be
    trusted (`header_geometry`). Header faults raise as the decode would."""
    geometry = image_geometry(data, image, where)
    if geometry is None:
        return process_image(data, image, where, one_frame=True)
    return PlannedItem(_array(data), geometry, where, image)


def plan_video(data: bytes, image: ImageSettings, video: VideoSettings,
               where: str) -> PlannedItem | VisionPatches:
    """A clip planned from its container index, or decoded now where that cannot be
    trusted (`header_geometry`)."""
    found = video_plan(data, image, video, where)
    if found is None:
        return process_video(data, image, video, where)
    return PlannedItem(_array(data), found[0], where, image, video, found[1])


def item_pixels(items: list[PlannedItem | VisionPatches], decode: bool = True) -> list[Any]:
    """Each item's patch rows (`VisionPatches.pixel_values`), decoding the planned ones;
    with `decode` False a planned item stays as it is (a sample the packer will refuse
    for its length is never decoded)."""
    return [(v.decode().pixel_values if decode else v) if isinstance(v, PlannedItem)
            else v.pixel_values for v in items]


def items_for_the_packer(items: list[PlannedItem | VisionPatches]) -> list[Any]:
    """A payload's ``pixel_values`` when the decode follows the packer: each item in the
    smaller of its two forms, planned (its encoded bytes or its name) or decoded
    (`PlannedItem.smaller_decoded`). Which form depends on the item alone, so the rows are
    the same at every D, runner and resume."""
    return [(v.decode().pixel_values if v.smaller_decoded() else v)
            if isinstance(v, PlannedItem) else v.pixel_values for v in items]


def decoded_rows(rows: list[np.ndarray | PlannedItem]) -> list[np.ndarray]:
    """A payload's ``pixel_values`` with any item still planned decoded (the collate's
    fallback for a combiner that took a sample the tokenizer judged too long)."""
    return [v.decode().pixel_values if isinstance(v, PlannedItem) else v for v in rows]


def plan_clip_reference(ref: Any, image: ImageSettings, video: VideoSettings, sample: str,
                        where: str) -> PlannedItem | VisionPatches:
    """A clip a sample names in `VideoSettings.video_folder`, planned from its index read
    by range, or decoded now where that cannot be trusted (as `plan_video`)."""
    with open_video_reference(ref, video.video_folder, sample) as f:
        found = video_plan(f, image, video, where)
        if found is None:
            return process_video(f, image, video, where)
    return PlannedItem(ClipReference(ref, video.video_folder, sample), found[0], where, image,
                       video, found[1])
