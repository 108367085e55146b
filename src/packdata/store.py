"""An emulated network store: a real HTTP server on loopback that adds latency (and optionally a bandwidth cap).

    with NetworkStore(root, latency=0.002) as store:
        data = urllib.request.urlopen(store.url_for("circle/000000.jpg")).read()
        print(store.requests, "requests x", store.latency, "s")

Each request waits ``latency`` seconds on its own thread before answering, so parallel clients overlap
their waits exactly as they would against a remote object store. ``latency`` and ``bandwidth`` may be
changed while the store runs. A file is sent with an ``ETag`` that changes with its size or mtime
(``file_etag``) and a ``Last-Modified``, so a client can tell a rewritten file from the one it knew.

``DatasetService`` is the same kind of server with a small JSON API for datasets of files, which
``DatasetClient`` speaks (``packdata serve ROOT`` runs one from the command line)::

    with DatasetService(root, latency=0.002) as service:
        client = DatasetClient(service.url)
        client.create("shapes")
        client.upload("shapes", "train-000000.tar", Path("train-000000.tar"))
        client.files("shapes")                              # [{"name": ..., "bytes": ...}]
        client.url_for("shapes", "train-000000.tar")        # GET it, with Range if you like

========================================  ===================================================
``GET /datasets``                          ``{"datasets": [{"name", "files", "bytes"}]}``
``POST /datasets`` ``{"name": "shapes"}``  201 Created; 409 when it exists
``GET /datasets/{name}``                   ``{"name", "files": [{"name", "bytes"}]}``
``PUT /datasets/{name}/{file}``            201 Created (200 when it replaced a file); 413 when too big
``GET /datasets/{name}/{file}``            the bytes (``Range`` honoured, 206)
========================================  ===================================================

Errors are JSON, ``{"error": "..."}``, with the status that says what went wrong: 400 for a bad name
or body, 404 for a missing dataset or file, 409, 411 without a ``Content-Length``, 413, 416.
Names are one path component of letters, digits, ``.``, ``_`` and ``-`` that does not start with a
dot, so nothing can be read or written outside ``root``. An upload goes to a hidden temporary file
that is renamed only once all the bytes its ``Content-Length`` declared have arrived.
"""

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
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .tario import written_atomically

CHUNK = 64 * 1024
RANGE = re.compile(r"bytes=(\d*)-(\d*)")
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")  # one path component, never hidden, never "." or ".."
MAX_UPLOAD = 1 << 30  # 1 GiB: the default largest upload a DatasetService accepts


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


def is_valid_name(name):
    """True for a dataset or file name the service accepts: one safe path component (see the module docstring)."""
    return isinstance(name, str) and NAME.fullmatch(name) is not None


def bandwidth_delay(started, done, bandwidth):
    """Seconds until ``done`` bytes may have passed since ``started`` at ``bandwidth`` bytes/s (None: no cap)."""
    return max(0.0, started + done / bandwidth - time.perf_counter()) if bandwidth else 0.0


def file_etag(size, mtime_ns):
    """The ``ETag`` the servers send for a file of ``size`` bytes last modified at ``mtime_ns``: a new version of
    the file, even one of the same size, gets another."""
    return f'"{size:x}-{mtime_ns:x}"'


def matches(if_match, etag):
    """Whether a request's ``If-Match`` header (None when absent) lets a file with ``etag`` be served."""
    return if_match is None or any(tag.strip() in ("*", etag) for tag in if_match.split(","))


# --- what both servers share: files with Range and pacing, refusals, a loopback server thread ------


