"""Issue 25 item 1: seek-based video decoding keeps today's frames, pixel for pixel.

Every strategy (`VideoSettings.decode`) and decoder thread count must give
the frames of a plain sequential decode, written out here independently of
`zephon_vl.media.video`: decode every frame in order, keep those that
`sample_frame_indices` names (from the header's frame count), resize each to
the first frame's target. Clips of many lengths, GOPs, B-frame depths,
variable frame rate and rotation metadata are made with PyAV.
"""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_core import BadSampleError, ConfigError
from zephon_vl import ImageSettings, VideoSettings, process_video
from zephon_vl.media.image import resize_rgb, target_size
from zephon_vl.media.video import (
    decode_frames,
    decode_plan,
    read_video_index,
    sample_frame_indices,
)
from zephon_vl.testing.video import encode_test_video

IMAGE = ImageSettings()


def clip(n: int, *, seed: int = 0, h: int = 48, w: int = 64, fps: int = 30, **kw) -> bytes:
    """n frames that all differ (noise rolled sideways, a frame-number bar)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    frames = []
    for i in range(n):
        f = np.roll(base, 3 * i, axis=1)
        f[: h // 4, : (i % w) + 1] = 255
        frames.append(f)
    return encode_test_video(frames, fps, crf=18, **kw)


def reference_frames(data: bytes, vs: VideoSettings) -> np.ndarray:
    """Today's sequential decode, restated (headers with a true frame count)."""
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        n = stream.frames
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        indices = sample_frame_indices(n, float(rate) if rate else None, vs,
                                       IMAGE.temporal_patch_size)
        wanted = set(indices)
        got: dict[int, np.ndarray] = {}
        th = tw = 0
        for k, frame in enumerate(c.decode(stream)):
            if k == 0:
                th, tw = target_size(frame.height, frame.width, IMAGE, "ref",
                                     max_pixels=vs.max_pixels_per_frame)
            if k in wanted:
                got[k] = resize_rgb(frame.to_image(), th, tw, IMAGE)
            if k == indices[-1]:
                break
    return np.stack([got[k] for k in indices])


def two_tracks(data: bytes) -> bytes:
    """The clip's packets in an MP4 with two video tracks (copies): its sample table is
    not read (which track FFmpeg calls video 0 is FFmpeg's to say), so the seek path
    indexes it with a demux pass."""
    out = io.BytesIO()
    with av.open(io.BytesIO(data)) as src, av.open(out, mode="w", format="mp4") as dst:
        ins = src.streams.video[0]
        outs = [dst.add_stream_from_template(ins) for _ in range(2)]
        for packet in src.demux(ins):
            if packet.size:
                for o in outs:
                    packet.stream = o
                    dst.mux(packet)
    return out.getvalue()


