"""Read a shard whole, locally or over HTTP, as samples; count them, describe a shard, show its
images.

    for sample in iter_shard_samples("data/shards/train-{000000..000009}.tar"):
        sample["__key__"], sample["jpg"], sample["cls"]
    describe_shard("data/shards/train-000000.tar")    # samples, members, bytes, extensions

These are the tools for looking at shards and rewriting them; the training-time reader is
``streaming``.
"""

import mmap
import os
import urllib.parse
from collections import Counter
from functools import cache
from itertools import islice

from .compression import decompressed
from .fields import image_field
from .httpclient import HttpClient, is_url
from .images import decode_image
from .layout import expand_shards, group_samples, is_meta, members_of, raise_now, split_member
from .presigned import secrets_withheld
from .tarscan import scan_buffer, scan_readable


@cache
def client_for(base_url):
    """One keep-alive ``HttpClient`` per server; it opens its own connections in each process and
    thread."""
    return HttpClient(base_url)


@secrets_withheld
def read_shard(shard):
    """The tar bytes of one shard, decompressed when it is a ``.tar.gz`` (or bzip2, or xz): one read
    of a local file, or one GET of an ``http://`` URL."""
    return decompressed(fetch_shard(shard), shard)


def fetch_shard(shard):
    """The bytes of one shard file as stored, compressed or not: a local file mapped read-only into
    memory (``mapped``), or one GET of an ``http://`` URL, its query too (a presigned URL's
    signature)."""
    if not is_url(shard):
        return mapped(shard)
    parts = urllib.parse.urlsplit(shard)
    base = f"{parts.scheme}://{parts.netloc}/"
    return client_for(base).get(urllib.parse.unquote(parts.path.lstrip("/")), parts.query)


def mapped(path):
    """A local file's bytes, mapped read-only from the page cache: slicing copies just the slice, so
    a sample's bytes are copied once, where reading the file first would copy every byte twice
    (``make bench`` measures both; the stream reads shards of large samples member by member,
    ``memberread``, which also spares the page faults of a mapping). Like any mapping, it
    assumes nobody truncates the file while it is read: shards are replaced whole, never
    rewritten in place."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return b""  # an empty file cannot be mapped
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)


@secrets_withheld
def count_shard_samples(shard, read=read_shard, damaged="raise"):
    """The number of samples (distinct keys) in one shard, from its headers; ``read(shard)`` gives
    its bytes. Damage raises; with ``damaged="count"`` the keys of the members before it count
    instead (a sample cut between its members counts too, though a reader then skips it)."""
    data = read(shard)
    if damaged == "count":
        members, _ = scan_readable(data, shard)
    else:
        members = scan_buffer(data, shard)
    return len({split_member(name)[0] for name, _, _ in members if not is_meta(name)})


def _samples_in(data, shard, members):
    """The samples of the shard read whole into ``data``, given its ``scan_buffer`` ``members``."""
    named = (
        (name, data[start : start + size]) for name, start, size in members if not is_meta(name)
    )
    return group_samples(named, shard, raise_now)


@secrets_withheld
def iter_shard_samples(shards):
    """The samples (``{"__key__", "__url__", ext: bytes}``) of each shard in turn; problems raise,
    naming the shard."""
    for shard in expand_shards(shards):
        data = read_shard(shard)
        yield from _samples_in(data, shard, scan_buffer(data, shard))


@secrets_withheld
def describe_shard(shard):
    """``{"shard", "samples", "members", "bytes", "extensions": {ext: count}, "member_sizes":
    [(name, size)]}`` of one shard, from one read of it; ``member_sizes`` lists every regular file,
    ``__manifest__``-like ones too."""
    data = read_shard(shard)
    members = scan_buffer(data, shard)
    samples, extensions = 0, Counter()
    for sample in _samples_in(data, shard, members):
        samples += 1
        extensions.update(members_of(sample).keys())
    return {
        "shard": shard,
        "samples": samples,
        "members": sum(extensions.values()),
        "bytes": len(data),
        "extensions": dict(sorted(extensions.items())),
        "member_sizes": [(name, size) for name, _, size in members],
    }


def format_shard(info):
    """One line for ``describe_shard``'s answer."""
    extensions = " ".join(
        f".{extension}×{count}" for extension, count in info["extensions"].items()
    )
    counts = f"{info['samples']} samples\t{info['members']} members\t{info['bytes']:,} bytes"
    return f"{info['shard']}\t{counts}\t{extensions}"


def format_sample(sample):
    """One line per sample: its key, shard, members with sizes, and the label when there is one."""
    members = ", ".join(
        f"{extension} ({len(data):,} B)" for extension, data in members_of(sample).items()
    )
    label = f"  label {sample['cls'].decode()}" if "cls" in sample else ""
    return f"{sample['__key__']}  [{sample['__url__']}]  {members}{label}"


def show_shard(shard, count=8, ax_size=1.2):
    """The first ``count`` images of a shard with their key and label; returns the matplotlib
    figure."""
    import matplotlib.pyplot as plt

    samples = list(islice(iter_shard_samples([shard]), count))
    fig, axes = plt.subplots(
        1, len(samples), figsize=(len(samples) * ax_size, ax_size * 1.3), squeeze=False
    )
    for ax, sample in zip(axes[0], samples):
        image = sample[image_field(list(sample))]
        ax.imshow(decode_image(image).permute(1, 2, 0).numpy())
        ax.set_title(f"{sample['__key__']}\nlabel {sample.get('cls', b'?').decode()}", fontsize=8)
        ax.axis("off")
    return fig
