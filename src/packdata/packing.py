"""Pack a dataset folder into one archive: an uncompressed ZIP, or a tar in webdataset layout.

Both archives hold the same payloads in key order: ``<key>.jpg`` (the source JPEG, bit for bit) or
``<key>.npy`` (the decoded ``uint8`` HWC array, ``payload="raw"``), optionally resized once, here,
at packing time. A manifest member records the classes and, per sample, key, label, size and SHA-256
of the stored payload. Member order and every timestamp and owner field are fixed, so the same input
gives a byte-identical archive; an archive appears under its name only once it is complete.

    pack_zip(root, "/tmp/train.zip")        # <key>.jpg ... then manifest.json
    pack_tar(root, "/tmp/train.tar")        # __manifest__, then <key>.jpg, <key>.cls, ...
"""

import hashlib
import json
import shutil
import tempfile
import zipfile
from pathlib import Path

from tqdm import tqdm

from .atomic import written_atomically
from .imagefolder import manifest_digest, parse_versioned_json
from .images import PAYLOADS, RESIZE_FILTER, checked_suffix
from .samples import FolderSamples
from .tario import END_OF_TAR, tar_member

ARCHIVE_FORMAT = "packdata-archive"
ARCHIVE_VERSION = 1
ZIP_MANIFEST = "manifest.json"
# webdataset skips members named __*__, so its readers never see this one
TAR_MANIFEST = "__manifest__"
FIXED_ZIP_TIME = (2020, 1, 1, 0, 0, 0)


# --- what goes into an archive --------------------------------------------------------------------


def _start_packing(root, archive, payload, resize, progress):
    """``(member suffix, source manifest, payloads)`` of one packing run; the payloads show a
    progress bar."""
    suffix = checked_suffix(payload, resize)
    samples = FolderSamples(root, payload, resize)
    payloads = map(samples, range(len(samples)))
    bar = tqdm(
        payloads, total=len(samples), desc=Path(archive).name, unit="img", disable=not progress
    )
    return suffix, samples.manifest, bar


def _manifest_entry(key, label, data):
    return {
        "key": key,
        "label": label,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def _archive_manifest(root, source, payload, resize, entries):
    """The manifest member's bytes: what was packed, how, and from which dataset (``source``, its
    manifest)."""
    manifest = {
        "format": ARCHIVE_FORMAT,
        "version": ARCHIVE_VERSION,
        "payload": payload,
        "suffix": PAYLOADS[payload],
        "resize": None
        if resize is None
        else {"size": resize, "filter": RESIZE_FILTER.name.lower()},
        "source_manifest_sha256": manifest_digest(root),
        "classes": source["classes"],
        "samples": entries,
    }
    return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode("utf-8")


def parse_archive_manifest(data, where):
    """The decoded manifest member of a packed archive; errors name ``where`` (the archive and
    member)."""
    return parse_versioned_json(data, where, ARCHIVE_FORMAT, ARCHIVE_VERSION)


# --- the two archive formats ----------------------------------------------------------------------


def _add_zip_member(zip_file, name, data):
    info = zipfile.ZipInfo(name, date_time=FIXED_ZIP_TIME)
    info.create_system = 3  # Unix, wherever the archive is written
    info.external_attr = 0o644 << 16
    zip_file.writestr(info, data, compress_type=zipfile.ZIP_STORED)


def pack_zip(root, archive, *, payload="jpeg", resize=None, progress=True):
    """Pack the dataset at ``root`` into an uncompressed ZIP: ``<key><suffix>`` in key order, then
    ``manifest.json``. ``resize=n`` stores every image resized to n×n. Returns the archive's path.
    Packing again into the same bytes leaves the archive as it was: a dataset opened on it in
    another notebook stays valid."""
    suffix, source, payloads = _start_packing(root, archive, payload, resize, progress)
    entries = []
    with (
        written_atomically(archive, keep_same=True) as file,
        zipfile.ZipFile(file, "w", zipfile.ZIP_STORED) as zip_file,
    ):
        for key, label, data in payloads:
            _add_zip_member(zip_file, key + suffix, data)
            entries.append(_manifest_entry(key, label, data))
        _add_zip_member(
            zip_file, ZIP_MANIFEST, _archive_manifest(root, source, payload, resize, entries)
        )
    return Path(archive)


def pack_tar(root, archive, *, payload="jpeg", resize=None, progress=True):
    """Pack the dataset at ``root`` into a tar in webdataset layout: ``__manifest__`` first, then
    per sample in key order ``<key><suffix>`` and ``<key>.cls`` (the label in ASCII digits). Returns
    the archive's path; as ``pack_zip``, packing again into the same bytes leaves it as it was.

    The manifest needs every payload's hash before it can be written first, so the samples are
    spooled to an anonymous temporary file next to the archive and copied in behind it.
    """
    archive = Path(archive)
    suffix, source, payloads = _start_packing(root, archive, payload, resize, progress)
    entries = []
    with (
        written_atomically(archive, keep_same=True) as file,
        tempfile.TemporaryFile(dir=archive.parent) as samples,
    ):
        for key, label, data in payloads:
            samples.write(tar_member(key + suffix, data))
            samples.write(tar_member(f"{key}.cls", str(label).encode("ascii")))
            entries.append(_manifest_entry(key, label, data))
        file.write(
            tar_member(TAR_MANIFEST, _archive_manifest(root, source, payload, resize, entries))
        )
        samples.seek(0)
        shutil.copyfileobj(samples, file)
        file.write(END_OF_TAR)
    return archive