class _FileHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive for clients that want it
    disable_nagle_algorithm = True  # headers and body go out as separate writes; don't let the body wait for an ACK
    timeout = 30  # close keep-alive connections idle this long (seconds), so stopped clients free their threads

    def send_file(self, path, send_body):
        """Answer with the file at ``path`` (which exists): all of it, or the part a ``Range`` header asks for.
        Headers and body describe the one version opened, even when an upload replaces the file meanwhile."""
        with path.open("rb") as file:
            stat = os.fstat(file.fileno())
            size, etag = stat.st_size, file_etag(stat.st_size, stat.st_mtime_ns)
            if not matches(self.headers.get("If-Match"), etag):
                return self.refuse(HTTPStatus.PRECONDITION_FAILED, f"changed: {self.path} is no longer the version "
                                   f"asked for ({self.headers['If-Match']}); it is now {etag}", {"ETag": etag})
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
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", formatdate(stat.st_mtime, usegmt=True))
            self.end_headers()
            if send_body:
                file.seek(start)
                self.send_paced(file, end - start + 1)

    def send_paced(self, file, length):
        """Write ``length`` bytes of ``file``; with a bandwidth cap set, no byte leaves before its time."""
        served = self.server.served
        started, sent = time.perf_counter(), 0
        while sent < length:
            chunk = file.read(min(CHUNK, length - sent))
            if not chunk:
                break
            self.pause(bandwidth_delay(started, sent + len(chunk), served.bandwidth))
            # Counted before the write: a client that has read the last byte must already see it counted.
            served.count(bytes_served=len(chunk))
            self.wfile.write(chunk)
            sent += len(chunk)

    def pause(self, seconds):
        """Sleep ``seconds`` (emulated latency or pacing); when the server stops meanwhile, wake and hang up."""
        if self.server.stopping.wait(seconds):
            raise ConnectionAbortedError("the server stopped")

    def error_body(self, message):
        """``(content type, bytes)`` of an error answer."""
        return "text/plain; charset=utf-8", message.encode()

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
    """One thread per connection (a daemon: one stuck past ``stop``'s wait cannot keep Python from exiting)."""

    request_queue_size = 128  # many workers connect at once; the default backlog of 5 drops connections

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
        """Hang up on every client, idle keep-alive ones included, and wait up to ``timeout`` s for their handler
        threads to end; True when they all did."""
        self.stopping.set()
        with self.connections_changed:
            for connection in self.connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already gone
            return self.connections_changed.wait_for(lambda: not self.connections, timeout)

    def handle_error(self, request, client_address):
        if self.served.verbose or not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # a client hanging up is normal; anything else is not


class _Served:
    """A folder served from a background thread, with ``latency``, ``bandwidth`` and request counters."""

    handler = None  # the request handler class

    def __init__(self, root, latency, bandwidth, verbose, host="127.0.0.1", port=0):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise NotADirectoryError(f"nothing to serve: {self.root} is not a folder")
        self.latency = latency
        self.bandwidth = bandwidth
        self.verbose = verbose
        self.host, self.port = host, port
        self.requests = 0
        self.bytes_served = 0
        self._lock = threading.Lock()
        self._server = None
        self._thread = None

    @property
    def url(self):
        """The base URL, e.g. ``http://127.0.0.1:PORT/``."""
        if self._server is None:
            raise RuntimeError(f"the {type(self).__name__} is not running; use it in a 'with' block or call start()")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/"

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
        """Start serving (on an OS-chosen port unless one was given); returns self."""
        if self._server is not None:
            return self
        self._server = _Server(self, self.handler, self.host, self.port)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout=5.0):
        """Stop serving, hang up on every client, wait up to ``timeout`` s for requests in progress to end (a
        request sleeping on ``latency`` or ``bandwidth`` ends at once), and free the port."""
        if self._server is None:
            return
        self._server.shutdown()
        if not self._server.close_connections(timeout):
            warnings.warn(f"{type(self).__name__}: requests still running {timeout} s after stop()", RuntimeWarning)
        self._server.server_close()
        self._thread.join()
        self._server = self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    def __repr__(self):
        where = self.url if self._server else "stopped"
        return (f"{type(self).__name__}({str(self.root)!r}, latency={self.latency}, bandwidth={self.bandwidth}) at "
                f"{where}: {self.requests} requests, {self.bytes_served} bytes served")


