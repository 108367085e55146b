"""The HTTP layer of the readers: a keep-alive client, a seekable file over Range requests, file
versions.

    client = HttpClient("http://127.0.0.1:8080/")
    client.get("shapes/train-000000.tar")  # the whole body; 404 is FileNotFoundError
    client.get_range("shapes/train.tar", 512, 1024)  # one Range GET
    zipfile.ZipFile(HttpRangeFile("http://127.0.0.1:8080/shapes/train.zip"))

Every error names the request. A server that sends ``file_etag`` (both servers of the course do)
lets a reader ask for the version of a file it indexed, so a file replaced meanwhile raises
``FileChangedError`` instead of handing out bytes from the wrong offsets.
"""

import http.client
import io
import os
import threading
import urllib.parse
from http import HTTPStatus
from pathlib import PurePosixPath

from .perprocess import PerProcessHandle
from .presigned import withheld


def is_url(source):
    """True when ``source`` names something on an HTTP server rather than a local path."""
    return str(source).startswith("http://")


def file_name(source):
    """The file name of a local path or of a URL's path (a presigned URL's query left out)."""
    source = str(source)
    return PurePosixPath(urllib.parse.urlsplit(source).path if is_url(source) else source).name


# sending one twice does no more than once
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE"})


def describe_request(method, url, headers=None):
    """How error messages name a request: ``GET http://...``, and its ``Range`` when it has one."""
    return " ".join(
        [method, url, *[value for name, value in (headers or {}).items() if name == "Range"]]
    )


