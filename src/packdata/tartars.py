"""A tar of tars, as ImageNet's training set comes: one tar per class inside one big tar.

``ILSVRC2012_img_train.tar`` holds ``n01440764.tar``, ``n01443537.tar``, … (one per WordNet id),
each holding that class's ``n01440764_10026.JPEG``, …; a class's label is its id's place among
the sorted ids. Extracting it makes 1.28 million small files; this module never does. It lists the
outer tar's headers (jumping over the data), then streams each inner tar front to back
(``tario.stream_members``), from a local file or with one Range GET from an ``http://`` store,
straight into ``twopass``'s buckets.

    outer = make_tar_of_tars("data/photos-workshop", "data/archives/photos-train.tar")
    result = tar_of_tars_to_shards(outer, "data/shards-from-tars", buckets=8, maxcount=100)

A member that is not a regular file, or not a JPEG, is skipped and counted; an inner tar that is
corrupt, or a JPEG that does not belong to its class, raises ``TarFormatError`` naming the outer
tar, the inner tar and the member.
"""

import re
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .atomic import written_atomically
from .httpclient import HttpRangeFile, is_url
from .imagefolder import load_manifest
from .tario import END_OF_TAR, TarFormatError, iter_members, stream_members, tar_member
from .twopass import two_pass_shuffle

FIRST_WNID = 1440764  # ImageNet's first class, n01440764 (tench)
JPEG_EXTENSIONS = (".jpeg", ".jpg")


def wnid_of(label):
    """An ImageNet-style WordNet id for class number ``label``: ``n01440764``, ``n01440765``, …"""
    return f"n{FIRST_WNID + label:08d}"


# --- writing one ----------------------------------------------------------------------------------


def inner_tar(root, wnid, entries):
    """The bytes of one class's tar: ``<wnid>_<number>.JPEG`` for each manifest entry."""
    members = [
        tar_member(f"{wnid}_{int(entry['key'])}.JPEG", (Path(root) / entry["path"]).read_bytes())
        for entry in entries
    ]
    return b"".join(members) + END_OF_TAR


def make_tar_of_tars(root, target):
    """Write the dataset folder at ``root`` as an ImageNet-style training tar at ``target`` (one
    inner tar per class, in id order, its images in key order), atomically; return ``target``.
    One class's tar is built in memory at a time."""
    manifest = load_manifest(root)
    with written_atomically(target) as file:
        for label in range(len(manifest["classes"])):
            entries = sorted(
                (entry for entry in manifest["samples"] if entry["label"] == label),
                key=lambda entry: entry["key"],
            )
            wnid = wnid_of(label)
            file.write(tar_member(f"{wnid}.tar", inner_tar(root, wnid, entries)))
        file.write(END_OF_TAR)
    return Path(target)


# --- reading one ----------------------------------------------------------------------------------


class _Slice:
    """``size`` bytes of ``file`` from ``offset``, read front to back and no further; closing it
    closes ``file``."""

    def __init__(self, file, offset, size):
        file.seek(offset)
        self.file, self.left = file, size

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.file.close()

    def read(self, size=-1):
        size = self.left if size is None or size < 0 else min(size, self.left)
        data = self.file.read(size)
        self.left -= len(data)
        return data


@dataclass(frozen=True)
class InnerTar:
    """One class's tar inside the outer tar ``outer`` (a path or an ``http://`` URL): its member
    name, where its data starts and how long it is, and its label. A ``twopass`` input."""

    outer: str
    member: str
    offset: int
    size: int
    label: int

    @property
    def name(self):
        return f"{self.outer}: inner tar {self.member}"

    @property
    def wnid(self):
        return Path(self.member).stem

    def open(self):
        """A stream of this inner tar's bytes: the outer file sought to it, or one Range GET."""
        if is_url(self.outer):
            last = self.offset + self.size - 1
            request = urllib.request.Request(
                self.outer, headers={"Range": f"bytes={self.offset}-{last}"}
            )
            return urllib.request.urlopen(request, timeout=30)  # noqa: S310 (http:// only: is_url)
        return _Slice(open(self.outer, "rb"), self.offset, self.size)  # noqa: SIM115

    def samples(self, skipped):
        """``(key, {"jpg": bytes, "cls": label})`` of each JPEG, streamed; others counted in
        ``skipped``."""
        pattern = re.compile(rf"{re.escape(self.wnid)}_\d+")
        with self.open() as stream:
            for header, data in stream_members(stream, self.name):
                if not header.is_file:
                    skipped["not a regular file"] += 1
                    continue
                stem, dot, extension = Path(header.name).name.rpartition(".")
                if f"{dot}{extension}".lower() not in JPEG_EXTENSIONS:
                    skipped["not a JPEG"] += 1
                elif not pattern.fullmatch(stem):
                    raise TarFormatError(
                        f"{self.name}, member {header.name!r}: expected {self.wnid}_<number>.JPEG"
                    )
                else:
                    yield stem, {"jpg": data, "cls": str(self.label).encode("ascii")}


def inner_tars(outer):
    """The ``InnerTar`` of each ``<wnid>.tar`` in ``outer`` (a path or an ``http://`` URL), labels
    in sorted id order, and a ``Counter`` of the members skipped (anything else). Only headers are
    read: the data is jumped over (over HTTP, a Range GET per header)."""
    file = HttpRangeFile(outer) if is_url(outer) else open(outer, "rb")  # noqa: SIM115
    found, skipped = [], Counter()
    with file:
        for header, start in iter_members(file, str(outer)):
            if header.is_file and re.fullmatch(r"n\d{8}\.tar", Path(header.name).name):
                found.append((header.name, start, header.size))
            else:
                skipped["outer member not a <wnid>.tar"] += 1
    if not found:
        raise TarFormatError(f"{outer} holds no <wnid>.tar: it is no ImageNet-style tar of tars")
    ids = sorted(Path(name).stem for name, _, _ in found)
    twice = [wnid for wnid, times in Counter(ids).items() if times > 1]
    if twice:
        raise TarFormatError(f"{outer} holds {twice[0]}.tar more than once")
    inner = [
        InnerTar(str(outer), n, start, size, ids.index(Path(n).stem)) for n, start, size in found
    ]
    return inner, skipped


def tar_of_tars_to_shards(outer, out_dir, *, buckets, seed=0, maxcount=1000, **options):
    """Convert the tar of tars ``outer`` into shuffled shards in ``out_dir`` with ``twopass``, each
    inner tar one scatter task; ``options`` go to ``two_pass_shuffle`` (``executor=``, …). The
    result's ``skipped`` counts the outer tar's skips too."""
    sources, skipped = inner_tars(outer)
    result = two_pass_shuffle(
        sources, out_dir, buckets=buckets, seed=seed, maxcount=maxcount, **options
    )
    result.skipped.update(skipped)
    return result
