"""A local shard of large members, read member by member: each member's bytes go once from the page
cache into the ``bytes`` handed out, and the shard is never held whole.

    samples = member_tuples("data/shards/train-000000.tar", ("__key__", "jpg", "cls"))
    # an iterator over (key, jpg bytes, cls bytes), or None: then map the shard (streaming does)

Mapping a shard (``shardread.mapped``) copies each member once too, but every first touch of its
pages is a page fault (one for every 64 KiB or so where the page cache holds the file in small
pages; ``make bench`` measures both ways). Reading the file whole instead copies every byte twice.
Here one small read at a header (``WINDOW`` bytes) brings the header, a small member that follows it
(a label) and often the next header; each large member then comes from one ``os.pread`` of its own,
when its sample is taken. The headers are checked as ``tarscan.scan_plain`` checks them, before any
sample is handed out.

Shards of small members (closer together than ``tarscan.WALK_SPAN`` on average, where a read per
member would cost more than the bytes), another layout, or damage of any kind get None: the caller
maps the shard and takes the usual path, which also names what is wrong.
"""

import os
import weakref

import numpy as np

from . import tarscan
from .plaingroup import grouped_tuples
from .tario import BLOCK, ZERO_BLOCK, pread_exactly

# bytes read at a header: it, a small member after it and the next header, with room to spare
WINDOW = 2048


def member_tuples(path, keys, seen=None):
    """An iterator over the ``keys`` tuples of the plain local shard at ``path``, each large member
    read when its sample is taken; None when the shard needs the mapped path. The file stays open
    until the iterator is exhausted or dropped. ``seen``: see ``plaingroup.grouped_tuples``."""
    file = open(path, "rb", buffering=0)  # noqa: SIM115 (the iterator closes it)
    try:
        tuples = _tuples(file.fileno(), path, keys, seen)
    except BaseException:
        file.close()
        raise
    if tuples is None:
        file.close()
        return None
    samples = _closing(tuples, file)
    weakref.finalize(samples, file.close)  # also when dropped before its first sample
    return samples


def _closing(tuples, file):
    with file:
        yield from tuples


def _tuples(descriptor, path, keys, seen):
    walked = walk_headers(descriptor, os.fstat(descriptor).st_size)
    if walked is None:
        return None
    headers, starts, small = walked
    rows = np.frombuffer(b"".join(headers), np.uint8).reshape(-1, BLOCK)
    sizes = tarscan.plain_sizes(rows)
    if sizes is None or tarscan.bad_checksums(rows).size:
        return None
    names, sizes = tarscan.header_names(rows), sizes.tolist()

    def members(position, width):
        held = small[position::width]
        if None not in held:
            return iter(held)  # small members: their bytes came with their headers
        spans = sizes[position::width], starts[position::width], names[position::width]
        return _read(descriptor, path, held, *spans)

    return grouped_tuples(names, path, keys, members, seen)


def _read(descriptor, path, held, sizes, starts, names):
    """The members of one column: those ``held`` (bytes read with their headers) as they are, the
    others (None) read when taken, one ``os.pread`` each."""
    pread = os.pread
    for data, size, start, name in zip(held, sizes, starts, names):
        if data is None:
            data = pread(descriptor, size, start)
            if len(data) != size:  # over 2 GiB, or the file cut short meanwhile
                name = name.decode("utf-8", "surrogateescape")
                member, hint = f"member {name!r}", "was it cut short while it was read?"
                data = pread_exactly(descriptor, size, start, path, member, hint, data)
        yield data


def walk_headers(descriptor, end):
    """``(headers, data offsets, small members)`` of the tar of ``end`` bytes open as
    ``descriptor``, found by going from each header to the next by its size, reading ``WINDOW``
    bytes where a header lies outside the last read: a small member whose bytes came with its
    header is kept, a large one is ``None``. None when the members come closer together than
    ``tarscan.WALK_SPAN`` on average, a size is no number, or the walk meets no end-of-archive block
    where one should be."""
    if end % BLOCK or end < 2 * BLOCK:
        return None
    window, base, limit, position = b"", 0, 0, 0  # the last read: bytes base to limit
    headers, starts, small = [], [], []
    span, slack = tarscan.WALK_SPAN, tarscan.WALK_SLACK
    while position + BLOCK <= end:
        if len(headers) > position // span + slack:
            return None
        if position + BLOCK > limit:
            window = os.pread(descriptor, WINDOW, position)
            base, limit = position, position + len(window)
            if position + BLOCK > limit:
                return None  # the file shrank
        at = position - base
        header = window[at : at + BLOCK]
        if header == ZERO_BLOCK:
            return (headers, starts, small) if headers else None
        try:
            size = int(header[124:135], 8)
        except ValueError:
            return None
        if size < 0:
            return None
        headers.append(header)
        position += BLOCK
        starts.append(position)
        small.append(window[at + BLOCK : at + BLOCK + size] if position + size <= limit else None)
        position += size + -size % BLOCK
    return None
