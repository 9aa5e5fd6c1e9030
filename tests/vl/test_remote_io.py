"""Remote reads under `Execution`: retry settings, coalesced range requests, a storage
backend that hangs, `zephon-vl index --refresh`, and gs:// through gcsfs.

The HTTP server (zephon_vl.testing.storage_servers) serves the vlm-demo shards on 127.0.0.1
with Range support, counts ranged GETs and can hang (accept a request, never answer).
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import tarfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers.vl import (
    FAST,
    LEAN,
    LEAN_FAST,
    STEPS,
    demo_shards,
    digests,
    make_recipe,
    reference,
)
from zephon_core import (
    Coalesce,
    ConfigError,
    Execution,
    Loader,
    RetryPolicy,
    StorageError,
    ZephonError,
    batch_digest,
)
from zephon_core.extend import open_shard
from zephon_vl.testing.storage_servers import http_server

pytest.importorskip("aiohttp")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    local = demo_shards(tmp_path_factory)
    with http_server(Path(local[0]).parent) as server:
        yield server, [f"{server.url}/{Path(p).name}" for p in local]


def test_storage_settings_change_no_digest_and_stay_out_of_checkpoints(
        served, tmp_path_factory) -> None:
    _, urls = served
    want = reference(tmp_path_factory).digests
    other = replace(LEAN, retry=RetryPolicy(deadline=7.0, initial=0.05, maximum=0.5,
                                            request_timeout=9.0),
                    coalesce=Coalesce(max_bytes=0))
    assert digests(urls, 1, LEAN_FAST) == want
    assert digests(urls, 1, other) == want
    with Loader(make_recipe(urls), 0, 1, LEAN_FAST) as first:
        next(first)
        state = first.state_dict()
    with Loader(make_recipe(urls), 0, 1, other) as resumed:  # the state carries no retry
        assert resumed.fingerprint == state["fingerprint"]
        resumed.load_state_dict(state)
        assert [batch_digest(next(resumed)) for _ in range(STEPS - 1)] == want[1:]


def test_a_recipe_file_refuses_retry_settings(tmp_path) -> None:
    from zephon_core import load_recipe

    toml = tmp_path / "r.toml"
    toml.write_text('kind = "vlm"\n[retry]\ndeadline = 5\n[[datasets]]\nname = "d"\n'
                    'files = ["a.tar"]\n')
    with pytest.raises(ConfigError, match="execution setting.*--retry-deadline"):
        load_recipe(str(toml))


@pytest.mark.parametrize("runner", ["inline", "processes"])
def test_the_retry_deadline_comes_from_execution(served, runner) -> None:
    """A backend that stops answering: each request times out after the Execution's
    request_timeout, is retried, and after its deadline a StorageError names shard and
    offset, in the driver and in a worker process alike (default deadline: 120 s)."""
    server, urls = served
    retry = RetryPolicy(deadline=1.5, initial=0.1, maximum=0.5, request_timeout=0.5)
    ex = Execution(runner=runner, default_workers=1, group_size=2, prefetch_steps=0,
                   retry=retry)
    with Loader(make_recipe(urls), 0, 1, ex) as loader:
        next(loader)
        server.hang.set()
        try:
            t0 = time.monotonic()
            with pytest.raises(StorageError) as info:
                for _ in range(STEPS):
                    next(loader)
            waited = time.monotonic() - t0
        finally:
            server.hang.clear()
    msg = str(info.value)
    assert "deadline 1.5 s" in msg and "offset" in msg and "/demo-" in msg, msg
    assert 1.5 <= waited < 60


def sample_spans(shard: str) -> list[tuple[int, int]]:
    """Each sample's byte span in a tar shard (its members' data, first to last), read
    with the standard library's tarfile: what one range request for the sample covers."""
    spans: dict[str, tuple[int, int]] = {}
    with tarfile.open(shard) as tar:
        for m in tar:
            if m.isfile():
                key = m.name.split(".", 1)[0]
                lo, hi = spans.get(key, (m.offset_data, 0))
                spans[key] = (min(lo, m.offset_data), max(hi, m.offset_data + m.size))
    return sorted(spans.values())


def samples_per_request(server, before: int, local: list[str]) -> list[int]:
    """How many whole samples each ranged GET since `before` fetched."""
    spans = {f"/{Path(p).name}": sample_spans(p) for p in local}
    return [sum(a <= lo and hi <= b for lo, hi in spans[path])
            for path, a, b in server.ranges[before:]]


