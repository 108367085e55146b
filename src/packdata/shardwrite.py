"""Write, split and join tar shards in webdataset layout (``<key>.jpg``, ``<key>.cls``, …).

    write_shards(root, "data/shards", maxcount=1000)  # a dataset folder, shuffled, 1,000 a shard
    write_shards(torchvision_dataset, "data/shards")  # any map-style dataset of (image, label)
    split_tar("train.tar", "data/shards", maxsize=10e6)  # a big tar into shards, samples whole
    cat_shards(["a.tar", "b.tar"], "ab.tar")  # shards into one

A set of shards appears only once all of it is written: the shards are written into a hidden folder,
then moved into place, and older shards of the same prefix beyond the new set removed; a failed run
leaves the old set as it was. A sample never straddles two shards. Members use ``pack_tar``'s
conventions: ustar headers with fixed owner and time (pax where a name or a size needs one). A
sample that would not read back as written (a dot in its key's file name, ``/`` in an extension,
no member, a member that is no bytes) is refused, naming its key.
"""

import glob
import operator
import os
import shutil
import tempfile
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .atomic import written_atomically
from .images import checked_suffix
from .layout import members_of
from .perprocess import map_in_processes
from .presigned import secrets_withheld
from .samples import sample_source
from .shardread import iter_shard_samples
from .tario import END_OF_TAR, tar_member

SHARD_NAME = "{prefix}-{index:06d}.tar"
SHARD_GLOB = "{prefix}-[0-9][0-9][0-9][0-9][0-9][0-9].tar"  # every name SHARD_NAME gives


def remove_stale_shards(out_dir, prefix, kept):
    """Remove the shards of ``prefix`` in ``out_dir`` that are not among the paths ``kept``: an
    older, longer set's tail, once a new set is in place."""
    for stale in Path(out_dir).glob(SHARD_GLOB.format(prefix=glob.escape(prefix))):
        if stale not in kept:
            stale.unlink()


@dataclass(frozen=True)
class ShardInfo:
    """One written shard: where, how many samples, how many bytes."""

    path: Path
    samples: int
    bytes: int


def sample_bytes(key, members):
    """One sample as tar members: ``<key>.<ext>`` for each ``{ext: bytes}`` item, in order. A key
    or an extension that would read back as another sample, and a sample of no member, raise
    ``ValueError`` naming the key."""
    check_sample(key, members)
    return b"".join(tar_member(f"{key}.{extension}", data) for extension, data in members.items())


