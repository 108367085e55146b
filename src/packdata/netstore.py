"""An emulated network store: a real HTTP server on loopback that adds latency (and optionally a
bandwidth cap).

    with NetworkStore(root, latency=0.002) as store:
        data = urllib.request.urlopen(store.url_for("circle/000000.jpg")).read()
        print(store.requests, "requests x", store.latency, "s")

The server runs in a process of its own (``python -m packdata.netstore``), so it never competes
with the client for the client's interpreter. Each request waits ``latency`` seconds on its own
thread there before answering, so parallel clients overlap their waits exactly as they would
against a remote object store. ``latency`` and ``bandwidth`` may be changed while the store runs,
and the counters read: both live in shared memory. A file is sent with an ``ETag`` that changes with
its size or mtime (``file_etag``) and a ``Last-Modified``, so a client can tell a rewritten file
from the one it knew.

The request handler and server here are shared with the dataset service (``service``).
"""

import contextlib
import importlib
import json
import mimetypes
import os
import re
import socket
import sys
import threading
import time
import urllib.parse
import warnings
from email.utils import formatdate
from functools import partial
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing import resource_tracker, shared_memory
from multiprocessing.util import Finalize
from pathlib import Path

from .childserver import ChildServer, serve_until_told
from .httpclient import file_etag

CHUNK = 64 * 1024
RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def resolve_inside(root, url_path):
    """The path ``url_path`` names under ``root``, or None when it would escape ``root`` (``..``,
    symlinks)."""
    relative = urllib.parse.unquote(url_path.split("?", 1)[0]).lstrip("/")
    if "\x00" in relative:
        return None
    try:
        candidate = (root / relative).resolve()
    except (OSError, RuntimeError):  # a symlink loop, a name too long: nothing to serve
        return None
    return candidate if candidate.is_relative_to(root) else None


def byte_range(header, size):
    """``(start, end)`` inclusive for a ``Range`` header; None to send everything; ValueError if
    unsatisfiable."""
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


def bandwidth_delay(started, done, bandwidth):
    """Seconds until ``done`` bytes may have passed since ``started`` at ``bandwidth`` bytes/s
    (None: no cap)."""
    return max(0.0, started + done / bandwidth - time.perf_counter()) if bandwidth else 0.0


def matches(if_match, etag):
    """Whether a request's ``If-Match`` header (None when absent) lets a file with ``etag`` be
    served."""
    return if_match is None or any(tag.strip() in ("*", etag) for tag in if_match.split(","))


# --- what both servers share: files with Range and pacing, refusals, a loopback server thread -----


