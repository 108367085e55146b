"""PyTorch datasets over encoded images: one file per sample on disk, one GET per sample over HTTP,
or members of one packed archive (ZIP or tar, see ``packing``) on disk or over HTTP Range requests.

Every dataset here reads a sample's raw bytes with ``read_bytes(index)`` and hands them to the
same ``decode_image``, so formats differ only in *how the bytes arrive*, never in how they decode.
"""

import json
import os
import zipfile
from functools import partial
from pathlib import Path

from torch.utils.data import Dataset

from .fields import image_field
from .httpclient import FileChangedError, HttpClient, HttpRangeFile, file_etag, is_url
from .imagefolder import load_manifest, samples_from_folders, samples_from_manifest
from .images import ENCODED_IMAGES, check_decoder, decode_image
from .layout import split_member
from .packing import TAR_MANIFEST, ZIP_MANIFEST, parse_archive_manifest
from .perprocess import PerProcessHandle
from .tarindex import INDEX_SUFFIX, current_members, index_members, load_index
from .tario import pread_exactly


class EncodedImageDataset(Dataset):
    """Map-style dataset of JPEG samples; a subclass says where the bytes come from in
    ``read_bytes``.

    Items are ``(image, label)``: the image is a ``uint8`` CHW tensor, passed through ``transform``
    if given. ``sample_bytes`` holds each sample's encoded size, so a benchmark can report MB/s.
    """

    def __init__(self, classes, rows, transform=None, decoder="pil"):
        check_decoder(decoder)
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
        # how PIL, numpy and TorchCodec say "not an image"
        except (OSError, ValueError, RuntimeError) as error:
            raise ValueError(
                f"cannot decode {self.describe(index)} as an image: {error}"
            ) from error
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
    """One JPEG file per sample under ``root/<class>/``; order and labels from ``manifest.json``
    when present."""

    def __init__(self, root, transform=None, decoder="pil"):
        self.root = Path(os.path.abspath(root))  # the same folder after a chdir, in every worker
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


def member_of(archive, name):
    """How error messages name a member of an archive."""
    return f"member {name!r} of {archive}"


