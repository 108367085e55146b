"""PyTorch datasets over encoded images: one file per sample on disk, one GET per sample over HTTP, or
members of one packed archive (ZIP or tar, see ``packing``) on disk or over HTTP Range requests.

Every dataset here reads a sample's raw bytes with ``read_bytes(index)`` and hands them to the
same ``decode_image``, so formats differ only in *how the bytes arrive*, never in how they decode.
"""

import http.client
import io
import json
import os
import threading
import urllib.parse
import zipfile
from functools import partial
from http import HTTPStatus
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from .data import load_manifest
from .handles import PerProcessHandle
from .packing import TAR_MANIFEST, ZIP_MANIFEST, parse_archive_manifest, split_member
from .store import file_etag
from .tario import INDEX_SUFFIX, TarFormatError, current_members, index_members, load_index

DECODERS = ("pil", "torchvision")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")  # encoded images, which both decoders read
PAYLOAD_SUFFIXES = (*IMAGE_SUFFIXES, ".npy")  # the members of an archive that are samples
NPY_MAGIC = b"\x93NUMPY"


def decode_image(data, decoder="pil"):
    """Decode JPEG bytes into an RGB ``uint8`` tensor of shape (3, H, W); ``.npy`` bytes (a ``uint8`` HWC
    array saved by numpy, what ``packing`` stores for ``payload="raw"``) need no decoder and ignore it."""
    if data[:len(NPY_MAGIC)] == NPY_MAGIC:
        return decode_array(data)
    if decoder == "pil":
        with Image.open(io.BytesIO(data)) as image:
            return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1).contiguous()
    if decoder == "torchvision":
        from torchvision import io as tvio  # on first use: importing torchvision slows worker start

        return tvio.decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=tvio.ImageReadMode.RGB)
    raise ValueError(f"unknown decoder {decoder!r}; choose one of {DECODERS}")


def decode_array(data):
    """A ``uint8`` (H, W, 3) array in ``.npy`` bytes as a (3, H, W) tensor."""
    array = np.load(io.BytesIO(data), allow_pickle=False)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"expected a uint8 array of shape (H, W, 3), got {array.dtype} of shape {array.shape}")
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def is_url(source):
    """True when ``source`` names something on an HTTP server rather than a local path."""
    return str(source).startswith("http://")


def samples_from_manifest(manifest):
    """``(classes, rows)`` in manifest order, each row ``(relative path, label, bytes)``."""
    rows = [(sample["path"], sample["label"], sample["bytes"]) for sample in manifest["samples"]]
    return list(manifest["classes"]), rows


def samples_from_folders(root):
    """``(classes, rows)`` the way torchvision's ImageFolder sees ``root``: sorted class folders, sorted files."""
    root = Path(root)
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    rows = [
        (f"{name}/{path.name}", label, path.stat().st_size)
        for label, name in enumerate(classes)
        for path in sorted((root / name).iterdir())
        if path.suffix.lower() in IMAGE_SUFFIXES
    ]
    return classes, rows


IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE"})  # sending one twice does no more than once


def describe_request(method, url, headers=None):
    """How error messages name a request: ``GET http://...``, and its ``Range`` when it has one."""
    return " ".join([method, url, *[value for name, value in (headers or {}).items() if name == "Range"]])


class FileChangedError(OSError):
    """An archive changed after its index was read: the offsets no longer point at its members."""