# --- lesson 1: a folder behind a slow network -------------------------------------------------------


class _Handler(_FileHandler):
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
            return self.refuse(HTTPStatus.FORBIDDEN, f"refused: {self.path} names nothing inside the served folder")
        if not path.is_file():
            return self.refuse(HTTPStatus.NOT_FOUND, f"not found: {self.path}")
        self.send_file(path, send_body)


class NetworkStore(_Served):
    """Serve ``root`` over HTTP on 127.0.0.1 from a background thread, with per-request ``latency`` (s) and an
    optional ``bandwidth`` cap (bytes/s) per connection: each response is paced on its own, so parallel
    downloads do not share the cap, and N at once move up to N × ``bandwidth``. Counts ``requests`` and
    ``bytes_served``."""

    handler = _Handler

    def __init__(self, root, latency=0.002, bandwidth=None, verbose=False):
        super().__init__(root, latency, bandwidth, verbose)

    def url_for(self, relpath):
        """The URL of the file at ``relpath`` (relative to the served root)."""
        return self.url + urllib.parse.quote(Path(relpath).as_posix())


# --- lesson 5: a dataset service with a JSON API ----------------------------------------------------


class _Refused(Exception):
    """Answer the request with ``status`` and ``message`` (and hang up when ``close``)."""

    def __init__(self, status, message, close=False):
        super().__init__(message)
        self.status, self.message, self.close = status, message, close