class CountingFile(io.BytesIO):
    """A file object that counts the bytes read from it (a remote range reader's cost)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, n: int | None = -1) -> bytes:
        out = super().read(n)
        self.bytes_read += len(out)
        return out

    def readinto(self, b) -> int:
        n = super().readinto(b)
        self.bytes_read += n
        return n


def vfr(n: int) -> list[int]:
    """Irregular presentation times: gaps of 20-70 ms."""
    return list(np.cumsum([0] + [20 + (17 * i) % 51 for i in range(n - 1)]))


CLIPS = {
    "1 frame": dict(n=1),
    "2 frames": dict(n=2),
    "7 frames gop 3": dict(n=7, gop=3),
    "61 x264 defaults": dict(n=61),
    "90 all keyframes": dict(n=90, gop=1),
    "150 gop 30 no B": dict(n=150, gop=30, bframes=0),
    "150 gop 30 B3": dict(n=150, gop=30, bframes=3),
    "240 gop 60 B2": dict(n=240, gop=60, bframes=2),
    "200 gop 7 B2": dict(n=200, gop=7, bframes=2),
    "180 gop 20 vfr": dict(n=180, gop=20, pts_ms=vfr(180)),
    "180 gop 20 B2 vfr": dict(n=180, gop=20, bframes=2, pts_ms=vfr(180)),
    "120 gop 10 rotated 90": dict(n=120, gop=10, rotation=90),
    "120 gop 12 rotated -90 B1": dict(n=120, gop=12, bframes=1, rotation=-90),
    "150 gop 25 faststart": dict(n=150, gop=25, faststart=True),
}


@pytest.fixture(scope="module")
def clips() -> dict[str, bytes]:
    out = {}
    for i, (name, spec) in enumerate(CLIPS.items()):
        spec = dict(spec)
        out[name] = clip(spec.pop("n"), seed=i, **spec)
    return out


SETTINGS = [VideoSettings(), VideoSettings(max_frames=4), VideoSettings(fps=0.5, max_frames=64),
            VideoSettings(fps=30.0, max_frames=64)]


@pytest.mark.parametrize("name", list(CLIPS))
def test_every_strategy_keeps_todays_frames(clips, name):
    data = clips[name]
    for vs in SETTINGS:
        want = reference_frames(data, vs)
        for decode in ("sequential", "seek", "auto"):
            got, how = decode_frames(data, IMAGE, VideoSettings(**{**vs.__dict__,
                                                                   "decode": decode}))
            assert np.array_equal(got, want), (name, vs, decode, how)
            if decode == "seek":  # the seek path really ran: no fallback on these clips
                assert how.startswith("seek (mp4 index): "), (name, vs, how)
            if decode == "sequential":
                assert how == "sequential"


def test_open_gops_and_b_pyramids_keep_todays_frames():
    """x264 open GOPs (B-frames across a GOP boundary), a B-pyramid, scene cuts."""
    rng = np.random.default_rng(4)
    base = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        s = c.add_stream("libx264", rate=30, options={
            "crf": "18", "preset": "medium",
            "x264-params": "mbtree=0:keyint=20:min-keyint=5:bframes=3:open-gop=1:"
                           "b-pyramid=normal"})
        s.codec_context.thread_count = 1
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        for i in range(300):
            f = np.roll(base, 3 * i, axis=1)
            f[:12, :(i % 64) + 1] = 255
            if i % 37 == 0:
                f = 255 - f  # a scene cut
            for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    data = buf.getvalue()
    for vs in SETTINGS:
        want = reference_frames(data, vs)
        for decode in ("seek", "auto"):
            got, how = decode_frames(data, IMAGE, VideoSettings(**{**vs.__dict__,
                                                                   "decode": decode}))
            assert np.array_equal(got, want), (vs, decode, how)


@pytest.mark.parametrize("name", [n for n in CLIPS if CLIPS[n]["n"] > 2])
def test_the_sample_table_agrees_with_the_demuxed_packets(clips, name):
    """The MP4 index (decode times + ctts, no packet read) is the demux pass's."""
    table = read_video_index(clips[name])
    packets = read_video_index(two_tracks(clips[name]))
    assert table is not None and table.source == "mp4 index"
    assert packets is not None and packets.source == "packet index"
    shift = packets.pts[0] - table.pts[0]
    assert [p - shift for p in packets.pts] == table.pts
    assert (packets.pos, packets.keys) == (table.pos, table.keys)
    segments, cost, sequential = decode_plan(table, [0, len(table.pts) - 1])
    assert segments[0][0] == 0 and segments[-1][1][-1] == len(table.pts) - 1
    assert all(key in table.keys for key, _ in segments)
    assert cost <= sequential + 4 * len(segments)


def test_decoder_threads_do_not_change_pixels(clips):
    data = clips["240 gop 60 B2"]
    vs = VideoSettings(fps=30.0, max_frames=64)
    want = reference_frames(data, vs)
    for threads in (1, 2, 4):
        for decode in ("sequential", "seek"):
            got, _ = decode_frames(data, IMAGE, VideoSettings(fps=30.0, max_frames=64,
                                                              decode=decode,
                                                              decoder_threads=threads))
            assert np.array_equal(got, want), (threads, decode)


def test_auto_is_a_function_of_the_index_and_settings(clips):
    long = clip(900, gop=60, seed=5)  # 30 s at 30 fps, 16 frames of 900: sparse
    hows = {decode_frames(long, IMAGE, VideoSettings())[1] for _ in range(3)}
    assert len(hows) == 1 and hows.pop().startswith("seek (mp4 index): "), hows
    dense = decode_frames(clips["90 all keyframes"], IMAGE, VideoSettings(fps=30.0,
                                                                          max_frames=64))[1]
    assert dense.startswith("sequential: dense"), dense