class HttpClient:
    """Requests against one ``http://`` base URL over keep-alive connections: one per process and thread,
    opened on first use. Pickles as plain data, so DataLoader workers (fork or spawn) each open their own."""

    def __init__(self, base_url, timeout=30.0):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected an http:// base URL, got {base_url!r}")
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.timeout = timeout
        self._local, self._pid = None, None

    def __getstate__(self):
        return {**self.__dict__, "_local": None, "_pid": None}

    def url_for(self, relpath):
        """The URL of ``relpath`` under the base URL."""
        return self.base_url + urllib.parse.quote(relpath)

    def get(self, relpath):
        """The body of one GET; errors name the URL and the HTTP status (404 is a ``FileNotFoundError``)."""
        return self._expect("GET", relpath, {}, HTTPStatus.OK)[1]

    def get_range(self, relpath, start, length, etag=None):
        """``length`` bytes of ``relpath`` from offset ``start``, with one Range GET (none when length is 0).
        With ``etag`` (the version the offsets were read from) the server refuses another version of the file:
        ``FileChangedError`` instead of bytes from the wrong place. A weak ``W/`` ETag is not sent: ``If-Match``
        compares strongly, so it would never match."""
        if length == 0:
            return b""
        headers = {"Range": f"bytes={start}-{start + length - 1}"}
        if etag and not etag.startswith("W/"):
            headers["If-Match"] = etag
        body = self._expect("GET", relpath, headers, HTTPStatus.PARTIAL_CONTENT)[1]
        if len(body) != length:
            raise OSError(f"GET {self.url_for(relpath)} returned {len(body)} of the {length} bytes asked for "
                          f"at offset {start}: the file is shorter than expected")
        return body

    def head(self, relpath):
        """The response to one HEAD request: ``Content-Length``, ``ETag`` and the other headers of ``relpath``."""
        return self._expect("HEAD", relpath, {}, HTTPStatus.OK)[0]

    def request(self, method, url, body=None, headers=None):
        """``(response, body)`` of one request for ``url`` (under the base URL), whatever its status.

        A connection the server dropped (an idle keep-alive one, say) is reopened and the request sent once
        more, but only when sending it twice cannot do more than once: an idempotent method whose body is
        None or bytes. Any other request (a POST, or a body read from a file) goes out on a fresh connection
        and is never repeated. A failure to talk to the server raises ``ConnectionError``, or ``TimeoutError``
        after ``timeout`` s without an answer, naming the request.
        """
        repeatable = method in IDEMPOTENT_METHODS and (body is None or isinstance(body, bytes))
        connection = self.connection()
        if not repeatable:
            connection.close()  # a kept-alive connection may be dropped under the request, which cannot be resent
        for attempt in (1, 2):
            try:
                try:
                    connection.request(method, urllib.parse.urlsplit(url).path, body=body, headers=headers or {})
                except ConnectionError:
                    if connection.sock is None:
                        raise  # no connection at all
                    # else the server may have answered (a 413, say) and hung up while the body was still going out
                response = connection.getresponse()
                return response, response.read()
            except (http.client.HTTPException, OSError) as error:
                connection.close()
                what = describe_request(method, url, headers)
                if isinstance(error, TimeoutError):
                    raise TimeoutError(f"{what} failed: no answer within {self.timeout} s") from error
                if attempt == 2 or not repeatable:
                    raise ConnectionError(f"{what} failed: {error!r}") from error

    def _expect(self, method, relpath, headers, expected_status):
        """``(response, body)`` of one request that must answer ``expected_status``; errors name the request."""
        url = self.url_for(relpath)
        response, body = self.request(method, url, headers=headers)
        if response.status == HTTPStatus.PRECONDITION_FAILED and "If-Match" in headers:
            raise FileChangedError(f"{url} changed after it was opened (it was version {headers['If-Match']}, it is "
                                   f"now {response.getheader('ETag')}): open it again, e.g. build the dataset anew")
        if response.status != expected_status:
            kind = FileNotFoundError if response.status == HTTPStatus.NOT_FOUND else OSError
            raise kind(f"{describe_request(method, url, headers)} failed: HTTP {response.status} {response.reason}")
        return response, body

    def connection(self):
        if self._pid != os.getpid():  # first use, or a forked child holding its parent's sockets
            self._local, self._pid = threading.local(), os.getpid()
        if not hasattr(self._local, "connection"):
            parts = urllib.parse.urlsplit(self.base_url)
            self._local.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.timeout)
        return self._local.connection