def brief(message, limit=300):
    """``message`` cut to ``limit`` characters: a reader's error can quote thousands of bytes it
    read in the wrong place (``zipfile`` quotes a local header's whole file name)."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]} … ({len(message):,} characters in all)"


def labels_by_key(manifest):
    """``{key: label}`` of an archive manifest written by ``packing``."""
    return {sample["key"]: sample["label"] for sample in manifest["samples"]}


def rows_from_members(archive, sizes, labels, labels_from):
    """One row ``(image member, label, bytes)`` per sample with an image (``fields.image_field``),
    in name order, given ``sizes`` (member → bytes) and ``labels`` (key → label); a sample without
    a label raises ``LookupError``. Other members of a sample (``.json``, a ``.npy`` feature) are
    not rows of their own."""
    samples = {}
    for name, size in sorted(sizes.items()):
        key, extension = split_member(name)
        samples.setdefault(key, {})[extension] = (name, size)
    rows = []
    for key, members in samples.items():
        image = image_field(list(members))
        if image is None:
            continue
        name, size = members[image]
        if key not in labels:
            raise LookupError(
                f"{member_of(archive, name)} has no label: nothing for key {key!r} in {labels_from}"
            )
        rows.append((name, labels[key], size))
    _check_every_label_has_an_image(archive, samples, labels, labels_from, len(rows))
    return rows


def _check_every_label_has_an_image(archive, samples, labels, labels_from, images):
    """A sample that ``labels_from`` lists must not vanish for lack of an image member."""
    if images == len(labels):
        return
    lost = sorted(key for key in labels if image_field(list(samples.get(key, {}))) is None)
    members = sorted(samples.get(lost[0], {}))
    raise LookupError(
        f"{archive}: {len(lost)} sample(s) of {labels_from} have no image member to read, the "
        f"first key {lost[0]!r} (its members: {', '.join(members) or 'none'}); images are "
        f"{', '.join(sorted(ENCODED_IMAGES))} or npy"
    )


def open_zip(archive, version=None):
    """A ``zipfile.ZipFile`` of ``archive`` (a path or an ``http://`` URL), with a local
    ``version`` (``version_of``) only if the file is still that one (else ``FileChangedError``); a
    file that is not a readable ZIP raises ``BadZipFile`` naming it."""
    if is_url(archive):
        source = HttpRangeFile(archive)
    elif version is None:
        source = archive
    else:
        source = version[0]
        check_version(source, *version)  # ZipFile then opens (and closes) the file itself
    try:
        return zipfile.ZipFile(source)
    except zipfile.BadZipFile as error:
        raise zipfile.BadZipFile(
            f"{archive} is not a readable ZIP (corrupt or truncated): {error}"
        ) from error


class ZipDataset(EncodedImageDataset):
    """The samples of a ZIP written by ``pack_zip`` (a path or an ``http://`` URL), read at random
    through the ZIP's central directory; classes and labels from its ``manifest.json`` member.

    Its one ZIP handle is opened in ``__init__``: fine without workers, broken with them (lesson 3
    shows how); ``WorkerSafeZipDataset`` is the fix.
    """

    def __init__(self, archive, transform=None, decoder="pil"):
        self.archive = str(archive)
        # one handle, opened here: DataLoader workers would share it
        self.zip_file = open_zip(self.archive)
        super().__init__(*self._samples(), transform, decoder)

    def _samples(self):
        """``(classes, rows)`` from the ZIP's central directory and its manifest member."""
        sizes, offsets = {}, {}
        for info in self.zip_file.infolist():
            if info.filename in sizes:  # the central directory would read only one of them
                raise zipfile.BadZipFile(
                    f"{self.archive}: duplicate member {info.filename!r}, at offsets "
                    f"{offsets[info.filename]} and {info.header_offset}"
                )
            sizes[info.filename], offsets[info.filename] = info.file_size, info.header_offset
        if ZIP_MANIFEST not in sizes:
            raise LookupError(
                f"{self.archive} has no {ZIP_MANIFEST} member: it was not written by pack_zip"
            )
        manifest = parse_archive_manifest(
            self.read_member(ZIP_MANIFEST), member_of(self.archive, ZIP_MANIFEST)
        )
        return manifest["classes"], rows_from_members(
            self.archive, sizes, labels_by_key(manifest), ZIP_MANIFEST
        )

    def read_member(self, name):
        """The bytes of member ``name``, their CRC checked."""
        try:
            return self.zip_file.read(name)
        except zipfile.BadZipFile as error:
            reason = brief(str(error))
            raise zipfile.BadZipFile(f"{member_of(self.archive, name)}: {reason}") from error
        except KeyError:
            raise FileChangedError(
                f"{member_of(self.archive, name)} is not in the archive: did it change after the "
                "dataset was built?"
            ) from None

    def read_bytes(self, index):
        return self.read_member(self.paths[index])

    def describe(self, index):
        return member_of(self.archive, self.paths[index])


class WorkerSafeZipDataset(ZipDataset):
    """``ZipDataset`` that DataLoader workers can use under every start method: ``zip_file`` is the
    calling process's own ``ZipFile``, opened there on first use
    (``perprocess.PerProcessHandle``), so a forked worker never reads through its parent's, and
    pickling (``spawn``, ``forkserver``) carries only the path."""

    def __init__(self, archive, transform=None, decoder="pil"):
        self.archive = str(archive)
        version = version_of(self.archive)  # each process checks it opens this one
        self._zip = PerProcessHandle(partial(open_zip, self.archive, version))
        # ZipDataset's would open a handle
        EncodedImageDataset.__init__(self, *self._samples(), transform, decoder)

    @property
    def zip_file(self):
        """This process's ``ZipFile``, opened on its first use here."""
        return self._zip.get()


def remote_tar_index(remote):
    """The member index of the tar behind ``remote`` (an ``HttpRangeFile``): its ``<url>.idx.json``
    when that describes this version of the tar, else built by reading every header with range
    reads.

    The index records the size and mtime of the tar it was built from (``tario.build_index``); a
    ``NetworkStore`` or ``DatasetService`` sends those in the tar's ``ETag`` (``store.file_etag``).
    An index whose tar had another version is stale, as is every index from a server that sends no
    such ``ETag``.
    """
    try:
        stored = json.loads(remote.client.get(remote.relpath + INDEX_SUFFIX))
    except (FileNotFoundError, ValueError):  # no index, or not JSON
        stored = None
    members = current_members(stored, remote.size)
    if members is not None and remote.etag == file_etag(remote.size, stored["tar_mtime_ns"]):
        return members
    return index_members(remote, remote.name)


def version_of(path):
    """``(absolute path, size, modification time)`` of a local file, None for a URL: what
    ``open_version`` checks (absolute, so that a worker finds the same file after a chdir)."""
    if is_url(path):
        return None
    stat = os.stat(path)
    return os.path.abspath(path), stat.st_size, stat.st_mtime_ns


def open_version(path, size, mtime_ns):
    """``path`` opened unbuffered for reading, when it is still the version of ``size`` bytes last
    modified at ``mtime_ns``; else ``FileChangedError``."""
    file = open(path, "rb", buffering=0)  # noqa: SIM115 (returned open: the caller closes it)
    try:
        check_version(file.fileno(), path, size, mtime_ns)
    except FileChangedError:
        file.close()
        raise
    return file


def check_version(file, path, size, mtime_ns):
    """``FileChangedError`` unless ``file`` (``path`` itself, or its open descriptor: a file
    written over in place keeps it open) is still of ``size`` bytes, last modified at ``mtime_ns``
    (one ``stat``)."""
    stat = os.stat(file)
    if (stat.st_size, stat.st_mtime_ns) != (size, mtime_ns):
        raise FileChangedError(
            f"{path} changed after it was indexed (size or modification time differ): "
            "build the dataset anew"
        )


class IndexedTarDataset(EncodedImageDataset):
    """The samples of a tar (``pack_tar``'s, or a webdataset shard; a path or an ``http://`` URL),
    read at random through its member index: one ``pread`` per sample on disk (after an ``fstat``
    that finds the tar written over in place), one Range GET over HTTP. Safe with DataLoader
    workers under every start method: each process opens the tar itself
    (``perprocess.PerProcessHandle``).

    A local tar's index is ``<tar>.idx.json``, rebuilt when stale (``tario.load_index``). Classes
    and labels come from the ``__manifest__`` member when there is one, else from each sample's
    ``.cls`` member (one read each; classes are then None).
    """

    def __init__(self, tar_path, transform=None, decoder="pil"):
        self.tar_path = str(tar_path)
        if is_url(self.tar_path):
            remote = HttpRangeFile(self.tar_path)
            self.client, self.relpath, self.etag, self._tar = (
                remote.client,
                remote.relpath,
                remote.etag,
                None,
            )
            self.members = remote_tar_index(remote)
        else:
            self.client, self.version = None, version_of(self.tar_path)
            self.members = load_index(self.tar_path)
            # each process opens its own, and checks it is the version that was indexed
            self._tar = PerProcessHandle(partial(open_version, *self.version))
        classes, labels, labels_from = self._labels()
        sizes = {name: size for name, (_, size) in self.members.items()}
        super().__init__(
            classes,
            rows_from_members(self.tar_path, sizes, labels, labels_from),
            transform,
            decoder,
        )

    def _labels(self):
        """``(classes, {key: label}, where the labels come from)``."""
        if TAR_MANIFEST in self.members:
            manifest = parse_archive_manifest(
                self.read_member(TAR_MANIFEST), member_of(self.tar_path, TAR_MANIFEST)
            )
            return manifest["classes"], labels_by_key(manifest), TAR_MANIFEST
        labels = {}
        for name in self.members:
            key, extension = split_member(name)
            if extension == "cls":
                text = self.read_member(name)
                try:
                    labels[key] = int(text)
                except ValueError:
                    raise ValueError(
                        f"{member_of(self.tar_path, name)} holds {text[:20]!r}, "
                        "not an integer label"
                    ) from None
        return None, labels, "a .cls member"

    def read_member(self, name):
        """The bytes of member ``name``: one ``pread`` (the tar's version checked first), or one
        Range GET over HTTP."""
        offset, size = self.members[name]
        if self.client is not None:
            return self.client.get_range(self.relpath, offset, size, self.etag)
        descriptor = self._tar.get().fileno()
        check_version(descriptor, self.tar_path, *self.version[1:])  # not written over since
        hint = "did it change after it was indexed?"
        return pread_exactly(descriptor, size, offset, self.tar_path, f"member {name!r}", hint)

    def read_bytes(self, index):
        return self.read_member(self.paths[index])

    def describe(self, index):
        return member_of(self.tar_path, self.paths[index])


class SharedHandleTarDataset(IndexedTarDataset):
    """``IndexedTarDataset`` read as one first writes it: one file object, opened in ``__init__``,
    a seek and a read per sample. Right without workers; with forked workers, which share the
    file's offset, a read can land in another sample's bytes, and a tar keeps no checksum of its
    data to notice: wrong bytes, no error (lesson 3). A local tar only."""

    def __init__(self, tar_path, transform=None, decoder="pil"):
        # one handle, opened here: DataLoader workers would share it
        self.file = open(tar_path, "rb")  # noqa: SIM115  held for the dataset's life
        super().__init__(tar_path, transform, decoder)

    def read_member(self, name):
        offset, size = self.members[name]
        self.file.seek(offset)
        return self.file.read(size)


class EncodedObjects(HttpDataset):
    """One GET per sample like ``HttpDataset``, but items stay ``(encoded bytes, label)``: the
    network's share of the work alone, to compare with shards streamed undecoded."""

    def __getitem__(self, index):
        return self.read_bytes(index), self.labels[index]
