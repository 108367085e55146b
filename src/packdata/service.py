"""A dataset service: the same kind of server as ``netstore.NetworkStore`` with a small JSON API for
datasets of files, which ``DatasetClient`` speaks (``packdata serve ROOT`` runs one from the command
line)::

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
``PUT /datasets/{name}/{file}``            201 Created (200 when it replaced one); 413 when too big
``GET /datasets/{name}/{file}``            the bytes (``Range`` honoured, 206)
========================================  ===================================================

Errors are JSON, ``{"error": "..."}``, with the status that says what went wrong: 400 for a bad name
or body, 404 for a missing dataset or file, 409, 411 without a ``Content-Length``, 413, 416.
Names are one path component of letters, digits, ``.``, ``_`` and ``-`` that does not start with a
dot, so nothing can be read or written outside ``root``. An upload goes to a hidden temporary file
that is renamed only once all the bytes its ``Content-Length`` declared have arrived.
"""

import contextlib
import json
import os
import re
import threading
import time
import urllib.parse
from http import HTTPStatus
from pathlib import Path

from .atomic import written_atomically
from .httpclient import HttpClient
from .netstore import CHUNK, FileHandler, ServedFolder, bandwidth_delay, is_file

# one path component, never hidden, never "." or ".."
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
LENGTH = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit also takes "²" and "٣"
MAX_UPLOAD = 1 << 30  # 1 GiB: the default largest upload a DatasetService accepts


def is_valid_name(name):
    """True for a dataset or file name the service accepts: one safe path component (see the module
    docstring)."""
    return isinstance(name, str) and NAME.fullmatch(name) is not None


class _Refused(Exception):
    """Answer the request with ``status`` and ``message`` (and hang up when ``close``)."""

    def __init__(self, status, message, close=False):
        super().__init__(message)
        self.status, self.message, self.close = status, message, close


