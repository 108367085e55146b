"""Group a plain shard's members into samples with numpy: no Python per member.

Shard writers lay every sample out the same way (``000042.jpg``, ``000042.cls``, ``000043.jpg``,
...): keys of one length, the same extensions in the same order. For such a shard the grouping is a
few array operations over the member names that ``tarscan.scan_plain`` found. Anything else (another
layout, folders, ``__meta__`` members, a duplicate key, a missing member) gets None, and the caller
takes the general path (``layout.group_samples``), which also reports what is wrong.
"""

from itertools import repeat
from typing import NamedTuple

import numpy as np

from .layout import keys_digest
from .tarscan import scan_plain


class PlainLayout(NamedTuple):
    """How a plain shard's members form samples: member ``i`` belongs to sample ``i // width``."""

    keys: np.ndarray  # each sample's key, as fixed-width bytes
    width: int  # members per sample
    extensions: list  # the extensions of one sample's members, in order


def plain_tuples(data, shard, keys, seen=None):
    """An iterator over the ``keys`` tuples of one shard's samples straight from the vectorised
    scan, or None when the shard needs the general path (``seen``: see ``grouped_tuples``).

    Each member is sliced out of ``data`` only when its sample is taken: a copy that the consumer
    drops at once reuses the memory of the one before, where slicing a whole shard up front would
    ask the system for fresh pages every shard (a page fault per 4 KiB, which on some virtual
    machines costs microseconds)."""
    scanned = scan_plain(data, shard)
    if scanned is None:
        return None
    names, starts, sizes = scanned

    def members(position, width):
        begin = starts[position::width]
        ends = begin + sizes[position::width]
        return map(data.__getitem__, map(slice, begin.tolist(), ends.tolist()))

    return grouped_tuples(plain_layout(names), shard, keys, members, seen)


def grouped_tuples(layout, shard, keys, members, seen=None):
    """``zip`` of one column per key of ``keys``, the samples of a shard whose members are laid out
    as ``layout`` (a ``PlainLayout``) says; None when they are not plain (``layout`` None), or a key
    is not among the members. ``members(position, width)`` iterates over the bytes of members
    ``position``, ``position + width``, ... in order, fetching each as it is taken.
    ``seen(digest)``, when given, hears the ``layout.keys_digest`` of the samples' keys before any
    sample comes."""
    if layout is None or not set(keys) <= {"__key__", "__url__", *layout.extensions}:
        return None
    if seen is not None:
        seen(keys_digest(layout.keys.tolist()))
    columns = []
    for key in keys:
        if key == "__key__":
            columns.append(name.decode("utf-8", "surrogateescape") for name in layout.keys.tolist())
        elif key == "__url__":
            columns.append(repeat(shard, len(layout.keys)))
        else:
            columns.append(members(layout.extensions.index(key), layout.width))
    return zip(*columns)


def plain_layout(names):
    """The ``PlainLayout`` of member ``names`` (a fixed-width bytes array), or None when they are
    not plain."""
    # one row of name bytes per member, NUL-padded
    matrix = names.view(np.uint8).reshape(len(names), -1)
    dot = key_length(matrix)
    if dot is None:
        return None
    key_columns = np.ascontiguousarray(matrix[:, :dot])
    member_keys = key_columns.view(f"S{dot}").ravel()
    firsts = np.flatnonzero(np.concatenate([[True], member_keys[1:] != member_keys[:-1]]))
    # members per sample, when every sample has the same ones
    width = len(member_keys) // len(firsts)
    if (
        width * len(firsts) != len(member_keys)
        or (firsts != np.arange(0, len(member_keys), width)).any()
    ):
        return None
    extensions = sample_extensions(matrix[:, dot + 1 :], width)
    if extensions is None or has_duplicates(key_columns[firsts]):
        return None
    return PlainLayout(member_keys[firsts], width, extensions)


def key_length(matrix):
    """The length of every member's key when all are equal and plain (no folder, no ``__meta__``
    name), else None."""
    dots = (matrix == ord(".")).argmax(axis=1)
    dot = int(dots[0])
    if (
        dot == 0
        or (dots != dot).any()
        or ((matrix[:, 0] == ord("_")) & (matrix[:, 1] == ord("_"))).any()
    ):
        return None
    key_columns = matrix[:, :dot]  # a NUL among them would end the name before its dot
    if ((key_columns == ord("/")) | (key_columns == 0)).any():
        return None
    return dot


def sample_extensions(tails, width):
    """The extensions of the first sample's ``width`` members when every sample repeats them, else
    None. ``tails`` holds each member name's bytes after the key's dot."""
    layout = [bytes(row).split(b"\x00", 1)[0] for row in tails[:width]]
    extensions = tails[
        :, : 1 + max(map(len, layout))
    ]  # as far as the longest one's terminating NUL
    if (extensions.reshape(len(tails) // width, width, -1) != extensions[:width]).any():
        return None
    layout = [extension.decode("utf-8", "surrogateescape") for extension in layout]
    if any("/" in extension for extension in layout) or len(set(layout)) != width:
        return None
    return layout


def has_duplicates(rows):
    """True when two rows of the ``uint8`` matrix ``rows`` are equal. Rows of up to 8 bytes are
    compared as sorted 64-bit numbers, longer ones as a set of ``bytes``."""
    count, width = rows.shape
    if width > 8:
        return len(set(rows.view(f"S{width}").ravel().tolist())) != count
    padded = np.zeros((count, 8), np.uint8)
    padded[:, :width] = rows
    numbers = np.sort(padded.view("<u8").ravel())
    return bool((numbers[1:] == numbers[:-1]).any())
