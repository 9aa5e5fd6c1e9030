"""Real storage servers on 127.0.0.1, for checking remote shards without a cloud account.

- `s3_server()`: moto's S3 server (`S3Server`); clients find it through ``AWS_ENDPOINT_URL``
  and dummy ``AWS_*`` credentials (`S3_ENV`).
- `gcs_server()`: a GCS emulator (`GcsServer`, the pure-Python ``gcp-storage-emulator``);
  gcsfs finds it through ``STORAGE_EMULATOR_HOST`` and anonymous credentials from
  fsspec's configuration (`GCS_ENV`).
- `http_server(root)`: a static HTTP server with ``Range`` and ``ETag`` (`HttpServer`),
  which can also hang on purpose (a stuck backend).

Each context manager points the standard configuration at its server for its duration
and restores it afterwards; zephon's storage code knows nothing of them. The server
packages are optional (``pip install 'zephon-vl[dev]'``) and imported only when a server
starts.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

from zephon_core import ConfigError

#: Dummy credentials and region for moto (never real ones).
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1"}
#: fsspec's configuration for gcsfs (``FSSPEC_<protocol>_<kwarg>``): anonymous, a dummy project.
GCS_ENV = {"FSSPEC_GCS_TOKEN": "anon", "FSSPEC_GCS_PROJECT": "zephon-test"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _need(module: str, package: str, extra: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{module} is not installed; the test storage servers need "
                          f"{package}: pip install 'zephon-vl[{extra}]'") from None


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _forget_clients(module: str, cls: str) -> None:
    """Drop fsspec's cached filesystems of one class: s3fs reads its endpoint when an
    instance is made, and fsspec reuses instances, so without this a second server in the
    same process would be missed for the first one's (stopped) endpoint."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        getattr(loaded, cls).clear_instance_cache()


class S3Server:
    """moto in server mode; `stop()`/`start()` keep the buckets (moto's state is in-process)."""

    def __init__(self) -> None:
        server = _need("moto.server", "moto[server]", "dev")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._make = lambda: server.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port,
                                                       verbose=False)
        self._server = None

    def start(self) -> None:
        self._server = self._make()
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def _client(self):  # noqa: ANN202 - a boto3 client
        return _need("boto3", "boto3", "dev").client("s3", endpoint_url=self.url)

    def upload(self, bucket: str, files: list[str]) -> list[str]:
        """Create `bucket`, upload `files` as ``data/<name>``; their ``s3://`` URLs."""
        s3 = self._client()
        s3.create_bucket(Bucket=bucket)
        urls = []
        for f in files:
            s3.upload_file(f, bucket, f"data/{Path(f).name}")
            urls.append(f"s3://{bucket}/data/{Path(f).name}")
        return urls

    def put(self, url: str, data: bytes) -> None:
        """Write `data` at an ``s3://`` URL (to change or restore an object)."""
        bucket, key = url.removeprefix("s3://").split("/", 1)
        self._client().put_object(Bucket=bucket, Key=key, Body=data)


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """A started S3 server with the environment pointing every S3 client at it."""
    server = S3Server()
    with _environment({**S3_ENV, "AWS_ENDPOINT_URL": server.url}):
        _forget_clients("s3fs", "S3FileSystem")
        server.start()
        try:
            yield server
        finally:
            server.stop()
            _forget_clients("s3fs", "S3FileSystem")