def check_sample(key, members):
    """``ValueError`` unless ``key`` and ``members`` read back as this one sample (the grouping
    rules of ``layout.split_member``, and webdataset's): a key whose file name has no dot, in a
    relative path without ``..``; extensions in lower case, without ``/``; no NUL in either; at
    least one member."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"sample key {key!r}: a key is a non-empty string")
    if "\0" in key:
        raise ValueError(
            f"sample key {key!r}: a NUL ends a name in a tar header, so the key would read back "
            "cut short there"
        )
    stem = key.rpartition("/")[2]
    if key.startswith("/") or ".." in key.split("/"):
        raise ValueError(
            f"sample key {key!r}: a key is a relative path without '..' (it names members inside "
            "the shard, and tools that unpack a tar refuse or rewrite such names)"
        )
    if not stem or "." in stem:
        raise ValueError(
            f"sample key {key!r}: a key is a relative path whose last part has no dot (readers "
            "split a member's name at the first dot of its file name: the key would read back as "
            "another), for example 'img_001' or 'train/img_001'"
        )
    if not isinstance(members, Mapping) or not members:
        raise ValueError(
            f"sample {key!r}: got {members!r} for its members; a sample is a non-empty "
            "{extension: bytes} dict (to leave a sample out, write nothing for it)"
        )
    for extension in members:
        if isinstance(extension, str) and extension.startswith("__"):
            raise ValueError(
                f"sample {key!r}: {extension!r} is no member: a sample's members leave out its "
                "__key__ and __url__ (layout.members_of(sample) gives them)"
            )
        if not isinstance(extension, str) or not extension or "/" in extension or "\0" in extension:
            raise ValueError(
                f"sample {key!r}: extension {extension!r} is not one: a non-empty string without "
                "'/' or NUL, such as 'jpg' or 'seg.png'"
            )
        if extension != extension.lower():
            raise ValueError(
                f"sample {key!r}: extension {extension!r} has capitals, which webdataset lowers "
                f"when it reads: write {extension.lower()!r}"
            )


class ShardWriter:
    """Write samples into ``out_dir/<prefix>-000000.tar``, ``-000001.tar``, …: a sample goes into
    the next shard when the current one holds ``maxcount`` samples or the sample would take it past
    ``maxsize`` bytes (a sample bigger than ``maxsize`` on its own gets a shard to itself: samples
    are never cut).

    The new set replaces the old one as a whole: the shards are written into a hidden folder in
    ``out_dir`` and moved into place by ``close`` (then the old ``<prefix>-NNNNNN.tar`` beyond them
    removed). On an error, or with no sample written, ``out_dir`` is left as it was. (A crash during
    those final moves can still mix the two sets: renaming many files at once is not atomic.)"""

    def __init__(self, out_dir, prefix="train", maxcount=1000, maxsize=None):
        if not maxcount >= 1 or (maxsize is not None and not maxsize > 0):  # NaN too
            raise ValueError(
                f"maxcount must be at least 1 and maxsize positive, got {maxcount} and {maxsize}"
            )
        self.out_dir, self.prefix, self.maxcount, self.maxsize = (
            Path(out_dir),
            prefix,
            maxcount,
            maxsize,
        )
        self.shards = []
        self._staging = self._file = None
        self._samples = self._bytes = 0

    def write(self, key, members):
        """Add one sample, ``members`` being ``{extension: bytes}``."""
        data = sample_bytes(key, members)
        full = self._samples >= self.maxcount
        too_big = (
            self.maxsize is not None
            and self._samples > 0
            and self._bytes + len(data) + len(END_OF_TAR) > self.maxsize
        )
        if self._file is None or full or too_big:
            self._next_shard()
        self._file.write(data)
        self._samples, self._bytes = self._samples + 1, self._bytes + len(data)

    def _next_shard(self):
        self._finish()
        if self._staging is None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._staging = Path(
                tempfile.mkdtemp(prefix=f".{self.prefix}.partial-", dir=self.out_dir)
            )
        path = self.out_dir / SHARD_NAME.format(prefix=self.prefix, index=len(self.shards))
        self._file = open(self._staging / path.name, "wb")  # noqa: SIM115 (_finish or _abort closes it)
        self._samples, self._bytes = 0, 0
        self.shards.append(ShardInfo(path, 0, 0))

    def _finish(self):
        """End the shard being written and put it on disk (the hidden folder is what keeps it out of
        sight)."""
        if self._file is None:
            return
        with self._file as file:
            file.write(END_OF_TAR)
            file.flush()
            os.fsync(file.fileno())  # on disk before it is moved into place
        self.shards[-1] = ShardInfo(
            self.shards[-1].path, self._samples, self._bytes + len(END_OF_TAR)
        )
        self._file = None

    def close(self):
        """Finish the last shard, move the new shards into place, and remove older
        ``<prefix>-NNNNNN.tar`` files beyond them. Writing no sample at all is an error (it would
        leave no shard), and changes nothing."""
        if not self.shards:
            raise ValueError(
                f"no samples to write into {self.out_dir}: refusing to replace its "
                f"{self.prefix}-NNNNNN.tar shards with none"
            )
        self._finish()
        for info in self.shards:
            os.replace(self._staging / info.path.name, info.path)
        self._staging.rmdir()
        remove_stale_shards(self.out_dir, self.prefix, {info.path for info in self.shards})
        return self.shards

    def _abort(self):
        """Drop everything written so far, leaving ``out_dir`` as it was."""
        if self._file is not None:
            self._file.close()
        if self._staging is not None:
            shutil.rmtree(self._staging)
        self.shards, self._staging, self._file = [], None, None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None:
            self.close()
        else:
            self._abort()


def write_shards(
    source,
    out_dir,
    *,
    prefix="train",
    maxcount=1000,
    maxsize=None,
    shuffle_seed=0,
    processes=1,
    executor=None,
    payload="jpeg",
    resize=None,
    progress=True,
):
    """Write ``source`` (a dataset folder with a manifest, or a map-style dataset of ``(image,
    label)``) as shards ``out_dir/<prefix>-NNNNNN.tar`` of at most ``maxcount`` samples and
    ``maxsize`` bytes; return their ``ShardInfo``.

    Samples are shuffled with ``shuffle_seed`` before sharding (``None`` keeps key order), so every
    shard holds a mix of classes. ``processes > 1`` reads and encodes in that many processes; the
    output is the same bytes. ``executor``: a process pool you started (``ProcessPoolExecutor``) to
    encode in instead of a new one, so that its processes start once for several calls;
    ``processes`` then says how many it has (the work goes out in a few chunks per process).
    """
    if not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be a whole number of 1 or more, got {processes!r}")
    suffix = checked_suffix(payload, resize)[1:]
    samples = sample_source(source, payload, resize)
    order = list(range(len(samples)))
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(len(samples)).tolist()
    chunk = max(
        1, min(64, len(order) // (4 * processes))
    )  # a few chunks per process, even when few
    encoded = (
        map_in_processes(samples, order, processes, chunksize=chunk)
        if executor is None
        else executor.map(samples, order, chunksize=chunk)
    )
    with closing(encoded), ShardWriter(out_dir, prefix, maxcount, maxsize) as writer:
        for key, label, data in tqdm(
            encoded, total=len(order), desc=f"{prefix} shards", unit="img", disable=not progress
        ):
            writer.write(key, {suffix: data, "cls": str(label).encode("ascii")})
    return writer.shards


# --- working with shards that exist ---------------------------------------------------------------


def split_tar(tar, out_dir, *, prefix="train", maxcount=1000, maxsize=None):
    """Split one tar (``pack_tar``'s, a webdataset shard, …) into shards, samples kept whole and in
    order; members named ``__*__`` are left out. Returns the ``ShardInfo`` of each shard. A ``tar``
    that is one of the ``prefix`` shards in ``out_dir`` (which the new set replaces) is refused."""
    replaced = Path(out_dir).resolve().glob(SHARD_GLOB.format(prefix=glob.escape(prefix)))
    if Path(tar).resolve() in set(replaced):
        raise ValueError(
            f"{tar} is one of the {prefix}-NNNNNN.tar shards of {out_dir}, which the split "
            "replaces: split it into another folder, or give another prefix"
        )
    with ShardWriter(out_dir, prefix, maxcount, maxsize) as writer:
        for sample in iter_shard_samples([tar]):
            writer.write(sample["__key__"], members_of(sample))
        if not writer.shards:
            raise ValueError(f"{tar} holds no samples: nothing to split")
    return writer.shards


def write_tar(path, samples):
    """Write ``(key, {extension: bytes})`` pairs as one shard at ``path``, atomically; returns its
    ``ShardInfo``."""
    count, size = 0, 0
    with written_atomically(path) as file:
        for key, members in samples:
            data = sample_bytes(key, members)
            file.write(data)
            count, size = count + 1, size + len(data)
        file.write(END_OF_TAR)
    return ShardInfo(Path(path), count, size + len(END_OF_TAR))


@secrets_withheld
def cat_shards(shards, output):
    """Concatenate shards into one tar at ``output`` (written atomically); a key in two shards is
    refused."""
    return write_tar(output, with_unique_keys(iter_shard_samples(shards)))


def with_unique_keys(samples, origin=operator.itemgetter("__url__")):
    """``(key, members)`` of each sample; a key seen before raises ``ValueError`` naming where
    both came from: ``origin(sample)``, by default its shard."""
    seen = {}
    for sample in samples:
        key, where = sample["__key__"], origin(sample)
        if key in seen:
            raise ValueError(f"duplicate key {key!r}: in {seen[key]} and in {where}")
        seen[key] = where
        yield key, members_of(sample)