def _target(url):
    """What a request line names for ``url``: its path, and its query when it has one."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path


class FileChangedError(OSError):
    """An archive changed after its index was read: the offsets no longer point at its members."""


def _check_part(response, url, start, etag):
    """A 206 answer is the part asked for, of the version asked for, as far as its headers say:
    ``Content-Range`` starts at ``start``, and its ``ETag`` (when both sides have one) is ``etag``
    (compared weakly: a proxy that ignores ``If-Match`` still labels what it sends)."""
    where = response.getheader("Content-Range", "")
    if not where.startswith(f"bytes {start}-"):
        raise OSError(
            f"GET {url}: asked for bytes from offset {start}, the server sent {where or 'a part'} "
            "(Content-Range): refusing bytes from another place"
        )
    sent = response.getheader("ETag")
    if etag and sent and sent.removeprefix("W/") != etag.removeprefix("W/"):
        raise FileChangedError(
            f"{url} changed after it was opened (it was version {etag}, the server sent {sent}): "
            "open it again, e.g. build the dataset anew"
        )


class HttpClient:
    """Requests against one ``http://`` base URL over keep-alive connections: one per process and
    thread, opened on first use. Pickles as plain data, so DataLoader workers (fork or spawn) each
    open their own."""

    def __init__(self, base_url, timeout=30.0):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected an http:// base URL, got {base_url!r}")
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.timeout = timeout
        # this process's connections, one per thread
        self._local = PerProcessHandle(threading.local)

    def url_for(self, relpath):
        """The URL of ``relpath`` under the base URL."""
        return self.base_url + urllib.parse.quote(relpath)

    def get(self, relpath, query=""):
        """The body of one GET, with ``query`` (what follows ``?`` in a URL, a presigned URL's
        signature say) sent as it is; errors name the URL and the HTTP status (404 is a
        ``FileNotFoundError``)."""
        return self._expect("GET", relpath, {}, HTTPStatus.OK, query)[1]

    def get_range(self, relpath, start, length, etag=None):
        """``length`` bytes of ``relpath`` from offset ``start``, with one Range GET (none when
        length is 0). With ``etag`` (the version the offsets were read from) the server refuses
        another version of the file: ``FileChangedError`` instead of bytes from the wrong place. A
        weak ``W/`` ETag is not sent: ``If-Match`` compares strongly, so it would never match."""
        if length == 0:
            return b""
        headers = {"Range": f"bytes={start}-{start + length - 1}"}
        if etag and not etag.startswith("W/"):
            headers["If-Match"] = etag
        response, body = self._expect("GET", relpath, headers, HTTPStatus.PARTIAL_CONTENT)
        _check_part(response, self.url_for(relpath), start, etag)
        if len(body) != length:
            raise OSError(
                f"GET {self.url_for(relpath)} returned {len(body)} of the {length} bytes asked for "
                f"at offset {start}: the file is shorter than expected"
            )
        return body

    def head(self, relpath):
        """The response to one HEAD request: ``Content-Length``, ``ETag`` and the other headers of
        ``relpath``."""
        return self._expect("HEAD", relpath, {}, HTTPStatus.OK)[0]

    def request(self, method, url, body=None, headers=None):
        """``(response, body)`` of one request for ``url`` (under the base URL), whatever its
        status.

        A connection the server dropped (an idle keep-alive one, say) is reopened and the request
        sent once more, but only when sending it twice cannot do more than once: an idempotent
        method whose body is None or bytes. Any other request (a POST, or a body read from a file)
        goes out on a fresh connection and is never repeated. A failure to talk to the server raises
        ``ConnectionError``, or ``TimeoutError`` after ``timeout`` s without an answer, naming the
        request.
        """
        repeatable = method in IDEMPOTENT_METHODS and (body is None or isinstance(body, bytes))
        connection = self.connection()
        if not repeatable:
            # a kept-alive connection may be dropped under the request, which cannot be resent
            connection.close()
        for attempt in (1, 2):
            try:
                try:
                    connection.request(method, _target(url), body=body, headers=headers or {})
                except ConnectionError:
                    if connection.sock is None:
                        raise  # no connection at all
                    # else the server may have answered (a 413, say) and hung up while the body was
                    # still going out
                response = connection.getresponse()
                return response, response.read()
            except (http.client.HTTPException, OSError) as error:
                connection.close()
                what = describe_request(method, url, headers)
                if isinstance(error, TimeoutError):
                    raise TimeoutError(
                        f"{what} failed: no answer within {self.timeout} s"
                    ) from error
                if attempt == 2 or not repeatable:
                    raise ConnectionError(f"{what} failed: {error!r}") from error

    def _expect(self, method, relpath, headers, expected_status, query=""):
        """``(response, body)`` of one request that must answer ``expected_status``; errors name the
        request."""
        url = self.url_for(relpath) + (f"?{query}" if query else "")
        response, body = self.request(method, url, headers=headers)
        if response.status == HTTPStatus.PRECONDITION_FAILED and "If-Match" in headers:
            raise FileChangedError(
                f"{url} changed after it was opened (it was version {headers['If-Match']}, it is "
                f"now {response.getheader('ETag')}): open it again, e.g. build the dataset anew"
            )
        if response.status != expected_status:
            kind = FileNotFoundError if response.status == HTTPStatus.NOT_FOUND else OSError
            raise kind(
                f"{describe_request(method, url, headers)} failed: HTTP {response.status} "
                f"{response.reason}"
            )
        return response, body

    def connection(self):
        """This process's and thread's connection to the server, opened on first use here (a forked
        child never uses its parent's socket)."""
        local = self._local.get()
        if not hasattr(local, "connection"):
            parts = urllib.parse.urlsplit(self.base_url)
            local.connection = http.client.HTTPConnection(
                parts.hostname, parts.port, timeout=self.timeout
            )
        return local.connection


class HttpRangeFile(io.RawIOBase):
    """A read-only, seekable file over ``http://`` (e.g. an archive on a ``NetworkStore``), enough
    for ``zipfile.ZipFile`` or ``tario.iter_members``. Opening it costs one HEAD (for the size); a
    read that the buffer cannot answer costs one Range GET of at least ``read_ahead`` bytes.
    ``etag`` is the server's validator of the file's version, from the same HEAD (None when it sends
    none); every read asks for that version (``If-Match``), so a file replaced meanwhile raises
    ``FileChangedError``."""

    def __init__(self, url, read_ahead=64 * 1024, timeout=30.0):
        super().__init__()
        if urllib.parse.urlsplit(url).query:
            raise ValueError(
                f"{withheld(url)}: range reads here take a URL without a query, and a presigned "
                "URL's signature would be lost; read the object through s3fs, or download it whole"
            )
        base_url, _, quoted_relpath = url.rpartition("/")
        self.name = url
        self.client = HttpClient(base_url + "/", timeout)
        self.relpath = urllib.parse.unquote(quoted_relpath)
        response = self.client.head(self.relpath)
        self.size, self.etag = int(response.getheader("Content-Length")), response.getheader("ETag")
        self.read_ahead = read_ahead
        self._position = 0
        self._buffer_start, self._buffer = 0, b""

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._position

    def seek(self, offset, whence=os.SEEK_SET):
        position = (
            offset + {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self.size}[whence]
        )
        if position < 0:
            raise ValueError(f"cannot seek to {position}, before the start of {self.name}")
        self._position = position
        return position

    def close(self):
        """Close the file and its connection to the server (which would keep a server thread
        waiting for the next request)."""
        if not self.closed:
            self.client.connection().close()
        super().close()

    def read(self, size=-1):
        if self.closed:
            raise ValueError(f"read from {self.name}, which is closed")
        end = self.size if size is None or size < 0 else min(self._position + size, self.size)
        if end <= self._position:
            return b""
        if not self._buffer_start <= self._position or end > self._buffer_start + len(self._buffer):
            length = min(max(end - self._position, self.read_ahead), self.size - self._position)
            self._buffer = self.client.get_range(self.relpath, self._position, length, self.etag)
            self._buffer_start = self._position
        data = self._buffer[self._position - self._buffer_start : end - self._buffer_start]
        self._position = end
        return data


def file_etag(size, mtime_ns):
    """The ``ETag`` the servers send for a file of ``size`` bytes last modified at ``mtime_ns``: a
    new version of the file, even one of the same size, gets another."""
    return f'"{size:x}-{mtime_ns:x}"'