class FileHandler(BaseHTTPRequestHandler):
    """Serve the files of a folder over HTTP with ``Range``, ``ETag`` and a pause for each request;
    the handler classes of ``NetworkStore`` and ``service.DatasetService`` build on it."""

    protocol_version = "HTTP/1.1"  # keep-alive for clients that want it
    # headers and body go out as separate writes; don't let the body wait for an ACK
    disable_nagle_algorithm = True
    # close keep-alive connections idle this long (seconds), so stopped clients free their threads
    timeout = 30

    def send_file(self, path, send_body):
        """Answer with the file at ``path`` (which exists): all of it, or the part a ``Range``
        header asks for. Headers and body describe the one version opened, even when an upload
        replaces the file meanwhile."""
        with path.open("rb") as file:
            stat = os.fstat(file.fileno())
            size, etag = stat.st_size, file_etag(stat.st_size, stat.st_mtime_ns)
            if not matches(self.headers.get("If-Match"), etag):
                return self.refuse(
                    HTTPStatus.PRECONDITION_FAILED,
                    f"changed: {self.path} is no longer the version "
                    f"asked for ({self.headers['If-Match']}); it is now {etag}",
                    {"ETag": etag},
                )
            try:
                span = byte_range(self.headers.get("Range"), size)
            except ValueError:
                return self.refuse(
                    HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                    f"range not satisfiable: {self.path}",
                    {"Content-Range": f"bytes */{size}"},
                )
            start, end = span or (0, size - 1)
            self.send_response(HTTPStatus.PARTIAL_CONTENT if span else HTTPStatus.OK)
            if span:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header(
                "Content-Type", mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            )
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", formatdate(stat.st_mtime, usegmt=True))
            self.end_headers()
            if send_body:
                file.seek(start)
                self.send_paced(file, end - start + 1)

    def send_paced(self, file, length):
        """Write ``length`` bytes of ``file``; with a bandwidth cap set, no byte leaves before its
        time."""
        served = self.server.served
        if not served.bandwidth:  # no cap: the kernel copies file to socket (sendfile), as a
            served.count(bytes_served=length)  # real file server does
            # sendfile refuses a count of 0 (an empty file has no body); a file cut short
            # meanwhile sends less: hang up, so that the client sees it
            sent = length and self.connection.sendfile(file, offset=file.tell(), count=length)
            if sent < length:
                self.close_connection = True
            return
        started, sent = time.perf_counter(), 0
        while sent < length:
            chunk = file.read(min(CHUNK, length - sent))
            if not chunk:  # cut short meanwhile: hang up, so that the client sees it
                self.close_connection = True
                break
            self.pause(bandwidth_delay(started, sent + len(chunk), served.bandwidth))
            # Counted before the write: a client that has read the last byte must already see it
            # counted.
            served.count(bytes_served=len(chunk))
            self.wfile.write(chunk)
            sent += len(chunk)

    def pause(self, seconds):
        """Sleep ``seconds`` (emulated latency or pacing); when the server stops meanwhile, wake and
        hang up."""
        if self.server.stopping.wait(seconds):
            raise ConnectionAbortedError("the server stopped")

    def error_body(self, message):
        """``(content type, bytes)`` of an error answer."""
        return "text/plain; charset=utf-8", message.encode()

    def send_error(self, code, message=None, explain=None):
        """The standard library's errors (a malformed request line, a method with no handler) as
        this server's own: the same body format, and 405 rather than 501 for a method we lack."""
        if code == HTTPStatus.NOT_IMPLEMENTED:
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"method {self.command!r} is not allowed"
        self.close_connection = True
        headers = {"Connection": "close"}
        if code == HTTPStatus.METHOD_NOT_ALLOWED:  # RFC 9110: say which methods are
            headers["Allow"] = ", ".join(
                sorted(name[3:] for name in dir(self) if name[:3] == "do_")
            )
        self.refuse(code, message or HTTPStatus(code).phrase, headers)

    def refuse(self, status, message, headers=None):
        content_type, body = self.error_body(message)
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format, *args):
        if self.server.served.verbose:
            super().log_message(format, *args)


class _Server(ThreadingHTTPServer):
    """One thread per connection (a daemon: one stuck past ``stop``'s wait cannot keep Python from
    exiting)."""

    # many workers connect at once; the default backlog of 5 drops connections
    request_queue_size = 128

    def __init__(self, served, handler, host, port):
        super().__init__((host, port), handler)
        self.served = served
        self.stopping = threading.Event()  # wakes handlers sleeping on latency or pacing
        self.connections = set()  # each one has a handler thread until shutdown_request
        self.connections_changed = threading.Condition()

    def process_request(self, request, client_address):
        with self.connections_changed:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        super().shutdown_request(request)
        with self.connections_changed:
            self.connections.discard(request)
            self.connections_changed.notify_all()

    def close_connections(self, timeout):
        """Hang up on every client, idle keep-alive ones included, and wait up to ``timeout`` s for
        their handler threads to end; True when they all did."""
        self.stopping.set()
        with self.connections_changed:
            for connection in self.connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)  # already gone
            return self.connections_changed.wait_for(lambda: not self.connections, timeout)

    def handle_error(self, request, client_address):
        if self.served.verbose or not isinstance(sys.exc_info()[1], ConnectionError):
            # a client hanging up is normal; anything else is not
            super().handle_error(request, client_address)