class EncodedImageDataset(Dataset):
    """Map-style dataset of JPEG samples; a subclass says where the bytes come from in ``read_bytes``.

    Items are ``(image, label)``: the image is a ``uint8`` CHW tensor, passed through ``transform`` if given.
    ``sample_bytes`` holds each sample's encoded size, so a benchmark can report MB/s.
    """

    def __init__(self, classes, rows, transform=None, decoder="pil"):
        if decoder not in DECODERS:
            raise ValueError(f"unknown decoder {decoder!r}; choose one of {DECODERS}")
        if not rows:
            raise ValueError(f"{type(self).__name__} has no samples")
        self.classes = classes
        self.paths, self.labels, self.sample_bytes = (list(column) for column in zip(*rows))
        self.transform = transform
        self.decoder = decoder

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        data = self.read_bytes(index)
        try:
            image = decode_image(data, self.decoder)
        except (OSError, ValueError, RuntimeError) as error:  # how PIL, numpy and torchvision say "not an image"
            raise ValueError(f"cannot decode {self.describe(index)} as an image: {error}") from error
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[index]

    def read_bytes(self, index):
        """The encoded bytes of sample ``index``."""
        raise NotImplementedError

    def describe(self, index):
        """Where sample ``index`` comes from, for error messages."""
        return self.paths[index]


class FolderDataset(EncodedImageDataset):
    """One JPEG file per sample under ``root/<class>/``; order and labels from ``manifest.json`` when present."""

    def __init__(self, root, transform=None, decoder="pil"):
        self.root = Path(root)
        if (self.root / "manifest.json").exists():
            classes, rows = samples_from_manifest(load_manifest(self.root))
        else:
            classes, rows = samples_from_folders(self.root)
        super().__init__(classes, rows, transform, decoder)

    def read_bytes(self, index):
        return (self.root / self.paths[index]).read_bytes()

    def describe(self, index):
        return str(self.root / self.paths[index])


class HttpDataset(EncodedImageDataset):
    """One GET per sample from ``base_url`` (e.g. a ``NetworkStore``), in the order of ``manifest``.

    Works with DataLoader workers under ``fork`` and ``spawn``: see ``HttpClient``.
    """

    def __init__(self, base_url, manifest, transform=None, decoder="pil", timeout=30.0):
        classes, rows = samples_from_manifest(manifest)
        super().__init__(classes, rows, transform, decoder)
        self.client = HttpClient(base_url, timeout)

    def url_for(self, index):
        """The URL sample ``index`` is fetched from."""
        return self.client.url_for(self.paths[index])

    def read_bytes(self, index):
        return self.client.get(self.paths[index])

    def describe(self, index):
        return self.url_for(index)


class HttpRangeFile(io.RawIOBase):
    """A read-only, seekable file over ``http://`` (e.g. an archive on a ``NetworkStore``), enough for
    ``zipfile.ZipFile`` or ``tario.iter_members``. Opening it costs one HEAD (for the size); a read that the
    buffer cannot answer costs one Range GET of at least ``read_ahead`` bytes. ``etag`` is the server's
    validator of the file's version, from the same HEAD (None when it sends none); every read asks for that
    version (``If-Match``), so a file replaced meanwhile raises ``FileChangedError``."""

    def __init__(self, url, read_ahead=64 * 1024, timeout=30.0):
        super().__init__()
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
        position = offset + {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self.size}[whence]
        if position < 0:
            raise ValueError(f"cannot seek to {position}, before the start of {self.name}")
        self._position = position
        return position

    def read(self, size=-1):
        end = self.size if size is None or size < 0 else min(self._position + size, self.size)
        if end <= self._position:
            return b""
        if not self._buffer_start <= self._position or end > self._buffer_start + len(self._buffer):
            length = min(max(end - self._position, self.read_ahead), self.size - self._position)
            self._buffer = self.client.get_range(self.relpath, self._position, length, self.etag)
            self._buffer_start = self._position
        data = self._buffer[self._position - self._buffer_start:end - self._buffer_start]
        self._position = end
        return data


def member_of(archive, name):
    """How error messages name a member of an archive."""
    return f"member {name!r} of {archive}"


