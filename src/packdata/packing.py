"""Pack a dataset folder into one archive: an uncompressed ZIP, or a tar in webdataset layout.

Both archives hold the same payloads in key order: ``<key>.jpg`` (the source JPEG, bit for bit) or
``<key>.npy`` (the decoded ``uint8`` HWC array, ``payload="raw"``), optionally resized once, here, at
packing time. A manifest member records the classes and, per sample, key, label, size and SHA-256 of
the stored payload. Member order and every timestamp and owner field are fixed, so the same input
gives a byte-identical archive; an archive appears under its name only once it is complete.

    pack_zip(root, "/tmp/train.zip")        # <key>.jpg ... then manifest.json
    pack_tar(root, "/tmp/train.tar")        # __manifest__, then <key>.jpg, <key>.cls, ...
"""

import hashlib
import io
import json
import shutil
import tarfile
import tempfile
import zipfile
from operator import itemgetter
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from .data import encode_jpeg, load_manifest, manifest_digest, parse_versioned_json
from .tario import written_atomically

PAYLOADS = {"jpeg": ".jpg", "raw": ".npy"}
ARCHIVE_FORMAT = "packdata-archive"
ARCHIVE_VERSION = 1
ZIP_MANIFEST = "manifest.json"
TAR_MANIFEST = "__manifest__"  # webdataset skips members named __*__, so its readers never see this one
RESIZE_FILTER = Image.Resampling.BICUBIC
FIXED_MTIME = 1_577_836_800  # 2020-01-01 00:00:00 UTC, on every member of every archive
FIXED_ZIP_TIME = (2020, 1, 1, 0, 0, 0)
END_OF_TAR = bytes(2 * tarfile.BLOCKSIZE)


# --- what goes into an archive ---------------------------------------------------------------------


def encode_payload(jpeg, payload="jpeg", resize=None):
    """The bytes to store for one source JPEG: the JPEG itself; or, resized to ``resize``×``resize``, re-encoded
    at the dataset's JPEG quality; or (``payload="raw"``) the decoded ``uint8`` HWC array as ``.npy`` bytes."""
    if payload == "jpeg" and resize is None:
        return jpeg
    with Image.open(io.BytesIO(jpeg)) as image:
        image = image.convert("RGB")
    if resize is not None:
        image = image.resize((resize, resize), RESIZE_FILTER)
    if payload == "jpeg":
        return encode_jpeg(image)
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(image))
    return buffer.getvalue()


def iter_payloads(root, samples, payload="jpeg", resize=None):
    """Yield ``(key, label, payload bytes)`` for manifest ``samples`` of the dataset at ``root``, in key order."""
    for sample in sorted(samples, key=itemgetter("key")):
        source = (Path(root) / sample["path"]).read_bytes()
        yield sample["key"], sample["label"], encode_payload(source, payload, resize)


def checked_suffix(payload, resize):
    """The member suffix of ``payload``; refuses unknown payloads and sizes that are not positive ints."""
    if payload not in PAYLOADS:
        raise ValueError(f"unknown payload {payload!r}; choose one of {tuple(PAYLOADS)}")
    if resize is not None and (not isinstance(resize, int) or isinstance(resize, bool) or resize < 1):
        raise ValueError(f"resize must be None or a positive number of pixels, got {resize!r}")
    return PAYLOADS[payload]


def _start_packing(root, archive, payload, resize, progress):
    """``(member suffix, source manifest, payloads)`` of one packing run; the payloads show a progress bar."""
    suffix = checked_suffix(payload, resize)
    source = load_manifest(root)
    payloads = iter_payloads(root, source["samples"], payload, resize)
    bar = tqdm(payloads, total=len(source["samples"]), desc=Path(archive).name, unit="img", disable=not progress)
    return suffix, source, bar


def _manifest_entry(key, label, data):
    return {"key": key, "label": label, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _archive_manifest(root, source, payload, resize, entries):
    """The manifest member's bytes: what was packed, how, and from which dataset (``source``, its manifest)."""
    manifest = {
        "format": ARCHIVE_FORMAT,
        "version": ARCHIVE_VERSION,
        "payload": payload,
        "suffix": PAYLOADS[payload],
        "resize": None if resize is None else {"size": resize, "filter": RESIZE_FILTER.name.lower()},
        "source_manifest_sha256": manifest_digest(root),
        "classes": source["classes"],
        "samples": entries,
    }
    return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode("utf-8")


def parse_archive_manifest(data, where):
    """The decoded manifest member of a packed archive; errors name ``where`` (the archive and member)."""
    return parse_versioned_json(data, where, ARCHIVE_FORMAT, ARCHIVE_VERSION)


def split_member(name):
    """``(key, extension)`` of a member name as webdataset groups them: the extension starts at the first dot
    of the file name, so ``"a/000001.seg.png"`` gives ``("a/000001", "seg.png")``."""
    folder, _, file_name = name.rpartition("/")
    stem, _, extension = file_name.partition(".")
    return f"{folder}/{stem}" if folder else stem, extension


# --- the two archive formats -----------------------------------------------------------------------


def _add_zip_member(zip_file, name, data):
    info = zipfile.ZipInfo(name, date_time=FIXED_ZIP_TIME)
    info.create_system = 3  # Unix, wherever the archive is written
    info.external_attr = 0o644 << 16
    zip_file.writestr(info, data, compress_type=zipfile.ZIP_STORED)


def pack_zip(root, archive, *, payload="jpeg", resize=None, progress=True):
    """Pack the dataset at ``root`` into an uncompressed ZIP: ``<key><suffix>`` in key order, then
    ``manifest.json``. ``resize=n`` stores every image resized to n×n. Returns the archive's path."""
    suffix, source, payloads = _start_packing(root, archive, payload, resize, progress)
    entries = []
    with written_atomically(archive) as file, zipfile.ZipFile(file, "w", zipfile.ZIP_STORED) as zip_file:
        for key, label, data in payloads:
            _add_zip_member(zip_file, key + suffix, data)
            entries.append(_manifest_entry(key, label, data))
        _add_zip_member(zip_file, ZIP_MANIFEST, _archive_manifest(root, source, payload, resize, entries))
    return Path(archive)


def tar_member(name, data):
    """One ustar member, header and padded data, with every field that could vary fixed."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, FIXED_MTIME
    info.uid, info.gid, info.uname, info.gname = 0, 0, "", ""
    padding = bytes(-len(data) % tarfile.BLOCKSIZE)
    return info.tobuf(tarfile.USTAR_FORMAT) + data + padding


def pack_tar(root, archive, *, payload="jpeg", resize=None, progress=True):
    """Pack the dataset at ``root`` into a tar in webdataset layout: ``__manifest__`` first, then per sample in
    key order ``<key><suffix>`` and ``<key>.cls`` (the label in ASCII digits). Returns the archive's path.

    The manifest needs every payload's hash before it can be written first, so the samples are spooled to
    an anonymous temporary file next to the archive and copied in behind it.
    """
    archive = Path(archive)
    suffix, source, payloads = _start_packing(root, archive, payload, resize, progress)
    entries = []
    with written_atomically(archive) as file, tempfile.TemporaryFile(dir=archive.parent) as samples:
        for key, label, data in payloads:
            samples.write(tar_member(key + suffix, data))
            samples.write(tar_member(f"{key}.cls", str(label).encode("ascii")))
            entries.append(_manifest_entry(key, label, data))
        file.write(tar_member(TAR_MANIFEST, _archive_manifest(root, source, payload, resize, entries)))
        samples.seek(0)
        shutil.copyfileobj(samples, file)
        file.write(END_OF_TAR)
    return archive