class _ServiceHandler(FileHandler):
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
            unread = not self.body_read and (
                self.headers.get("Content-Length", "0") != "0"
                or "Transfer-Encoding" in self.headers
            )
            # a body left unread would be taken for the next request: hang up
            if refusal.close or unread:
                self.close_connection = True
                self.refuse(refusal.status, refusal.message, {"Connection": "close"})
            else:
                self.refuse(refusal.status, refusal.message)

    def parts(self):
        """The request path as validated names after ``/datasets``: ``[]``, ``[dataset]`` or
        ``[dataset, file]``."""
        path = self.path.split("?", 1)[0]
        if path.rstrip("/") == "/datasets":
            return []
        if not path.startswith("/datasets/"):
            raise _Refused(
                HTTPStatus.NOT_FOUND, f"not found: {self.path} (the API lives under /datasets)"
            )
        names = [urllib.parse.unquote(part) for part in path[len("/datasets/") :].split("/")]
        if len(names) == 2 and names[1] == "":
            names = names[:1]  # /datasets/NAME/ is the dataset, as a base URL for its files
        if len(names) > 2:
            raise _Refused(
                HTTPStatus.BAD_REQUEST,
                f"refused: {self.path} is nested deeper than /datasets/NAME/FILE",
            )
        for name in names:
            if not is_valid_name(name):
                raise _Refused(
                    HTTPStatus.BAD_REQUEST,
                    f"refused: {name!r} is not a valid name (use letters, digits, "
                    "'.', '_' and '-', not starting with a dot)",
                )
        return names

    def dataset_folder(self, name):
        folder = self.inside_root(self.server.served.root / name)
        if not folder.is_dir():
            raise _Refused(HTTPStatus.NOT_FOUND, f"no dataset named {name!r}")
        return folder

    def inside_root(self, path):
        """``path``, unless a symbolic link takes it outside the served root: then a 403."""
        root = self.server.served.root
        if not inside(path, root):
            raise _Refused(HTTPStatus.FORBIDDEN, f"refused: {path.name!r} leads outside the store")
        return path

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
            datasets = [
                {"name": entry.name, "files": len(files), "bytes": sum(f["bytes"] for f in files)}
                for entry in sorted(root.iterdir())
                if is_valid_name(entry.name) and entry.is_dir() and inside(entry, root)
                for files in [list_files(entry, root)]
            ]
            return self.send_json(HTTPStatus.OK, {"datasets": datasets})
        folder = self.dataset_folder(names[0])
        if len(names) == 1:
            files = list_files(folder, root)
            return self.send_json(HTTPStatus.OK, {"name": names[0], "files": files})
        path = self.inside_root(folder / names[1])
        if not is_file(path):
            raise _Refused(HTTPStatus.NOT_FOUND, f"no file {names[1]!r} in dataset {names[0]!r}")
        self.send_file(path, send_body)

    def post(self, names):
        if names:
            raise _Refused(
                HTTPStatus.METHOD_NOT_ALLOWED, 'POST only to /datasets, with {"name": ...}'
            )
        document = self.read_json()
        name = document.get("name") if isinstance(document, dict) else None
        if not is_valid_name(name):
            raise _Refused(
                HTTPStatus.BAD_REQUEST,
                f"refused: {name!r} is not a valid dataset name (send "
                "{\"name\": \"...\"} with letters, digits, '.', '_', '-')",
            )
        try:
            (self.server.served.root / name).mkdir()
        except FileExistsError:
            raise _Refused(
                HTTPStatus.CONFLICT, f"a dataset named {name!r} exists already"
            ) from None
        self.send_json(
            HTTPStatus.CREATED, {"name": name, "files": []}, {"Location": f"/datasets/{name}"}
        )

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
            raise _Refused(
                HTTPStatus.LENGTH_REQUIRED,
                "send a Content-Length; chunked bodies are not accepted",
                True,
            )
        values = self.headers.get_all("Content-Length") or []
        if not values:
            raise _Refused(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required")
        if len(values) > 1:
            raise _Refused(
                HTTPStatus.BAD_REQUEST,
                f"{len(values)} Content-Length headers: send one",
                close=True,
            )
        value = values[0].strip()
        if not LENGTH.fullmatch(value):
            raise _Refused(
                HTTPStatus.BAD_REQUEST,
                f"Content-Length {value[:40]!r} is not a number of bytes (ASCII digits)",
                close=True,
            )
        if int(value) > limit:
            raise _Refused(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"{int(value):,} bytes is more than this server accepts ({limit:,})",
                close=True,
            )
        return int(value)

    def put(self, names):
        service = self.server.served
        if len(names) != 2:
            raise _Refused(HTTPStatus.METHOD_NOT_ALLOWED, "PUT only to /datasets/NAME/FILE")
        folder = self.dataset_folder(names[0])
        length = self.declared_length(service.max_upload)
        target = folder / names[1]
        existed = is_file(target)
        try:
            # a hidden temporary name until every byte arrived
            with written_atomically(target) as file:
                self.receive(file, length, service.bandwidth)
        except ConnectionError as error:
            raise _Refused(
                HTTPStatus.BAD_REQUEST, f"upload incomplete: {error}", close=True
            ) from None
        status = HTTPStatus.OK if existed else HTTPStatus.CREATED
        self.send_json(
            status,
            {"name": names[1], "bytes": length},
            {"Location": f"/datasets/{names[0]}/{names[1]}"},
        )

    def receive(self, file, length, bandwidth):
        started, received = time.perf_counter(), 0
        while received < length:
            chunk = self.rfile.read(min(CHUNK, length - received))
            if not chunk:
                raise ConnectionError(
                    f"the client sent {received:,} of the {length:,} bytes it declared"
                )
            file.write(chunk)
            received += len(chunk)
            self.pause(bandwidth_delay(started, received, bandwidth))
        self.body_read = True


def list_files(folder, root):
    """``[{"name", "bytes"}]`` of the files of one dataset folder, sorted; temporary uploads, and
    links that lead outside ``root`` (which a GET refuses), are left out."""
    return [
        {"name": entry.name, "bytes": entry.stat().st_size}
        for entry in sorted(Path(folder).iterdir(), key=lambda entry: entry.name)
        if is_valid_name(entry.name) and entry.is_file() and inside(entry, root)
    ]


def inside(path, root):
    """Whether ``path``, its links followed, lies in ``root``."""
    return path.resolve().is_relative_to(root)


class DatasetService(ServedFolder):
    """A dataset store: datasets of files under ``root``, served with the JSON API of the module
    docstring.

    Binds to ``host`` (loopback unless told otherwise) on ``port`` (0: the OS picks one); waits
    ``latency`` s per request, caps each transfer at ``bandwidth`` bytes/s when set, and refuses
    uploads over ``max_upload`` bytes.
    """

    handler = _ServiceHandler

    def __init__(
        self,
        root,
        latency=0,
        bandwidth=None,
        host="127.0.0.1",
        port=0,
        max_upload=MAX_UPLOAD,
        verbose=False,
        process=True,
    ):
        super().__init__(root, latency, bandwidth, verbose, host, port, process)
        self._max_upload = max_upload

    max_upload = property(
        lambda self: self._max_upload,
        doc="The largest upload accepted, in bytes: fixed when the service is made (its server's "
        "process is told it once, at start), unlike ``latency`` and ``bandwidth``.",
    )

    def settings(self):
        more = {"host": self.host, "port": self.port, "max_upload": self.max_upload}
        return {**super().settings(), **more}

    def url_for(self, dataset, file=None):
        """The URL of a dataset, or of one of its files."""
        return DatasetClient(self.url).url_for(dataset, file)


class ServiceError(OSError):
    """The service refused a request; ``status`` is the HTTP status, the message the service's
    reason."""

    def __init__(self, status, message):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class DatasetClient:
    """Speak a ``DatasetService``'s API: ``datasets()``, ``create(name)``, ``files(name)``,
    ``upload(...)``, ``download(...)``, ``url_for(...)``. Keeps one connection per thread; pickles
    for worker processes."""

    def __init__(self, url, timeout=60.0):
        self.http = HttpClient(url, timeout)
        self.url = self.http.base_url

    def url_for(self, dataset, file=None):
        """``http://HOST:PORT/datasets/NAME/`` or ``.../NAME/FILE``."""
        path = f"datasets/{urllib.parse.quote(dataset, safe='')}/"
        return self.url + path + (urllib.parse.quote(file, safe="") if file is not None else "")

    def request(self, method, path, body=None, headers=None):
        """``(status, body)`` of one request (``HttpClient.request`` says when it is repeated); any
        status but a success (2xx) raises ``ServiceError``: an error, and also a redirect (from a
        proxy, say), whose page is not what was asked for."""
        response, data = self.http.request(method, self.url + path, body, headers)
        if not 200 <= response.status < 300:
            try:
                message = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                message = data.decode("utf-8", "replace")
            if 300 <= response.status < 400:
                message = f"redirected to {response.getheader('Location')}, not followed"
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
        """Store ``data`` (bytes, or a local path to send) as ``file`` in ``dataset``; returns the
        file's URL."""
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(data, (str, Path)):
            with open(data, "rb") as body:
                headers["Content-Length"] = str(os.fstat(body.fileno()).st_size)
                self.request("PUT", self._path(dataset, file), body, headers)
        else:
            self.request("PUT", self._path(dataset, file), bytes(data), headers)
        return self.url_for(dataset, file)

    def download(self, dataset, file, to=None):
        """The bytes of ``file``, or, with ``to``, written to that path (atomically); returns the
        path then."""
        data = self.request("GET", self._path(dataset, file))[1]
        if to is None:
            return data
        with written_atomically(to) as target:
            target.write(data)
        return Path(to)

    def _path(self, dataset, file=None):
        return self.url_for(dataset, file)[len(self.url) :]


def serve(root, latency=0, bandwidth=None, host="127.0.0.1", port=8080, max_upload=MAX_UPLOAD):
    """Run a ``DatasetService`` in the foreground until interrupted (``packdata serve``)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    service = DatasetService(root, latency, bandwidth, host, port, max_upload, True, process=False)
    with service:
        print(
            f"serving datasets from {service.root} at {service.url}datasets (Ctrl-C stops)",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