class GcsServer:
    """gcp-storage-emulator in this process (objects in memory) and gcsfs as its client.

    `stop()`/`start()` keep the objects: the storage outlives the HTTP thread."""

    def __init__(self) -> None:
        self._emulator = _need("gcp_storage_emulator.server", "gcp-storage-emulator", "dev")
        self._storage = _need("gcp_storage_emulator.storage", "gcp-storage-emulator",
                              "dev").Storage(use_memory_fs=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._api = None

    def start(self) -> None:
        self._api = self._emulator.APIThread("127.0.0.1", self.port, self._storage, daemon=True)
        self._api.start()
        self._api.is_running.wait()

    def stop(self) -> None:
        if self._api is not None:
            self._api.join()
            self._api = None

    def filesystem(self):  # noqa: ANN201 - a gcsfs.GCSFileSystem
        """gcsfs as the environment configures it (the server's context must be active)."""
        _need("gcsfs", "gcsfs", "remote")
        return _need("fsspec", "fsspec", "remote").filesystem("gs")

    def upload(self, bucket: str, files: list[str]) -> list[str]:
        """Create `bucket`, upload `files` as ``data/<name>``; their ``gs://`` URLs."""
        fs = self.filesystem()
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        urls = []
        for f in files:
            url = f"gs://{bucket}/data/{Path(f).name}"
            fs.put_file(f, url)
            urls.append(url)
        return urls

    def put(self, url: str, data: bytes) -> None:
        """Write `data` at a ``gs://`` URL (to change or restore an object)."""
        self.filesystem().pipe_file(url, data)


@contextmanager
def gcs_server() -> Iterator[GcsServer]:
    """A started GCS emulator; gcsfs, here and in child processes, talks to it anonymously.

    fsspec reads ``FSSPEC_*`` variables when it is imported, so for this process the same
    values also go into ``fsspec.config.conf`` (restored on exit)."""
    server = GcsServer()
    config = _need("fsspec.config", "fsspec", "remote").conf
    saved = config.get("gcs")
    with _environment({**GCS_ENV, "STORAGE_EMULATOR_HOST": server.url}):
        config["gcs"] = {**(saved or {}), "token": "anon", "project": GCS_ENV["FSSPEC_GCS_PROJECT"]}
        _forget_clients("gcsfs", "GCSFileSystem")
        server.start()
        try:
            yield server
        finally:
            server.stop()
            _forget_clients("gcsfs", "GCSFileSystem")
            if saved is None:
                config.pop("gcs", None)
            else:
                config["gcs"] = saved


class _RangeHandler(SimpleHTTPRequestHandler):
    """Static files with ``Range: bytes=a-b`` (206) and an ETag, as object stores answer.

    Counts ranged GETs; while the server's `hang` is set, accepts requests and does not
    answer them until it is cleared (a stuck storage backend)."""

    def log_message(self, *args) -> None:
        pass

    def handle_one_request(self) -> None:
        state: HttpServer = self.server.state  # type: ignore[attr-defined]
        while state.hang.is_set() and not state.closing.is_set():
            state.hung.set()
            time.sleep(0.02)
        super().handle_one_request()

    def _etag(self, path: str) -> str:
        st = os.stat(path)
        return hashlib.md5(f"{st.st_size}-{st.st_mtime_ns}".encode()).hexdigest()

    def send_head(self):  # noqa: ANN201 - the base class's contract
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return None
        size = os.path.getsize(path)
        f = open(path, "rb")
        rng = self.headers.get("Range")
        with self.server.state.lock:  # type: ignore[attr-defined]
            self.server.state.requests.append(f"{self.command} {self.path}")  # type: ignore[attr-defined]
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start, end = int(a), min(int(b) if b else size - 1, size - 1)
            if self.command == "GET":
                with self.server.state.lock:  # type: ignore[attr-defined]
                    self.server.state.ranges.append((self.path, start, end + 1))  # type: ignore[attr-defined]
            f.seek(start)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(end - start + 1))
            self._left = end - start + 1
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self._left = size
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{self._etag(path)}"')
        self.end_headers()
        return f

    def copyfile(self, source, outputfile) -> None:
        outputfile.write(source.read(self._left))


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that gave up on a hung request closes its socket: not worth a trace."""
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


@dataclass
class HttpServer:
    """What a caller sees of the HTTP server: its base `url`, the ranged GETs it answered
    (`range_gets`; `ranges`: each one's path and byte span ``[start, stop)``), every
    request for a file (``"HEAD /a.parquet"``, in order: what a step cost), and `hang`
    (set: requests are accepted and left unanswered; `hung` tells one was)."""

    url: str
    ranges: list[tuple[str, int, int]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    hang: threading.Event = field(default_factory=threading.Event)
    hung: threading.Event = field(default_factory=threading.Event)
    closing: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def range_gets(self) -> int:
        return len(self.ranges)


@contextmanager
def http_server(root: Path) -> Iterator[HttpServer]:
    """Serve the files under `root` on 127.0.0.1 (any free port)."""
    handler = lambda *a, **k: _RangeHandler(*a, directory=str(root), **k)  # noqa: E731
    server = _QuietServer(("127.0.0.1", 0), handler)
    state = HttpServer(f"http://127.0.0.1:{server.server_address[1]}")
    server.state = state  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.closing.set()
        server.shutdown()
        server.server_close()