def test_a_file_object_reads_like_bytes(clips):
    data = clips["150 gop 25 faststart"]
    vs = VideoSettings(max_frames=6)
    a = process_video(data, IMAGE, vs)
    b = process_video(io.BytesIO(data), IMAGE, vs)
    assert np.array_equal(a.pixel_values, b.pixel_values)
    assert np.array_equal(a.grid_thw, b.grid_thw)


@pytest.mark.parametrize("faststart", [True, False])
def test_a_long_clip_read_by_range_costs_its_index_and_kept_gops(faststart):
    """16 frames of 1,800 (60 s at 30 fps, a keyframe every 30): the seek path reads
    the sample table and the GOPs of kept frames, a fraction of the file, wherever
    the moov sits; the frames are today's."""
    data = clip(1800, gop=30, seed=9, faststart=faststart)
    f = CountingFile(data)
    got, how = decode_frames(f, IMAGE, VideoSettings())
    assert how.startswith("seek (mp4 index): "), how
    assert np.array_equal(got, reference_frames(data, VideoSettings()))
    assert f.bytes_read < 0.45 * len(data), (f.bytes_read, len(data))
    seq = CountingFile(data)
    decode_frames(seq, IMAGE, VideoSettings(decode="sequential"))
    assert seq.bytes_read > 0.9 * len(data)


def test_a_container_without_a_frame_count_is_decoded_as_today(clips):
    """Matroska has no frame count in its header: today's path counts by decoding, and
    a demux count could differ from it where a decoder drops a frame; so no seek."""
    out = io.BytesIO()
    with av.open(io.BytesIO(clips["150 gop 30 B3"])) as src, \
            av.open(out, mode="w", format="matroska") as dst:
        ins = src.streams.video[0]
        o = dst.add_stream_from_template(ins)
        for packet in src.demux(ins):
            if packet.size:
                packet.stream = o
                dst.mux(packet)
    mkv = out.getvalue()
    seq, _ = decode_frames(mkv, IMAGE, VideoSettings(decode="sequential"))
    got, how = decode_frames(mkv, IMAGE, VideoSettings(decode="seek"))
    assert how == "sequential: no usable packet index", how
    assert np.array_equal(got, seq)


def test_damaged_clips_are_refused_by_every_strategy(clips):
    data = clips["240 gop 60 B2"]
    for bad in (data[: len(data) // 3], b"\x00" * 500, data[:40]):
        errors = set()
        for decode in ("sequential", "seek", "auto"):
            with pytest.raises(BadSampleError) as info:
                process_video(bad, IMAGE, VideoSettings(decode=decode), "s.mp4")
            errors.add(str(info.value))
        assert len(errors) == 1, errors


def test_decode_settings_are_checked_and_stay_out_of_the_fingerprint():
    with pytest.raises(ConfigError, match="decode"):
        VideoSettings(decode="fast")
    with pytest.raises(ConfigError, match="decoder_threads"):
        VideoSettings(decoder_threads=0)
    base = VideoSettings().settings()
    assert VideoSettings(decode="seek", decoder_threads=4).settings() == base
    assert "decode" not in base and "decoder_threads" not in base


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 160), gop=st.integers(1, 40), bframes=st.integers(0, 3),
       max_frames=st.integers(1, 20), fps=st.sampled_from([0.5, 2.0, 7.0]),
       seed=st.integers(0, 3))
def test_seek_equals_sequential_property(n, gop, bframes, max_frames, fps, seed):
    data = clip(n, gop=gop, bframes=bframes, seed=seed, h=32, w=48)
    vs = VideoSettings(fps=fps, max_frames=max_frames, min_frames=1)
    want = reference_frames(data, vs)
    got, how = decode_frames(data, IMAGE, VideoSettings(fps=fps, max_frames=max_frames,
                                                        min_frames=1, decode="seek"))
    assert how.startswith("seek (mp4 index): "), how
    assert np.array_equal(got, want)
    got, how = decode_frames(two_tracks(data), IMAGE, VideoSettings(fps=fps, max_frames=max_frames,
                                                       min_frames=1, decode="seek"))
    assert how.startswith("seek (packet index): "), how
    assert np.array_equal(got, want)
    auto, _ = decode_frames(data, IMAGE, vs)
    assert np.array_equal(auto, want)