class Shared:
    """``latency``, ``bandwidth`` and the two counters in 32 bytes of shared memory, so that a
    server process and the process that started it see the same values."""

    def __init__(self, name=None):
        self.memory = shared_memory.SharedMemory(name=name, create=name is None, size=32)
        if name is not None:  # attached, not created: the creator alone removes it
            resource_tracker.unregister(self.memory._name, "shared_memory")
        self.views = [self.memory.buf[:16], self.memory.buf[16:]]
        self.floats, self.counts = self.views[0].cast("d"), self.views[1].cast("q")
        # the server's threads count; the creator reads them, and resets them while none runs
        self.lock = threading.Lock()

    def close(self, remove):
        for view in (self.floats, self.counts, *self.views):
            view.release()
        self.memory.close()
        if remove:
            self.memory.unlink()


class ServedFolder:
    """A folder served on loopback, with ``latency``, ``bandwidth`` and request counters.

    By default the server runs in a process of its own (``process=True``), as a real store would:
    its threads never compete with the client's for the client's interpreter, so what a client
    measures is the client. ``latency`` and ``bandwidth`` may be changed while it runs, and
    ``requests`` and ``bytes_served`` read: they live in shared memory. ``process=False`` serves
    from a thread of this process instead (tests that patch a handler use it)."""

    handler = None  # the request handler class

    def __init__(self, root, latency, bandwidth, verbose, host="127.0.0.1", port=0, process=True):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise NotADirectoryError(f"nothing to serve: {self.root} is not a folder")
        self.shared = Shared()
        self.latency, self.bandwidth = latency, bandwidth
        self.verbose, self.host, self.port, self.process = verbose, host, port, process
        self._address = self._server = self._thread = self._child = None
        self._closer = Finalize(self, self.shared.close, args=(True,), exitpriority=0)

    latency = property(
        lambda self: self.shared.floats[0],
        lambda self, seconds: self.shared.floats.__setitem__(0, seconds),
        doc="Seconds each request waits before it is answered.",
    )
    bandwidth = property(
        lambda self: self.shared.floats[1] or None,
        lambda self, rate: self.shared.floats.__setitem__(1, rate or 0.0),
        doc="Bytes/s each transfer is paced to; None for no cap.",
    )
    requests = property(lambda self: self.shared.counts[0], doc="Requests answered so far.")
    bytes_served = property(lambda self: self.shared.counts[1], doc="Bytes of files sent so far.")

    @property
    def url(self):
        """The base URL, e.g. ``http://127.0.0.1:PORT/``."""
        if self._address is None:
            raise RuntimeError(
                f"the {type(self).__name__} is not running; use it in a 'with' block or call "
                "start()"
            )
        host, port = self._address
        return f"http://{host}:{port}/"

    def count(self, requests=0, bytes_served=0):
        """Add to the counters (the server's threads call it)."""
        with self.shared.lock:
            self.shared.counts[0] += requests
            self.shared.counts[1] += bytes_served

    def reset_counters(self):
        """Set ``requests`` and ``bytes_served`` back to zero, e.g. between two measurements (while
        no request runs: a count under way may undo the reset)."""
        self.shared.counts[0] = self.shared.counts[1] = 0

    def start(self):
        """Start serving (on an OS-chosen port unless one was given); returns self."""
        if self._address is not None:
            return self
        if self.process:
            command = [sys.executable, "-m", __name__, json.dumps(self.recipe())]
            self._child = ChildServer(command, type(self).__name__)
            self._address = self._child.start()
        else:
            self._server = _Server(self, self.handler, self.host, self.port)
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=type(self).__name__,
                daemon=True,
            )
            self._thread.start()
            self._address = self._server.server_address[:2]
        return self

    def recipe(self):
        """What the server process needs to serve the same folder the same way."""
        kind = type(self)
        return {
            "class": f"{kind.__module__}:{kind.__qualname__}",
            "shared": self.shared.memory.name,
            "settings": self.settings(),
        }

    def settings(self):
        """The keyword arguments that make another instance like this one (subclasses add)."""
        return {"root": str(self.root), "verbose": self.verbose}

    def stop(self, timeout=5.0):
        """Stop serving, hang up on every client, wait up to ``timeout`` s for requests in progress
        to end (a request sleeping on ``latency`` or ``bandwidth`` ends at once), and free the port.
        """
        if self._address is None:
            return
        if self._child is not None:
            ended = self._child.stop(timeout)
        else:
            ended = _shut_down(self._server, timeout)
            self._thread.join()
        if not ended:
            warnings.warn(
                f"{type(self).__name__}: requests still running {timeout} s after stop()",
                RuntimeWarning,
                stacklevel=2,
            )
        self._address = self._server = self._thread = self._child = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    def __repr__(self):
        where = self.url if self._address else "stopped"
        return (
            f"{type(self).__name__}({str(self.root)!r}, latency={self.latency}, "
            f"bandwidth={self.bandwidth}) at "
            f"{where}: {self.requests} requests, {self.bytes_served} bytes served"
        )


