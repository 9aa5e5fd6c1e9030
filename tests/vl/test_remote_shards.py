"""Shards on a real S3-compatible server (moto, on 127.0.0.1) and an HTTP server with Range.

Clients find the servers through the standard configuration only
(``AWS_ENDPOINT_URL``, dummy ``AWS_*`` credentials; see zephon_vl.testing.storage_servers).
"""

from __future__ import annotations

import json
import logging
import threading
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
    Execution,
    Loader,
    RetryPolicy,
    StorageError,
    ZephonError,
    batch_digest,
    recipe_from_toml,
)
from zephon_vl import build_manifest, load_manifest
from zephon_vl.testing.storage_servers import http_server, s3_server

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    local = demo_shards(tmp_path_factory)
    with s3_server() as server:
        urls = server.upload("zephon-test", local)
        yield server, urls


@pytest.mark.slow
def test_s3_shards_give_the_local_digests(s3, tmp_path_factory) -> None:
    _, urls = s3
    want = reference(tmp_path_factory).digests
    assert digests(urls, 1, LEAN_FAST) == want
    assert digests(urls, 2, Execution(runner="threads", group_size=3, retry=FAST)) == want
    procs = Execution(runner="auto", default_workers=2, group_size=4, prefetch_steps=0,
                      retry=FAST)
    assert digests(urls, 2, procs) == want


def test_manifest_build_reads_only_the_manifest(s3, tmp_path, tmp_path_factory) -> None:
    server, urls = s3
    manifest = tmp_path / "train.json"
    entries = build_manifest(urls, manifest)
    assert [e.url for e in entries] == urls and all(e.identity.startswith("etag:") for e in entries)
    assert json.dumps(json.loads(manifest.read_text())).count("testing") == 0  # no credentials
    server.stop()
    try:  # storage down: a Loader over the manifest still builds (it reads one local file);
        # with no retries, any request to the stopped server would fail the build
        no_retry = replace(LEAN_FAST, retry=RetryPolicy(deadline=0.0, request_timeout=2.0))
        loader = Loader(make_recipe(str(manifest)), 0, 2, no_retry)
        local = make_recipe(demo_shards(tmp_path_factory))
        assert loader.fingerprint["datasets"] == local.fingerprint()["datasets"]
        loader.close()
    finally:
        server.start()
    assert digests(str(manifest), 1, LEAN_FAST) == reference(tmp_path_factory).digests


def test_changed_object_is_refused_naming_shard_and_field(s3, tmp_path,
                                                         tmp_path_factory) -> None:
    server, urls = s3
    manifest = tmp_path / "m.json"
    build_manifest(urls[:1], manifest)
    entry = load_manifest(manifest)[0]
    original = Path(entry.url).name
    recipe = make_recipe(str(manifest))
    reader = recipe.datasets[0].reader
    assert reader.read(0, 0)["__shard__"] == original
    server.put(urls[0], b"not the indexed shard")
    fresh = make_recipe(str(manifest)).datasets[0].reader
    with pytest.raises(ZephonError) as info:
        fresh.read(0, 0)
    assert original in str(info.value) and "size" in str(info.value)
    server.put(urls[0], Path(demo_shards(tmp_path_factory)[0]).read_bytes())  # restore


def test_server_restarted_within_the_deadline_gives_the_same_digests(s3, tmp_path_factory,
                                                                      caplog) -> None:
    server, urls = s3
    want = reference(tmp_path_factory).digests
    got = []
    with caplog.at_level(logging.WARNING, "zephon_core.data.remote"):
        with Loader(make_recipe(urls), 0, 1, LEAN_FAST) as loader:
            got.append(batch_digest(next(loader)))
            server.stop()
            restart = threading.Timer(1.5, server.start)
            restart.start()
            for _ in range(STEPS - 1):
                got.append(batch_digest(next(loader)))
            restart.join()
    assert got == want
    assert "retrying" in caplog.text


@pytest.mark.slow
def test_server_gone_stops_with_a_clear_error_then_resume_matches(s3, tmp_path_factory) -> None:
    server, urls = s3
    want = reference(tmp_path_factory).digests
    short = RetryPolicy(deadline=1.0, initial=0.1, maximum=0.5)
    with Loader(make_recipe(urls), 0, 1, replace(LEAN, retry=short)) as loader:
        next(loader)
        state = loader.state_dict()
        server.stop()
        try:
            with pytest.raises(StorageError) as info:
                for _ in range(STEPS):
                    next(loader)
        finally:
            server.start()
    msg = str(info.value)
    assert "s3://zephon-test/data/demo-" in msg and "offset" in msg and "deadline" in msg
    assert "testing" not in msg  # no credential in the error
    with Loader(make_recipe(urls), 0, 1, replace(LEAN, retry=short)) as resumed1:
        resumed1.load_state_dict(state)
        assert [batch_digest(next(resumed1)) for _ in range(STEPS - 1)] == want[1:]


def test_http_urls_and_a_toml_manifest(tmp_path_factory, tmp_path) -> None:
    local = demo_shards(tmp_path_factory)
    root = Path(local[0]).parent
    with http_server(root) as server:
        base = server.url
        urls = [f"{base}/{Path(p).name}" for p in local]
        assert digests(urls, 1, LEAN_FAST) == reference(tmp_path_factory).digests
        manifest = root / "http-manifest.json"
        build_manifest(urls, manifest)
        toml = tmp_path / "remote.toml"
        toml.write_text(f'kind = "vlm"\nseq_len = 1024\nglobal_batch_size = 8\n'
                        f'num_lanes = 8\nmax_images = 5\n[image]\nmax_pixels = {128 * 28 * 28}\n'
                        f'[[datasets]]\nname = "data"\nmanifest = "{base}/http-manifest.json"\n')
        recipe = recipe_from_toml(toml)
        reader = recipe.datasets[0].reader
        assert reader.shards == urls  # URLs kept as written, never made local paths
        with Loader(recipe, 0, 1, LEAN) as loader:
            got = [batch_digest(next(loader)) for _ in range(STEPS)]
        assert got == reference(tmp_path_factory).digests
