"""Write, split, join and inspect tar shards in webdataset layout (``<key>.jpg``, ``<key>.cls``, …).

    write_shards(root, "data/shards", maxcount=1000)        # the dataset folder, shuffled, 1,000 samples a shard
    write_shards(torchvision_dataset, "data/shards")        # any map-style dataset of (image, label)
    split_tar("train.tar", "data/shards", maxsize=10e6)     # one big tar into shards, samples kept whole
    cat_shards(["a.tar", "b.tar"], "ab.tar")                # shards into one

A set of shards appears only once all of it is written: the shards are written into a hidden folder, then moved
into place, and older shards of the same prefix beyond the new set removed; a failed run leaves the old set as it
was. A sample never straddles two shards. Members use ``pack_tar``'s conventions: ustar headers with fixed owner
and time.
"""

import operator
import os
import shutil
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .data import as_pil, encode_jpeg, load_manifest
from .packing import END_OF_TAR, checked_suffix, tar_member, encode_payload
from .streaming import IMAGE_EXTENSIONS, expand_shards, group_samples, is_meta, raise_now, read_shard
from .tario import scan_buffer, written_atomically

SHARD_NAME = "{prefix}-{index:06d}.tar"


@dataclass(frozen=True)
class ShardInfo:
    """One written shard: where, how many samples, how many bytes."""

    path: Path
    samples: int
    bytes: int


def sample_bytes(key, members):
    """One sample as tar members: ``<key>.<ext>`` for each ``{ext: bytes}`` item, in order."""
    return b"".join(tar_member(f"{key}.{extension}", data) for extension, data in members.items())


class ShardWriter:
    """Write samples into ``out_dir/<prefix>-000000.tar``, ``-000001.tar``, …: a sample goes into the next shard
    when the current one holds ``maxcount`` samples or the sample would take it past ``maxsize`` bytes (a sample
    bigger than ``maxsize`` on its own gets a shard to itself: samples are never cut).

    The new set replaces the old one as a whole: the shards are written into a hidden folder in ``out_dir``
    and moved into place by ``close`` (then the old ``<prefix>-NNNNNN.tar`` beyond them removed). On an error,
    or with no sample written, ``out_dir`` is left as it was. (A crash during those final moves can still mix
    the two sets: renaming many files at once is not atomic.)"""

    def __init__(self, out_dir, prefix="train", maxcount=1000, maxsize=None):
        if maxcount < 1 or (maxsize is not None and maxsize <= 0):
            raise ValueError(f"maxcount must be at least 1 and maxsize positive, got {maxcount} and {maxsize}")
        self.out_dir, self.prefix, self.maxcount, self.maxsize = Path(out_dir), prefix, maxcount, maxsize
        self.shards = []
        self._staging = self._writing = self._file = None
        self._samples = self._bytes = 0

    def write(self, key, members):
        """Add one sample, ``members`` being ``{extension: bytes}``."""
        data = sample_bytes(key, members)
        full = self._samples >= self.maxcount
        too_big = (self.maxsize is not None and self._samples > 0
                   and self._bytes + len(data) + len(END_OF_TAR) > self.maxsize)
        if self._file is None or full or too_big:
            self._next_shard()
        self._file.write(data)
        self._samples, self._bytes = self._samples + 1, self._bytes + len(data)

    def _next_shard(self):
        self._finish()
        if self._staging is None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._staging = Path(tempfile.mkdtemp(prefix=f".{self.prefix}.partial-", dir=self.out_dir))
        path = self.out_dir / SHARD_NAME.format(prefix=self.prefix, index=len(self.shards))
        self._writing = written_atomically(self._staging / path.name)
        self._file, self._samples, self._bytes = self._writing.__enter__(), 0, 0
        self.shards.append(ShardInfo(path, 0, 0))

    def _finish(self, error=None):
        if self._file is None:
            return
        if error is None:
            self._file.write(END_OF_TAR)
            self.shards[-1] = ShardInfo(self.shards[-1].path, self._samples, self._bytes + len(END_OF_TAR))
            self._writing.__exit__(None, None, None)
        else:
            self.shards.pop()
            self._writing.__exit__(type(error), error, error.__traceback__)  # removes the partial file
        self._writing = self._file = None

    def close(self):
        """Finish the last shard, move the new shards into place, and remove older ``<prefix>-NNNNNN.tar`` files
        beyond them. Writing no sample at all is an error (it would leave no shard), and changes nothing."""
        if not self.shards:
            raise ValueError(f"no samples to write into {self.out_dir}: refusing to replace its "
                             f"{self.prefix}-NNNNNN.tar shards with none")
        self._finish()
        for info in self.shards:
            os.replace(self._staging / info.path.name, info.path)
        self._staging.rmdir()
        written = {info.path for info in self.shards}
        for stale in self.out_dir.glob(f"{self.prefix}-[0-9][0-9][0-9][0-9][0-9][0-9].tar"):
            if stale not in written:
                stale.unlink()
        return self.shards

    def _abort(self, error):
        """Drop everything written so far, leaving ``out_dir`` as it was."""
        self._finish(error)
        if self._staging is not None:
            shutil.rmtree(self._staging)
        self.shards, self._staging = [], None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None:
            self.close()
        else:
            self._abort(error)


