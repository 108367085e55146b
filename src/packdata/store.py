"""An emulated network store: a real HTTP server on loopback that adds latency (and optionally a bandwidth cap).

    with NetworkStore(root, latency=0.002) as store:
        data = urllib.request.urlopen(store.url_for("circle/000000.jpg")).read()
        print(store.requests, "requests x", store.latency, "s")

Each request waits ``latency`` seconds on its own thread before answering, so parallel clients overlap
their waits exactly as they would against a remote object store. ``latency`` and ``bandwidth`` may be
changed while the store runs.
"""

import mimetypes
import re
import socket
import sys
import threading
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHUNK = 64 * 1024
RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def resolve_inside(root, url_path):
    """The path ``url_path`` names under ``root``, or None when it would escape ``root`` (``..``, symlinks)."""
    relative = urllib.parse.unquote(url_path.split("?", 1)[0]).lstrip("/")
    if "\x00" in relative:
        return None
    try:
        candidate = (root / relative).resolve()
    except (OSError, RuntimeError):  # a symlink loop, a name too long: nothing to serve
        return None
    return candidate if candidate.is_relative_to(root) else None


def byte_range(header, size):
    """``(start, end)`` inclusive for a ``Range`` header; None to send everything; ValueError if unsatisfiable."""
    match = RANGE.fullmatch(header.strip()) if header else None
    if match is None or match.groups() == ("", ""):
        return None  # absent, multi-range or malformed: RFC 9110 lets a server ignore it
    first, last = match.groups()
    if not first:  # suffix range "-n": the last n bytes
        if int(last) == 0 or size == 0:
            raise ValueError
        return max(size - int(last), 0), size - 1
    start, end = int(first), int(last) if last else size - 1
    if last and end < start:
        return None  # malformed, ignored like the rest
    if start >= size:
        raise ValueError
    return start, min(end, size - 1)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive for clients that want it
    disable_nagle_algorithm = True  # headers and body go out as separate writes; don't let the body wait for an ACK
    timeout = 30  # close keep-alive connections idle this long (seconds), so stopped clients free their threads

    def do_GET(self):
        self.answer(send_body=True)

    def do_HEAD(self):
        self.answer(send_body=False)

    def answer(self, send_body):
        store = self.server.store
        store.count(requests=1)
        time.sleep(store.latency)
        path = resolve_inside(store.root, self.path)
        if path is None:
            return self.refuse(HTTPStatus.FORBIDDEN, f"refused: {self.path} names nothing inside the served folder")
        if not path.is_file():
            return self.refuse(HTTPStatus.NOT_FOUND, f"not found: {self.path}")
        size = path.stat().st_size
        try:
            span = byte_range(self.headers.get("Range"), size)
        except ValueError:
            return self.refuse(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, f"range not satisfiable: {self.path}",
                               {"Content-Range": f"bytes */{size}"})
        start, end = span or (0, size - 1)
        self.send_response(HTTPStatus.PARTIAL_CONTENT if span else HTTPStatus.OK)
        if span:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Type", mimetypes.guess_type(path.name)[0] or "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if send_body:
            with path.open("rb") as file:
                file.seek(start)
                self.send_paced(file, end - start + 1, store)

    def refuse(self, status, message, headers=None):
        body = message.encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_paced(self, file, length, store):
        """Write ``length`` bytes of ``file``; with ``store.bandwidth`` set, no byte leaves before its time."""
        started, sent = time.perf_counter(), 0
        while sent < length:
            chunk = file.read(min(CHUNK, length - sent))
            if not chunk:
                break
            if store.bandwidth:
                time.sleep(max(0.0, started + (sent + len(chunk)) / store.bandwidth - time.perf_counter()))
            self.wfile.write(chunk)
            sent += len(chunk)
            store.count(bytes_served=len(chunk))

    def log_message(self, format, *args):
        if self.server.store.verbose:
            super().log_message(format, *args)


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # many workers connect at once; the default backlog of 5 drops connections

    def __init__(self, store):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.store = store
        self.connections = set()

    def process_request(self, request, client_address):
        self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        self.connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self):
        """Hang up on every client, including idle keep-alive ones, so a stopped store serves nothing more."""
        for connection in list(self.connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already gone

    def handle_error(self, request, client_address):
        if self.store.verbose or not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # a client hanging up is normal; anything else is not


class NetworkStore:
    """Serve ``root`` over HTTP on 127.0.0.1 from a background thread, with per-request ``latency`` (s)
    and an optional per-response ``bandwidth`` cap (bytes/s). Counts ``requests`` and ``bytes_served``."""

    def __init__(self, root, latency=0.002, bandwidth=None, verbose=False):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise NotADirectoryError(f"nothing to serve: {self.root} is not a folder")
        self.latency = latency
        self.bandwidth = bandwidth
        self.verbose = verbose
        self.requests = 0
        self.bytes_served = 0
        self._lock = threading.Lock()
        self._server = None
        self._thread = None

    @property
    def url(self):
        """The base URL, e.g. ``http://127.0.0.1:PORT/``."""
        if self._server is None:
            raise RuntimeError("the store is not running; use 'with NetworkStore(...) as store' or start()")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/"

    def url_for(self, relpath):
        """The URL of the file at ``relpath`` (relative to the served root)."""
        return self.url + urllib.parse.quote(Path(relpath).as_posix())

    def count(self, requests=0, bytes_served=0):
        """Add to the counters (thread-safe)."""
        with self._lock:
            self.requests += requests
            self.bytes_served += bytes_served

    def reset_counters(self):
        """Set ``requests`` and ``bytes_served`` back to zero, e.g. between two measurements."""
        with self._lock:
            self.requests = self.bytes_served = 0

    def start(self):
        """Start serving on an OS-chosen port; returns self."""
        if self._server is not None:
            return self
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="NetworkStore", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stop serving and free the port."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.close_connections()
        self._server.server_close()
        self._thread.join()
        self._server = self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    def __repr__(self):
        where = self.url if self._server else "stopped"
        return (f"NetworkStore({str(self.root)!r}, latency={self.latency}, bandwidth={self.bandwidth}) at {where}: "
                f"{self.requests} requests, {self.bytes_served} bytes served")