def _shut_down(server, timeout):
    """Stop ``server`` and free its port; True when every request ended within ``timeout`` s."""
    server.shutdown()
    ended = server.close_connections(timeout)
    server.server_close()
    return ended


def serve_child(recipe):
    """The server process (``python -m packdata.netstore RECIPE``): serve the folder the recipe
    names, with the shared settings, until a stop timeout arrives on standard input (or it
    closes); then say whether every request ended in time."""
    module, _, name = recipe["class"].partition(":")
    kind = getattr(importlib.import_module(module), name)
    served = kind.__new__(kind)
    served.__dict__.update(kind(**recipe["settings"], process=False).__dict__)
    served._closer()  # frees the instance's own settings: the parent's are the ones to use
    served.shared = Shared(recipe["shared"])
    try:
        server = _Server(served, served.handler, served.host, served.port)
    except OSError as error:  # the port is taken, say
        print(f"error: {error}", flush=True)
        return 1
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    serve_until_told(server.server_address[:2], partial(_shut_down, server))
    thread.join()
    served.shared.close(remove=False)
    return 0


# --- lesson 1: a folder behind a slow network -----------------------------------------------------


class _Handler(FileHandler):
    def do_GET(self):
        self.answer(send_body=True)

    def do_HEAD(self):
        self.answer(send_body=False)

    def answer(self, send_body):
        store = self.server.served
        store.count(requests=1)
        self.pause(store.latency)
        path = resolve_inside(store.root, self.path)
        if path is None:
            return self.refuse(
                HTTPStatus.FORBIDDEN, f"refused: {self.path} names nothing inside the served folder"
            )
        if not is_file(path):
            return self.refuse(HTTPStatus.NOT_FOUND, f"not found: {self.path}")
        self.send_file(path, send_body)


def is_file(path):
    """``path.is_file()``, False also where the name is too long for the filesystem."""
    try:
        return path.is_file()
    except OSError:
        return False


class NetworkStore(ServedFolder):
    """Serve ``root`` over HTTP on 127.0.0.1 from a process of its own (``process=False``: a
    thread of this one; ``ServedFolder`` says when), with per-request ``latency`` (s) and an
    optional ``bandwidth`` cap (bytes/s) per connection: each response is paced on its own, so
    parallel downloads do not share the cap, and N at once move up to N × ``bandwidth``. Counts
    ``requests`` and ``bytes_served``."""

    handler = _Handler

    def __init__(self, root, latency=0.002, bandwidth=None, verbose=False, process=True):
        super().__init__(root, latency, bandwidth, verbose, process=process)

    def url_for(self, relpath):
        """The URL of the file at ``relpath`` (relative to the served root)."""
        return self.url + urllib.parse.quote(Path(relpath).as_posix())


if __name__ == "__main__":
    sys.exit(serve_child(json.loads(sys.argv[1])))