def test_neighbouring_samples_share_one_range_request(served, tmp_path_factory) -> None:
    """How many samples a step reads depends on how the lanes group them (timing), so
    each run is judged by what its own requests fetched, never by another run's count."""
    server, urls = served
    local = demo_shards(tmp_path_factory)
    want = reference(tmp_path_factory).digests
    make_recipe(urls).fingerprint()  # index every shard first: only sample reads are counted
    per_request = {}
    bounds = {"per sample": Coalesce(max_bytes=0), "coalesced": Coalesce(),
              "bounded in bytes": Coalesce(max_bytes=4096, max_gap=0)}
    for name, coalesce in bounds.items():
        ex = Execution(runner="inline", group_size=8, prefetch_steps=0, retry=FAST,
                       coalesce=coalesce)
        before = len(server.ranges)
        assert digests(urls, 1, ex) == want
        per_request[name] = samples_per_request(server, before, local)
    print({k: (len(v), sum(v)) for k, v in per_request.items()})
    assert set(per_request["per sample"]) == {1}
    assert set(per_request["bounded in bytes"]) == {1}  # demo samples exceed 4 KiB
    coalesced = per_request["coalesced"]
    assert min(coalesced) >= 1 and len(coalesced) < 0.8 * sum(coalesced), coalesced
    # runs read within a few % of the same samples; merging halves the requests
    assert len(coalesced) < 0.8 * len(per_request["per sample"])


@pytest.mark.slow
def test_a_worker_stuck_in_io_is_replaced_and_its_group_rerun(served, tmp_path_factory,
                                                              caplog) -> None:
    """The backend hangs (requests accepted, never answered) for longer than the group
    timeout and shorter than the request timeout: the stuck worker is killed, a fresh one
    re-runs its group once storage answers again, and the batches are the same."""
    server, urls = served
    want = reference(tmp_path_factory).digests
    ex = Execution(runner="processes", default_workers=1, group_size=2, prefetch_steps=0,
                   group_timeout=2.0, retry=RetryPolicy(deadline=60.0, request_timeout=60.0))
    got = []
    with caplog.at_level(logging.WARNING, "zephon_core.engine.runners"):
        with Loader(make_recipe(urls), 0, 1, ex) as loader:
            got.append(batch_digest(next(loader)))
            server.hang.set()
            server.hung.clear()

            def recover() -> None:
                server.hung.wait(30)
                time.sleep(3.0)  # past group_timeout: the worker is killed meanwhile
                server.hang.clear()

            thread = threading.Thread(target=recover)
            thread.start()
            try:
                got += [batch_digest(next(loader)) for _ in range(STEPS - 1)]
            finally:
                server.hang.clear()
                thread.join()
    assert got == want
    assert "ran past group_timeout" in caplog.text


def test_index_refresh_reindexes_changed_shards_on_request(tmp_path_factory, tmp_path,
                                                           capsys) -> None:
    from zephon_vl.cli.main import main

    local = demo_shards(tmp_path_factory)
    shards = [shutil.copy(p, tmp_path / Path(p).name) for p in local[:2]]
    manifest = tmp_path / "train.json"
    assert main(["index", *map(str, shards), "--out", str(manifest)]) == 0
    before = make_recipe(str(manifest)).fingerprint()
    Path(shards[1]).write_bytes(Path(local[2]).read_bytes())  # other bytes, other size
    with pytest.raises(ZephonError) as info:
        make_recipe(str(manifest)).datasets[0].reader.read(1, 0)
    assert Path(shards[1]).name in str(info.value) and "size" in str(info.value)
    assert "--refresh" in str(info.value)
    capsys.readouterr()
    assert main(["index", "--refresh", str(manifest)]) == 0
    out = capsys.readouterr().out
    assert f"re-indexed {Path(shards[1]).name}: size" in out and Path(shards[0]).name not in out
    assert "1 changed shard(s)" in out
    reader = make_recipe(str(manifest)).datasets[0].reader
    assert reader.read(1, 0)["__key__"]
    assert make_recipe(str(manifest)).fingerprint() != before  # old checkpoints are refused
    assert main(["index", "--refresh", str(manifest)]) == 0
    assert "0 changed shard(s) re-indexed, nothing rewritten" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None,
                    reason="gcsfs is installed: the error for its absence cannot show")
def test_gs_urls_need_gcsfs_and_say_so() -> None:
    pytest.importorskip("fsspec")
    with pytest.raises(ConfigError) as info:
        open_shard("gs://bucket/train/shard-000000.tar")
    assert "gcsfs" in str(info.value) and "shard-000000.tar" in str(info.value)