def labels_by_key(manifest):
    """``{key: label}`` of an archive manifest written by ``packing``."""
    return {sample["key"]: sample["label"] for sample in manifest["samples"]}


def rows_from_members(archive, sizes, labels, labels_from):
    """Rows ``(member, label, bytes)`` of every sample member (a ``PAYLOAD_SUFFIXES`` name) in name order, given
    ``sizes`` (member → bytes) and ``labels`` (key → label); a sample without a label raises ``LookupError``."""
    rows = []
    for name, size in sorted(sizes.items()):
        key, extension = split_member(name)
        if f".{extension.lower()}" not in PAYLOAD_SUFFIXES:
            continue
        if key not in labels:
            raise LookupError(f"{member_of(archive, name)} has no label: nothing for key {key!r} in {labels_from}")
        rows.append((name, labels[key], size))
    return rows


def open_zip(archive):
    """A ``zipfile.ZipFile`` of ``archive`` (a path or an ``http://`` URL); a file that is not a readable ZIP
    raises ``BadZipFile`` naming it."""
    try:
        return zipfile.ZipFile(HttpRangeFile(archive) if is_url(archive) else archive)
    except zipfile.BadZipFile as error:
        raise zipfile.BadZipFile(f"{archive} is not a readable ZIP (corrupt or truncated): {error}") from error


class ZipDataset(EncodedImageDataset):
    """The samples of a ZIP written by ``pack_zip`` (a path or an ``http://`` URL), read at random through the
    ZIP's central directory; classes and labels from its ``manifest.json`` member.

    Its one ZIP handle is opened in ``__init__``: fine without workers, broken with them (lesson 3 shows
    how); ``WorkerSafeZipDataset`` is the fix.
    """

    def __init__(self, archive, transform=None, decoder="pil"):
        self.archive = str(archive)
        self.zip_file = open_zip(self.archive)  # one handle, opened here: DataLoader workers would share it
        super().__init__(*self._samples(), transform, decoder)

    def _samples(self):
        """``(classes, rows)`` from the ZIP's central directory and its manifest member."""
        sizes = {info.filename: info.file_size for info in self.zip_file.infolist()}
        if ZIP_MANIFEST not in sizes:
            raise LookupError(f"{self.archive} has no {ZIP_MANIFEST} member: it was not written by pack_zip")
        manifest = parse_archive_manifest(self.read_member(ZIP_MANIFEST), member_of(self.archive, ZIP_MANIFEST))
        return manifest["classes"], rows_from_members(self.archive, sizes, labels_by_key(manifest), ZIP_MANIFEST)

    def read_member(self, name):
        """The bytes of member ``name``, their CRC checked."""
        try:
            return self.zip_file.read(name)
        except zipfile.BadZipFile as error:
            raise zipfile.BadZipFile(f"{member_of(self.archive, name)}: {error}") from error

    def read_bytes(self, index):
        return self.read_member(self.paths[index])

    def describe(self, index):
        return member_of(self.archive, self.paths[index])


class WorkerSafeZipDataset(ZipDataset):
    """``ZipDataset`` that DataLoader workers can use under every start method: ``zip_file`` is the calling
    process's own ``ZipFile``, opened there on first use (``handles.PerProcessHandle``), so a forked worker
    never reads through its parent's, and pickling (``spawn``, ``forkserver``) carries only the path."""

    def __init__(self, archive, transform=None, decoder="pil"):
        self.archive = str(archive)
        self._zip = PerProcessHandle(partial(open_zip, self.archive))
        EncodedImageDataset.__init__(self, *self._samples(), transform, decoder)  # ZipDataset's would open a handle

    @property
    def zip_file(self):
        """This process's ``ZipFile``, opened on its first use here."""
        return self._zip.get()