# --- what to write ---------------------------------------------------------------------------------


class _FolderSamples:
    """Sample ``i`` of a dataset folder (its manifest, in key order) as ``(key, label, payload)``."""

    def __init__(self, root, payload, resize):
        self.root, self.payload, self.resize = Path(root), payload, resize
        self.samples = sorted(load_manifest(root)["samples"], key=operator.itemgetter("key"))

    def __len__(self):
        return len(self.samples)

    def __call__(self, index):
        sample = self.samples[index]
        jpeg = (self.root / sample["path"]).read_bytes()
        return sample["key"], sample["label"], encode_payload(jpeg, self.payload, self.resize)


class _DatasetSamples:
    """Sample ``i`` of a map-style dataset of ``(image, label)`` as ``(zero-padded index, label, payload)``."""

    def __init__(self, dataset, payload, resize):
        self.dataset, self.payload, self.resize = dataset, payload, resize
        self.width = max(6, len(str(len(dataset) - 1)))

    def __len__(self):
        return len(self.dataset)

    def __call__(self, index):
        image, label = self.dataset[index]
        try:
            label = operator.index(label)
        except TypeError:
            raise ValueError(f"sample {index} has label {label!r}; expected an int") from None
        jpeg = encode_jpeg(as_pil(image, index))
        return f"{index:0{self.width}d}", label, encode_payload(jpeg, self.payload, self.resize)


_worker_source = None


def _install(source):
    global _worker_source
    _worker_source = source


def _encode(index):
    return _worker_source(index)


def write_shards(source, out_dir, *, prefix="train", maxcount=1000, maxsize=None, shuffle_seed=0, processes=1,
                 payload="jpeg", resize=None, progress=True):
    """Write ``source`` (a dataset folder with a manifest, or a map-style dataset of ``(image, label)``) as shards
    ``out_dir/<prefix>-NNNNNN.tar`` of at most ``maxcount`` samples and ``maxsize`` bytes; return their ``ShardInfo``.

    Samples are shuffled with ``shuffle_seed`` before sharding (``None`` keeps key order), so every shard holds a
    mix of classes. ``processes > 1`` reads and encodes in that many processes; the output is the same bytes.
    """
    suffix = checked_suffix(payload, resize)[1:]
    kind = _FolderSamples if isinstance(source, (str, Path)) else _DatasetSamples
    samples = kind(source, payload, resize)
    order = list(range(len(samples)))
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(len(samples)).tolist()
    with ShardWriter(out_dir, prefix, maxcount, maxsize) as writer, \
            tqdm(total=len(order), desc=f"{prefix} shards", unit="img", disable=not progress) as bar:
        if processes > 1:
            with ProcessPoolExecutor(processes, initializer=_install, initargs=(samples,)) as pool:
                encoded = pool.map(_encode, order, chunksize=64)
                for key, label, data in encoded:
                    writer.write(key, {suffix: data, "cls": str(label).encode("ascii")})
                    bar.update()
        else:
            for key, label, data in map(samples, order):
                writer.write(key, {suffix: data, "cls": str(label).encode("ascii")})
                bar.update()
    return writer.shards


# --- working with shards that exist ----------------------------------------------------------------


def _samples_in(data, shard, members):
    """The samples of the shard read whole into ``data``, given its ``scan_buffer`` ``members``."""
    named = ((name, data[start:start + size]) for name, start, size in members if not is_meta(name))
    return group_samples(named, shard, raise_now)


