"""PyTorch datasets over encoded JPEGs: one file per sample on disk, or one GET per sample over HTTP.

Every dataset here reads a sample's raw bytes with ``read_bytes(index)`` and hands them to the
same ``decode_image``, so formats differ only in *how the bytes arrive*, never in how they decode.
"""

import http.client
import io
import os
import threading
import urllib.parse
from http import HTTPStatus
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from .data import load_manifest

DECODERS = ("pil", "torchvision")
JPEG_SUFFIXES = (".jpg", ".jpeg")


def decode_image(data, decoder="pil"):
    """Decode JPEG bytes into an RGB ``uint8`` tensor of shape (3, H, W)."""
    if decoder == "pil":
        with Image.open(io.BytesIO(data)) as image:
            return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1).contiguous()
    if decoder == "torchvision":
        from torchvision.io import ImageReadMode, decode_jpeg  # on first use: importing torchvision slows worker start

        return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    raise ValueError(f"unknown decoder {decoder!r}; choose one of {DECODERS}")


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
        if path.suffix.lower() in JPEG_SUFFIXES
    ]
    return classes, rows


class HttpClient:
    """GETs against one ``http://`` base URL over keep-alive connections: one per process and thread,
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
        url = self.url_for(relpath)
        for attempt in (1, 2):
            connection = self._connection()
            try:
                connection.request("GET", urllib.parse.urlsplit(url).path)
                response = connection.getresponse()
                body = response.read()
                break
            except (http.client.HTTPException, ConnectionError) as error:
                connection.close()  # e.g. the server dropped an idle keep-alive connection: reconnect once
                if attempt == 2:
                    raise ConnectionError(f"GET {url} failed: {error!r}") from error
        if response.status != HTTPStatus.OK:
            kind = FileNotFoundError if response.status == HTTPStatus.NOT_FOUND else OSError
            raise kind(f"GET {url} failed: HTTP {response.status} {response.reason}")
        return body

    def _connection(self):
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
        image = decode_image(self.read_bytes(index), self.decoder)
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[index]

    def read_bytes(self, index):
        """The encoded bytes of sample ``index``."""
        raise NotImplementedError


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