def remote_tar_index(remote):
    """The member index of the tar behind ``remote`` (an ``HttpRangeFile``): its ``<url>.idx.json`` when that
    describes this version of the tar, else built by reading every header with range reads.

    The index records the size and mtime of the tar it was built from (``tario.build_index``); a
    ``NetworkStore`` or ``DatasetService`` sends those in the tar's ``ETag`` (``store.file_etag``). An index
    whose tar had another version is stale, as is every index from a server that sends no such ``ETag``.
    """
    try:
        stored = json.loads(remote.client.get(remote.relpath + INDEX_SUFFIX))
    except (FileNotFoundError, ValueError):  # no index, or not JSON
        stored = None
    members = current_members(stored, remote.size)
    if members is not None and remote.etag == file_etag(remote.size, stored["tar_mtime_ns"]):
        return members
    return index_members(remote, remote.name)


def open_version(path, size, mtime_ns):
    """``path`` opened unbuffered for reading, when it is still the version of ``size`` bytes last modified at
    ``mtime_ns``; else ``FileChangedError``."""
    file = open(path, "rb", buffering=0)
    stat = os.fstat(file.fileno())
    if (stat.st_size, stat.st_mtime_ns) != (size, mtime_ns):
        file.close()
        raise FileChangedError(f"{path} changed after it was indexed (size or modification time differ): "
                               "build the dataset anew")
    return file


class IndexedTarDataset(EncodedImageDataset):
    """The samples of a tar (``pack_tar``'s, or a webdataset shard; a path or an ``http://`` URL), read at random
    through its member index: one ``pread`` per sample on disk, one Range GET over HTTP. Safe with DataLoader
    workers under every start method: each process opens the tar itself (``handles.PerProcessHandle``).

    A local tar's index is ``<tar>.idx.json``, rebuilt when stale (``tario.load_index``). Classes and labels
    come from the ``__manifest__`` member when there is one, else from each sample's ``.cls`` member (one
    read each; classes are then None).
    """

    def __init__(self, tar_path, transform=None, decoder="pil"):
        self.tar_path = str(tar_path)
        if is_url(self.tar_path):
            remote = HttpRangeFile(self.tar_path)
            self.client, self.relpath, self.etag, self._tar = remote.client, remote.relpath, remote.etag, None
            self.members = remote_tar_index(remote)
        else:
            self.client = None
            version = os.stat(self.tar_path)
            self.members = load_index(self.tar_path)
            # each process opens its own, and checks it is the version that was indexed
            self._tar = PerProcessHandle(partial(open_version, self.tar_path, version.st_size, version.st_mtime_ns))
        classes, labels, labels_from = self._labels()
        sizes = {name: size for name, (_, size) in self.members.items()}
        super().__init__(classes, rows_from_members(self.tar_path, sizes, labels, labels_from), transform, decoder)

    def _labels(self):
        """``(classes, {key: label}, where the labels come from)``."""
        if TAR_MANIFEST in self.members:
            manifest = parse_archive_manifest(self.read_member(TAR_MANIFEST), member_of(self.tar_path, TAR_MANIFEST))
            return manifest["classes"], labels_by_key(manifest), TAR_MANIFEST
        labels = {}
        for name in self.members:
            key, extension = split_member(name)
            if extension == "cls":
                text = self.read_member(name)
                try:
                    labels[key] = int(text)
                except ValueError:
                    raise ValueError(f"{member_of(self.tar_path, name)} holds {text[:20]!r}, "
                                     "not an integer label") from None
        return None, labels, "a .cls member"

    def read_member(self, name):
        """The bytes of member ``name``: one ``pread``, or one Range GET over HTTP."""
        offset, size = self.members[name]
        if self.client is not None:
            return self.client.get_range(self.relpath, offset, size, self.etag)
        data = os.pread(self._tar.get().fileno(), size, offset)
        if len(data) != size:
            raise TarFormatError(f"{member_of(self.tar_path, name)} is truncated: {len(data)} of {size} bytes "
                                 "(the tar changed after it was indexed?)")
        return data

    def read_bytes(self, index):
        return self.read_member(self.paths[index])

    def describe(self, index):
        return member_of(self.tar_path, self.paths[index])
