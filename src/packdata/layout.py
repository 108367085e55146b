"""The webdataset layout of a shard: which members form a sample, and which shards form a dataset.

A shard is a plain tar. Members ``<key>.<extension>`` with the same key, next to each other, form
one sample ``{"__key__": key, "__url__": shard, extension: bytes, ...}``; the extension starts at
the first dot of the file name. Members named ``__*__`` describe the shard and are no sample. A
dataset is a list of shards, often written as a brace pattern, ``train-{000000..000009}.tar``. The
shard writer (``shardwrite``) and every reader (``shardread``, ``streaming``, the indexed
``datasets``) share these rules.
"""

import hashlib
import os
import urllib.parse
from itertools import groupby
from pathlib import Path

from braceexpand import braceexpand

from .httpclient import file_name, is_url
from .presigned import secrets_withheld, unsigned


def split_member(name):
    """``(key, extension)`` of a member name as webdataset groups them: the extension starts at the
    first dot of the file name, so ``"a/000001.seg.png"`` gives ``("a/000001", "seg.png")``."""
    folder, _, file_name = name.rpartition("/")
    stem, _, extension = file_name.partition(".")
    return f"{folder}/{stem}" if folder else stem, extension


class ShardError(ValueError):
    """A shard holds something a sample stream cannot use: a duplicate key, a sample without a
    member it needs."""


@secrets_withheld
def expand_shards(shards):
    """The shard list as strings: a brace pattern, a path or URL, or a list of those, each expanded
    as bash (and webdataset) expand braces: ``"train-{000..009}.tar"`` gives ten names,
    ``"{train,val}.tar"`` two. A shard named twice would be read twice per epoch, so it is an error,
    also when the two names are two spellings of one local path.
    """
    if isinstance(shards, (str, Path)):
        shards = [shards]
    expanded = [name for shard in shards for name in braceexpand(str(shard)) if name]
    if not expanded:
        raise ValueError(
            "the shard list is empty: give a brace pattern, a list of paths, or http:// URLs"
        )
    foreign = [name for name in expanded if "://" in name and not is_url(name)]
    if foreign:
        raise ValueError(
            f"cannot read {foreign[0]!r}: shards are local paths or http:// URLs; read https://, "
            "s3:// "
            "and other schemes through s3fs or a webdataset pipe: command"
        )
    spelled = {}
    for count, name in enumerate(expanded, 1):
        same = spelled.setdefault(_one_spelling(name), name)
        if len(spelled) < count:
            what = repr(name) if same == name else f"one shard, as {same!r} and as {name!r},"
            raise ValueError(
                f"the shard list names {what} more than once: its samples would come twice an epoch"
            )
    return expanded


def _one_spelling(name):
    """A local path as one absolute path (``a.tar``, ``./a.tar`` and ``/cwd/a.tar`` are one shard;
    links are not followed: that would touch the file system for every shard); a URL as its parts,
    without its signature (``presigned.unsigned``: one object presigned twice), its scheme and
    host in lower case, its path's %-escapes decoded and its ``.`` and ``..`` segments resolved
    (``http://Host/./%74rain.tar`` is ``("http", "host", "/train.tar", "", "")``)."""
    if not is_url(name):
        return os.path.normpath(os.path.abspath(name))
    parts = urllib.parse.urlsplit(unsigned(name))
    path = _without_dot_segments(urllib.parse.unquote(parts.path))
    # the parts apart: a decoded %3F in a path is no query
    return (parts.scheme.lower(), parts.netloc.lower(), path, *parts[3:])


def _without_dot_segments(path):
    """A URL's path with its ``.`` and ``..`` segments resolved, as a client resolves them (RFC
    3986); other segments, empty ones too, stay."""
    kept = []
    for segment in path.split("/"):
        if segment == "..":
            if len(kept) > 1:  # never the empty segment before the first "/"
                kept.pop()
        elif segment != ".":
            kept.append(segment)
    return "/".join(kept)


def is_meta(name):
    """Members named ``__*__`` (like ``pack_tar``'s ``__manifest__``) describe the shard; they are
    no sample."""
    return "/" not in name and name.startswith("__") and name.endswith("__")


def group_samples(members, shard, report):
    """Group consecutive ``(member name, bytes)`` of one shard into sample dicts ``{"__key__",
    "__url__", ext: bytes}``.

    A key that comes back after another key, or a member name seen twice, is a ``ShardError`` passed
    to ``report``: it raises, or (when skipping) that sample is left out.
    """
    seen, sample, keep = set(), None, False
    for name, data in members:
        if "/" in name:
            key, extension = split_member(name)
        else:
            # the same split, without the call, for the common case
            key, _, extension = name.partition(".")
        if sample is None or key != sample["__key__"]:
            if keep:
                yield sample
            sample, keep = {"__key__": key, "__url__": shard}, key not in seen
            if not keep:
                report(
                    ShardError(
                        f"{shard}: duplicate key {key!r}: its members are not next to each other, "
                        "or two samples share it"
                    )
                )
            seen.add(key)
        elif extension in sample and keep:
            report(ShardError(f"{shard}: duplicate member {name!r}"))
            keep = False
        sample[extension] = data
    if keep:
        yield sample


def member_keys(names):
    """The sample keys of member ``names`` (in order), as ``group_samples`` groups them."""
    keys = (split_member(name)[0] for name in names if not is_meta(name))
    return [key.encode("utf-8", "surrogateescape") for key, _ in groupby(keys)]


def keys_digest(keys):
    """A short digest of a shard's sample ``keys`` (``bytes``, in order): what a saved state
    counted samples in, told apart from a shard rewritten since."""
    return hashlib.blake2b(b"\n".join(keys), digest_size=8).hexdigest()


def raise_now(error, shard=None):
    raise error


def members_of(sample):
    """``{extension: bytes}`` of a sample dict, without its ``__key__``/``__url__`` entries."""
    return {key: value for key, value in sample.items() if not key.startswith("__")}


def local_targets(shards, folder):
    """``folder / <file name>`` of each shard path or URL, in order. Two shards with the same file
    name (from different folders) would overwrite each other there: that raises ``ValueError``
    naming both."""
    targets = {}
    for shard in shards:
        target = Path(folder) / file_name(shard)
        if target in targets:
            raise ValueError(
                f"{targets[target]} and {shard} would both become {target}: give the shards "
                "distinct file names, or use one folder for each"
            )
        targets[target] = shard
    return list(targets)