class _ServiceHandler(_FileHandler):
    def do_GET(self):
        self.dispatch(self.get, send_body=True)

    def do_HEAD(self):
        self.dispatch(self.get, send_body=False)

    def do_POST(self):
        self.dispatch(self.post)

    def do_PUT(self):
        self.dispatch(self.put)

    def error_body(self, message):
        return "application/json", json.dumps({"error": message}).encode()

    def dispatch(self, method, **kwargs):
        service = self.server.served
        service.count(requests=1)
        self.pause(service.latency)
        self.body_read = False
        try:
            method(self.parts(), **kwargs)
        except _Refused as refusal:
            unread = not self.body_read and (self.headers.get("Content-Length", "0") != "0"
                                             or "Transfer-Encoding" in self.headers)
            if refusal.close or unread:  # a body left unread would be taken for the next request: hang up
                self.close_connection = True
                self.refuse(refusal.status, refusal.message, {"Connection": "close"})
            else:
                self.refuse(refusal.status, refusal.message)

    def parts(self):
        """The request path as validated names after ``/datasets``: ``[]``, ``[dataset]`` or ``[dataset, file]``."""
        path = self.path.split("?", 1)[0]
        if path.rstrip("/") == "/datasets":
            return []
        if not path.startswith("/datasets/"):
            raise _Refused(HTTPStatus.NOT_FOUND, f"not found: {self.path} (the API lives under /datasets)")
        names = [urllib.parse.unquote(part) for part in path[len("/datasets/"):].split("/")]
        if len(names) == 2 and names[1] == "":
            names = names[:1]  # /datasets/NAME/ is the dataset, as a base URL for its files
        if len(names) > 2:
            raise _Refused(HTTPStatus.BAD_REQUEST, f"refused: {self.path} is nested deeper than /datasets/NAME/FILE")
        for name in names:
            if not is_valid_name(name):
                raise _Refused(HTTPStatus.BAD_REQUEST, f"refused: {name!r} is not a valid name (use letters, digits, "
                                                       "'.', '_' and '-', not starting with a dot)")
        return names

    def dataset_folder(self, name):
        folder = self.server.served.root / name
        if not folder.is_dir():
            raise _Refused(HTTPStatus.NOT_FOUND, f"no dataset named {name!r}")
        return folder

    def send_json(self, status, document, headers=None):
        body = json.dumps(document).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def get(self, names, send_body):
        root = self.server.served.root
        if not names:
            datasets = [{"name": entry.name, "files": len(files), "bytes": sum(f["bytes"] for f in files)}
                        for entry in sorted(root.iterdir()) if is_valid_name(entry.name) and entry.is_dir()
                        for files in [list_files(entry)]]
            return self.send_json(HTTPStatus.OK, {"datasets": datasets})
        folder = self.dataset_folder(names[0])
        if len(names) == 1:
            return self.send_json(HTTPStatus.OK, {"name": names[0], "files": list_files(folder)})
        path = folder / names[1]
        if not path.is_file():
            raise _Refused(HTTPStatus.NOT_FOUND, f"no file {names[1]!r} in dataset {names[0]!r}")
        self.send_file(path, send_body)

    def post(self, names):
        if names:
            raise _Refused(HTTPStatus.METHOD_NOT_ALLOWED, "POST only to /datasets, with {\"name\": ...}")
        document = self.read_json()
        name = document.get("name") if isinstance(document, dict) else None
        if not is_valid_name(name):
            raise _Refused(HTTPStatus.BAD_REQUEST, f"refused: {name!r} is not a valid dataset name (send "
                                                   "{\"name\": \"...\"} with letters, digits, '.', '_', '-')")
        try:
            (self.server.served.root / name).mkdir()
        except FileExistsError:
            raise _Refused(HTTPStatus.CONFLICT, f"a dataset named {name!r} exists already") from None
        self.send_json(HTTPStatus.CREATED, {"name": name, "files": []}, {"Location": f"/datasets/{name}"})

    def read_json(self, limit=64 * 1024):
        length = self.declared_length(limit)
        body, self.body_read = self.rfile.read(length), True
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise _Refused(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {error}") from None

    def declared_length(self, limit):
        """The body's ``Content-Length``: required, and at most ``limit`` bytes."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise _Refused(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length; chunked bodies are not accepted", True)
        value = self.headers.get("Content-Length")
        if value is None or not value.isdigit():
            raise _Refused(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required", close=value is not None)
        if int(value) > limit:
            raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                           f"{int(value):,} bytes is more than this server accepts ({limit:,})", close=True)
        return int(value)

    def put(self, names):
        service = self.server.served
        if len(names) != 2:
            raise _Refused(HTTPStatus.METHOD_NOT_ALLOWED, "PUT only to /datasets/NAME/FILE")
        folder = self.dataset_folder(names[0])
        length = self.declared_length(service.max_upload)
        target = folder / names[1]
        existed = target.is_file()
        try:
            with written_atomically(target) as file:  # a hidden temporary name until every byte arrived
                self.receive(file, length, service.bandwidth)
        except ConnectionError as error:
            raise _Refused(HTTPStatus.BAD_REQUEST, f"upload incomplete: {error}", close=True) from None
        status = HTTPStatus.OK if existed else HTTPStatus.CREATED
        self.send_json(status, {"name": names[1], "bytes": length}, {"Location": f"/datasets/{names[0]}/{names[1]}"})

    def receive(self, file, length, bandwidth):
        started, received = time.perf_counter(), 0
        while received < length:
            chunk = self.rfile.read(min(CHUNK, length - received))
            if not chunk:
                raise ConnectionError(f"the client sent {received:,} of the {length:,} bytes it declared")
            file.write(chunk)
            received += len(chunk)
            self.pause(bandwidth_delay(started, received, bandwidth))
        self.body_read = True


def list_files(folder):
    """``[{"name", "bytes"}]`` of the files of one dataset folder, sorted; temporary uploads are hidden."""
    return [{"name": entry.name, "bytes": entry.stat().st_size}
            for entry in sorted(Path(folder).iterdir(), key=lambda entry: entry.name)
            if is_valid_name(entry.name) and entry.is_file()]


class DatasetService(_Served):
    """A dataset store: datasets of files under ``root``, served with the JSON API of the module docstring.

    Binds to ``host`` (loopback unless told otherwise) on ``port`` (0: the OS picks one); waits ``latency`` s per
    request, caps each transfer at ``bandwidth`` bytes/s when set, and refuses uploads over ``max_upload`` bytes.
    """

    handler = _ServiceHandler

    def __init__(self, root, latency=0, bandwidth=None, host="127.0.0.1", port=0, max_upload=MAX_UPLOAD,
                 verbose=False):
        super().__init__(root, latency, bandwidth, verbose, host, port)
        self.max_upload = max_upload

    def url_for(self, dataset, file=None):
        """The URL of a dataset, or of one of its files."""
        return DatasetClient(self.url).url_for(dataset, file)


# --- the client ----------------------------------------------------------------------------------


class ServiceError(OSError):
    """The service refused a request; ``status`` is the HTTP status, the message the service's reason."""

    def __init__(self, status, message):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class DatasetClient:
    """Speak a ``DatasetService``'s API: ``datasets()``, ``create(name)``, ``files(name)``, ``upload(...)``,
    ``download(...)``, ``url_for(...)``. Keeps one connection per thread; pickles for worker processes."""

    def __init__(self, url, timeout=60.0):
        from .datasets import HttpClient  # its keep-alive connections per process and thread

        self.http = HttpClient(url, timeout)
        self.url = self.http.base_url

    def url_for(self, dataset, file=None):
        """``http://HOST:PORT/datasets/NAME/`` or ``.../NAME/FILE``."""
        path = f"datasets/{urllib.parse.quote(dataset, safe='')}/"
        return self.url + path + (urllib.parse.quote(file, safe="") if file is not None else "")

    def request(self, method, path, body=None, headers=None):
        """``(status, body)`` of one request (``HttpClient.request`` says when it is repeated); any status of
        400 or more raises ``ServiceError``."""
        response, data = self.http.request(method, self.url + path, body, headers)
        if response.status >= 400:
            try:
                message = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                message = data.decode("utf-8", "replace")
            raise ServiceError(response.status, f"{method} /{path}: {message}")
        return response.status, data

    def datasets(self):
        """``[{"name", "files", "bytes"}]`` of every dataset."""
        return json.loads(self.request("GET", "datasets")[1])["datasets"]

    def create(self, dataset, exist_ok=False):
        """Create a dataset; an existing one raises ``ServiceError`` (409) unless ``exist_ok``."""
        body = json.dumps({"name": dataset}).encode()
        try:
            self.request("POST", "datasets", body, {"Content-Type": "application/json"})
        except ServiceError as error:
            if not (exist_ok and error.status == HTTPStatus.CONFLICT):
                raise

    def files(self, dataset):
        """``[{"name", "bytes"}]`` of the files of a dataset."""
        return json.loads(self.request("GET", self._path(dataset))[1])["files"]

    def upload(self, dataset, file, data):
        """Store ``data`` (bytes, or a local path to send) as ``file`` in ``dataset``; returns the file's URL."""
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(data, (str, Path)):
            with open(data, "rb") as body:
                headers["Content-Length"] = str(os.fstat(body.fileno()).st_size)
                self.request("PUT", self._path(dataset, file), body, headers)
        else:
            self.request("PUT", self._path(dataset, file), bytes(data), headers)
        return self.url_for(dataset, file)

    def download(self, dataset, file, to=None):
        """The bytes of ``file``, or, with ``to``, written to that path (atomically); returns the path then."""
        data = self.request("GET", self._path(dataset, file))[1]
        if to is None:
            return data
        with written_atomically(to) as target:
            target.write(data)
        return Path(to)

    def _path(self, dataset, file=None):
        return self.url_for(dataset, file)[len(self.url):]


def serve(root, latency=0, bandwidth=None, host="127.0.0.1", port=8080, max_upload=MAX_UPLOAD):
    """Run a ``DatasetService`` in the foreground until interrupted (``packdata serve``)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    with DatasetService(root, latency, bandwidth, host, port, max_upload, verbose=True) as service:
        print(f"serving datasets from {service.root} at {service.url}datasets (Ctrl-C stops)", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
