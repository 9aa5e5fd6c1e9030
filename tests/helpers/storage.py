"""Real storage servers on 127.0.0.1 for the remote-shard tests: moto's S3 server and a
static HTTP server with Range support. Clients find them through the standard
configuration only (``AWS_ENDPOINT_URL`` and dummy ``AWS_*`` credentials)."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto in server mode; `stop()`/`start()` keep the buckets (moto's state is in-process)."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._make = lambda: ThreadedMotoServer(ip_address="127.0.0.1", port=self.port,
                                                verbose=False)
        self._server = None

    def start(self) -> None:
        self._server = self._make()
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def upload(self, bucket: str, files: list[str]) -> list[str]:
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.url)
        s3.create_bucket(Bucket=bucket)
        urls = []
        for f in files:
            s3.upload_file(f, bucket, f"data/{Path(f).name}")
            urls.append(f"s3://{bucket}/data/{Path(f).name}")
        return urls

    def put(self, url: str, data: bytes) -> None:
        import boto3

        bucket, key = url.removeprefix("s3://").split("/", 1)
        boto3.client("s3", endpoint_url=self.url).put_object(Bucket=bucket, Key=key, Body=data)


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """A started S3 server with the environment pointing every client at it."""
    saved = {k: os.environ.get(k) for k in [*S3_ENV, "AWS_ENDPOINT_URL"]}
    server = S3Server()
    os.environ.update(S3_ENV, AWS_ENDPOINT_URL=server.url)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
        if rng and self.command == "GET":
            with self.server.state.lock:  # type: ignore[attr-defined]
                self.server.state.range_gets += 1  # type: ignore[attr-defined]
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start, end = int(a), min(int(b) if b else size - 1, size - 1)
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
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


@dataclass
class HttpServer:
    """What a test sees of the HTTP server: its base `url`, the ranged GETs it answered,
    and `hang` (set: requests are accepted and left unanswered; `hung` tells one was)."""

    url: str
    range_gets: int = 0
    hang: threading.Event = field(default_factory=threading.Event)
    hung: threading.Event = field(default_factory=threading.Event)
    closing: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def http_server(root: Path) -> Iterator[HttpServer]:
    """Serve `root` on 127.0.0.1."""
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
