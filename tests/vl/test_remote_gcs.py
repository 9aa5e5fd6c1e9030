"""Shards on gs:// through gcsfs, against a GCS emulator on 127.0.0.1.

gcsfs finds the emulator through its standard configuration only
(``STORAGE_EMULATOR_HOST``, anonymous credentials from fsspec's ``FSSPEC_GCS_*``
configuration; see zephon_vl.testing.storage_servers): nothing in zephon knows it is a test.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers.vl import (
    FAST,
    LEAN_FAST,
    STEPS,
    demo_shards,
    digests,
    make_recipe,
    reference,
)
from zephon_core import (
    BadSampleError,
    Execution,
    Loader,
    RetryPolicy,
    StorageError,
    ZephonError,
    batch_digest,
)
from zephon_core.extend import open_shard
from zephon_vl import build_manifest, load_manifest
from zephon_vl.testing.storage_servers import GCS_ENV, gcs_server, s3_server

pytest.importorskip("gcsfs")
pytest.importorskip("gcp_storage_emulator")


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    local = demo_shards(tmp_path_factory)
    with gcs_server() as server:
        yield server, server.upload("zephon-test", local)


def test_gs_shards_give_the_local_digests(gcs, tmp_path_factory) -> None:
    _, urls = gcs
    want = reference(tmp_path_factory).digests
    assert all(u.startswith("gs://zephon-test/data/demo-") for u in urls)
    assert digests(urls, 1, LEAN_FAST) == want
    assert digests(urls, 2, replace(LEAN_FAST, runner="threads", group_size=3)) == want


def test_gs_shards_in_worker_processes(gcs, tmp_path_factory) -> None:
    """Worker processes open their own gcsfs client from the same configuration."""
    _, urls = gcs
    procs = Execution(runner="processes", default_workers=2, group_size=4, prefetch_steps=0,
                      retry=FAST)
    assert digests(urls, 2, procs) == reference(tmp_path_factory).digests


def test_manifest_over_gs_urls(gcs, tmp_path, tmp_path_factory) -> None:
    _, urls = gcs
    manifest = tmp_path / "train.json"
    entries = build_manifest(urls, manifest)
    assert [e.url for e in entries] == urls
    assert all(e.identity.startswith("etag:") for e in entries)
    assert [e.url for e in load_manifest(manifest)] == urls
    local = make_recipe(demo_shards(tmp_path_factory))
    with Loader(make_recipe(str(manifest)), 0, 2, LEAN_FAST) as loader:
        assert loader.fingerprint["datasets"] == local.fingerprint()["datasets"]
    assert digests(str(manifest), 1, LEAN_FAST) == reference(tmp_path_factory).digests


def test_changed_gs_object_is_refused_naming_shard_and_field(gcs, tmp_path,
                                                            tmp_path_factory) -> None:
    server, urls = gcs
    manifest = tmp_path / "m.json"
    build_manifest(urls[:1], manifest)
    name = urls[0].rsplit("/", 1)[1]
    original = open(demo_shards(tmp_path_factory)[0], "rb").read()
    server.put(urls[0], b"not the indexed shard")
    try:
        with pytest.raises(ZephonError) as info:
            make_recipe(str(manifest)).datasets[0].reader.read(0, 0)
    finally:
        server.put(urls[0], original)
    assert name in str(info.value) and "size" in str(info.value)


def test_gcs_restarted_within_the_deadline_gives_the_same_digests(gcs, tmp_path_factory,
                                                                   caplog) -> None:
    """Reads while the emulator is down are retried (by gcsfs's own loop first, then
    zephon's) and the batches are those of the uninterrupted run."""
    server, urls = gcs
    want = reference(tmp_path_factory).digests
    got = []
    caplog.set_level(logging.WARNING, "zephon_core.data.remote")
    caplog.set_level(logging.DEBUG, "gcsfs")  # last: it also sets the capture's level
    with Loader(make_recipe(urls), 0, 1, LEAN_FAST) as loader:
        got.append(batch_digest(next(loader)))
        server.stop()
        restart = threading.Timer(1.5, server.start)
        restart.start()
        try:
            got.extend(batch_digest(next(loader)) for _ in range(STEPS - 1))
        finally:
            restart.join()
    assert got == want
    assert "retrying" in caplog.text  # the server was down while the loader read


def test_a_missing_gs_object_is_the_same_error_as_on_s3(gcs) -> None:
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    errors = {}
    with s3_server() as s3:
        s3.upload("zephon-test", [])
        for scheme in ("gs", "s3"):
            with pytest.raises(BadSampleError) as info:
                open_shard(f"{scheme}://zephon-test/data/no-such-shard.tar", FAST)
            errors[scheme] = info.value
    assert errors["gs"].reason == errors["s3"].reason == "missing_shard"
    assert str(errors["gs"]) == str(errors["s3"]).replace("s3://", "gs://")
    assert "no-such-shard.tar" in str(errors["gs"])


@contextmanager
def refusing_endpoint(status: int) -> Iterator[str]:
    """A GCS endpoint that answers every request with `status` and a JSON API error."""

    class Refuse(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"error": {"code": status, "message": "refused"}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_stop_at_once(gcs, monkeypatch, status: int) -> None:
    """gcsfs reports 403 as a plain OSError and 401 as its HttpError: no retry can fix
    either, so the run stops at once with the URL, not after the retry deadline."""
    url = "gs://zephon-test/data/demo-000000.tar"
    with refusing_endpoint(status) as endpoint:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        t0 = time.monotonic()
        with pytest.raises(StorageError) as info:
            open_shard(url, RetryPolicy(deadline=20.0, initial=0.1, maximum=0.5))
        assert time.monotonic() - t0 < 10
    msg = str(info.value)
    assert url in msg and "credentials" in msg and "deadline" not in msg


def test_a_gs_request_that_gets_no_answer_times_out(tmp_path) -> None:
    """`RetryPolicy.request_timeout` reaches gcsfs: against an endpoint that accepts
    connections and never answers, the next try comes within seconds (gcsfs's own wait
    is 5 minutes). Runs in a child process, which is killed once the second try arrives."""
    listener = socket.create_server(("127.0.0.1", 0))
    tries: list[socket.socket] = []
    second = threading.Event()

    def accept() -> None:
        while not second.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            tries.append(conn)
            if len(tries) >= 2:
                second.set()

    threading.Thread(target=accept, daemon=True).start()
    code = ("from zephon_core import RetryPolicy, open_shard\n"
            "open_shard('gs://zephon-test/data/demo-000000.tar', "
            "RetryPolicy(deadline=60.0, request_timeout=0.5))\n")
    env = {**os.environ, **GCS_ENV,
           "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{listener.getsockname()[1]}"}
    child = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert second.wait(20), f"one try in 20 s: {len(tries)} connection(s)"
    finally:
        child.kill()
        child.wait()
        listener.close()
        for conn in tries:
            conn.close()