def iter_shard_samples(shards):
    """The samples (``{"__key__", "__url__", ext: bytes}``) of each shard in turn; problems raise, naming the shard."""
    for shard in expand_shards(shards):
        data = read_shard(shard)
        yield from _samples_in(data, shard, scan_buffer(data, shard))


def members_of(sample):
    """``{extension: bytes}`` of a sample dict, without its ``__key__``/``__url__`` entries."""
    return {key: value for key, value in sample.items() if not key.startswith("__")}


def split_tar(tar, out_dir, *, prefix="train", maxcount=1000, maxsize=None):
    """Split one tar (``pack_tar``'s, a webdataset shard, …) into shards, samples kept whole and in order; members
    named ``__*__`` are left out. Returns the ``ShardInfo`` of each shard."""
    with ShardWriter(out_dir, prefix, maxcount, maxsize) as writer:
        for sample in iter_shard_samples([tar]):
            writer.write(sample["__key__"], members_of(sample))
        if not writer.shards:
            raise ValueError(f"{tar} holds no samples: nothing to split")
    return writer.shards


def write_tar(path, samples):
    """Write ``(key, {extension: bytes})`` pairs as one shard at ``path``, atomically; returns its ``ShardInfo``."""
    count, size = 0, 0
    with written_atomically(path) as file:
        for key, members in samples:
            data = sample_bytes(key, members)
            file.write(data)
            count, size = count + 1, size + len(data)
        file.write(END_OF_TAR)
    return ShardInfo(Path(path), count, size + len(END_OF_TAR))


def cat_shards(shards, output):
    """Concatenate shards into one tar at ``output`` (written atomically); a key in two shards is refused."""
    return write_tar(output, _with_unique_keys(iter_shard_samples(shards)))


def _with_unique_keys(samples):
    """``(key, members)`` of each sample; a key seen before raises ``ValueError`` naming both shards."""
    seen = {}
    for sample in samples:
        key = sample["__key__"]
        if key in seen:
            raise ValueError(f"duplicate key {key!r}: in {seen[key]} and in {sample['__url__']}")
        seen[key] = sample["__url__"]
        yield key, members_of(sample)


def describe_shard(shard):
    """``{"shard", "samples", "members", "bytes", "extensions": {ext: count}, "member_sizes": [(name, size)]}`` of
    one shard, from one read of it; ``member_sizes`` lists every regular file, ``__manifest__``-like ones too."""
    data = read_shard(shard)
    members = scan_buffer(data, shard)
    samples, extensions = 0, Counter()
    for sample in _samples_in(data, shard, members):
        samples += 1
        extensions.update(members_of(sample).keys())
    return {"shard": shard, "samples": samples, "members": sum(extensions.values()), "bytes": len(data),
            "extensions": dict(sorted(extensions.items())), "member_sizes": [(name, size) for name, _, size in members]}


def format_shard(info):
    """One line for ``describe_shard``'s answer."""
    extensions = " ".join(f".{extension}×{count}" for extension, count in info["extensions"].items())
    counts = f"{info['samples']} samples\t{info['members']} members\t{info['bytes']:,} bytes"
    return f"{info['shard']}\t{counts}\t{extensions}"


def format_sample(sample):
    """One line per sample: its key, shard, members with sizes, and the label when there is one."""
    members = ", ".join(f"{extension} ({len(data):,} B)" for extension, data in members_of(sample).items())
    label = f"  label {sample['cls'].decode()}" if "cls" in sample else ""
    return f"{sample['__key__']}  [{sample['__url__']}]  {members}{label}"


def show_samples(shard, count=8, ax_size=1.2):
    """The first ``count`` images of a shard with their key and label; returns the matplotlib figure."""
    import matplotlib.pyplot as plt

    from .datasets import decode_image

    samples = list(islice(iter_shard_samples([shard]), count))
    fig, axes = plt.subplots(1, len(samples), figsize=(len(samples) * ax_size, ax_size * 1.3), squeeze=False)
    for ax, sample in zip(axes[0], samples):
        image = next(value for key, value in sample.items() if key in IMAGE_EXTENSIONS)
        ax.imshow(decode_image(image).permute(1, 2, 0).numpy())
        ax.set_title(f"{sample['__key__']}\nlabel {sample.get('cls', b'?').decode()}", fontsize=8)
        ax.axis("off")
    return fig