def test_reads_share_one_outage_clock_per_endpoint() -> None:
    """With many reads in flight, storage that is down stops the run one deadline after it
    went away, not one deadline per read; an outage nobody retried for a while is over."""
    from zephon_vl.testing.storage_servers import free_port

    url = f"http://127.0.0.1:{free_port()}/demo-000000.tar"  # nothing listens: refused
    retry = RetryPolicy(deadline=0.6, initial=0.05, maximum=0.05, request_timeout=0.5)

    def seconds_to_fail() -> float:
        t0 = time.monotonic()
        with pytest.raises(StorageError, match="deadline 0.6 s"):
            open_shard(url, retry)
        return time.monotonic() - t0

    assert seconds_to_fail() >= 0.6
    assert seconds_to_fail() < 0.3  # the same outage: no second deadline
    time.sleep(retry.maximum + retry.request_timeout + 1.1)
    assert seconds_to_fail() >= 0.6  # a new outage gets its own deadline


def test_the_outage_clock_starts_when_the_unanswered_request_was_sent(served) -> None:
    """A backend that hangs: the deadline counts from when a failing try was sent, not from
    when its failure came back. fsspec's HTTP ``info`` sends HEAD then GET, so one try of
    `open_shard` takes two request timeouts (4 s here), more than the gap after which a
    failure counted as a new outage (3.1 s): counted from the failures, no outage ever
    reached the deadline and the read retried forever. gcsfs is the same, worse: it tries
    each request six times over ~31 s before zephon sees the failure."""
    server, urls = served
    retry = RetryPolicy(deadline=2.0, initial=0.1, maximum=0.1, request_timeout=2.0)
    open_shard(urls[0], retry)  # answers: no outage on record for this endpoint
    raised: list[BaseException] = []

    def read() -> None:
        try:
            open_shard(urls[0], retry)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            raised.append(e)

    reader = threading.Thread(target=read, daemon=True)
    server.hang.set()
    try:
        t0 = time.monotonic()
        reader.start()
        reader.join(15)
        waited = time.monotonic() - t0
    finally:
        server.hang.clear()
    assert raised, f"still retrying after {waited:.0f} s (deadline 2 s)"
    assert isinstance(raised[0], StorageError) and "deadline 2.0 s" in str(raised[0])
    assert 2.0 <= waited < 10, waited


def test_an_http_server_that_is_down_is_not_a_missing_shard(served) -> None:
    """fsspec reports any failed HTTP ``info`` as FileNotFoundError; a refused connection
    must stay an I/O failure (retried, then StorageError), never ``missing_shard``, which
    ``on_error="drop"`` would turn into a drop. A real 404 is ``missing_shard``."""
    from zephon_core import BadSampleError
    from zephon_vl.testing.storage_servers import free_port

    retry = RetryPolicy(deadline=0.3, initial=0.05, maximum=0.05, request_timeout=0.5)
    with pytest.raises(StorageError, match="deadline 0.3 s"):
        open_shard(f"http://127.0.0.1:{free_port()}/demo-000000.tar", retry)
    server, _ = served
    with pytest.raises(BadSampleError) as info:
        open_shard(f"{server.url}/no-such-shard.tar", retry)
    assert info.value.reason == "missing_shard"


@pytest.fixture(scope="module")
def small_served(tmp_path_factory):
    from tests.vl.test_wds_index import make_samples
    from zephon_vl.wds.writer import write_shards

    root = tmp_path_factory.mktemp("small-shards")
    shards = write_shards(make_samples(60), root, samples_per_shard=20)
    with http_server(root) as server:
        yield server, [str(p) for p in shards], [f"{server.url}/{p.name}" for p in shards]


def test_read_many_equals_read_for_any_group_and_bounds(small_served) -> None:
    """Whatever the group (order, repeats, shards mixed) and the coalescing bounds, each
    sample's bytes from a remote `read_many` are those of a local `read`; requests never
    exceed one per sample."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from zephon_core.extend import storage_settings
    from zephon_vl import WebDatasetReader

    server, local, urls = small_served
    plain, remote = WebDatasetReader(local), WebDatasetReader(urls)
    assert remote.shard_lengths() == [20, 20, 20]  # indexed now: only sample reads count below
    pointer = st.tuples(st.integers(0, 2), st.integers(0, 19))

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(pointer, min_size=1, max_size=12), st.integers(0, 40_000),
           st.integers(0, 20_000))
    def check(pointers, max_bytes, max_gap) -> None:
        settings_ = replace(LEAN, coalesce=Coalesce(max_bytes, max_gap)).storage()
        before = server.range_gets
        with storage_settings(settings_):
            got = remote.read_many(pointers)
        assert got == [plain.read(s, i) for s, i in pointers]
        assert server.range_gets - before <= len(pointers)

    check()
