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

The next epoch needs no walk: what it found (each member's name, size and offset) is kept as the
shard's ``Table``, by path, in ``TABLES``, for as long as the file keeps its size, inode and times
(``persistent_workers=True`` keeps a DataLoader's workers, and with them their tables). Each member
is then read where the table says: a large one alone, as before, a small one with its header, which
must still begin with the bytes it had (its name, size and checksum), or the read stops naming the
member. The tables take about 200 bytes a sample of two members, up to ``TABLES.limit`` a process;
the shards beyond it are walked every epoch.

Shards of small members (closer together than ``tarscan.WALK_SPAN`` on average, where a read per
member would cost more than the bytes), another layout, or damage of any kind get None: the caller
maps the shard and takes the usual path, which also names what is wrong.
"""

import os
import weakref
from typing import NamedTuple

import numpy as np

from . import tarscan
from .plaingroup import grouped_tuples, plain_layout
from .tario import BLOCK, ZERO_BLOCK, TarFormatError, pread_exactly

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
    status = os.fstat(descriptor)
    stamp = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)
    table, held = TABLES.get(path, stamp), None
    if table is None:
        walked = walk_headers(descriptor, status.st_size)
        table = None if walked is None else checked_table(walked, stamp)
        if table is None:
            return None
        held = walked[2]
        TABLES.keep(path, table)

    def members(position, width):
        column = slice(position, None, width)
        if held is None:
            return _read_again(descriptor, path, table, column)
        if None not in held[column]:
            return iter(held[column])  # small members: their bytes came with their headers
        return _read(descriptor, path, table, column, held[column])

    return grouped_tuples(table.layout, path, keys, members, seen)


class Table(NamedTuple):
    """What the walk over a shard's headers found: enough to read the same file again without it."""

    stamp: tuple  # the file's device, inode, size and times of change when it was walked
    names: np.ndarray  # each member's name, fixed-width bytes
    layout: object  # how they form samples: a ``plaingroup.PlainLayout``, or None
    sizes: np.ndarray
    starts: np.ndarray  # where each member's bytes begin
    # the first ``MARK`` bytes (name to checksum) of the header of each member whose bytes came with
    # it, to check them when they are read again together; None for the others
    marks: np.ndarray
    nbytes: int  # about what it takes up in memory

    def name(self, start):
        """The name of the member whose bytes begin at ``start``."""
        name = self.names[np.searchsorted(self.starts, start)]
        return name.decode("utf-8", "surrogateescape")


MARK = 156


class Tables:
    """The ``Table`` of every shard this process read, by path, while they take up to ``limit``
    bytes: the next epoch reads each member where the table says, and skips the walk."""

    def __init__(self, limit):
        self.limit, self.tables, self.nbytes = limit, {}, 0

    def get(self, path, stamp):
        """The table of ``path`` if kept and its file still has the same ``stamp``, else None."""
        table = self.tables.get(path)
        return table if table is not None and table.stamp == stamp else None

    def keep(self, path, table):
        self.forget(path)
        if self.nbytes + table.nbytes <= self.limit:
            self.tables[path] = table
            self.nbytes += table.nbytes

    def forget(self, path):
        table = self.tables.pop(path, None)
        if table is not None:
            self.nbytes -= table.nbytes

    def clear(self):
        self.tables.clear()
        self.nbytes = 0


# about 200 bytes a sample of a jpg and a label: some 300,000 samples a process
TABLES = Tables(limit=64 * 1024 * 1024)


def checked_table(walked, stamp):
    """The ``Table`` of a walk's ``(headers, starts, small)``, or None when the headers are not all
    plain ustar headers with good checksums."""
    headers, starts, small = walked
    rows = np.frombuffer(b"".join(headers), np.uint8).reshape(-1, BLOCK)
    sizes = tarscan.plain_sizes(rows)
    if sizes is None or tarscan.bad_checksums(rows).size:
        return None
    names = tarscan.header_names(rows)
    names = names.astype(f"S{max(1, int(np.char.str_len(names).max()))}")  # no NUL columns
    marks = np.full(len(rows), None, dtype=object)
    came = np.array([data is not None for data in small], dtype=bool)
    marks[came] = np.ascontiguousarray(rows[came, :MARK]).view(f"V{MARK}").ravel().tolist()
    starts = np.array(starts, dtype=np.int64)
    nbytes = names.nbytes + sizes.nbytes + starts.nbytes + marks.nbytes + MARK * int(came.sum())
    return Table(stamp, names, plain_layout(names), sizes, starts, marks, nbytes)


def _read(descriptor, path, table, column, held):
    """The members in ``column`` of ``table``: those ``held`` (bytes read with their headers) as
    they are, the others (None) read when taken, one ``os.pread`` each."""
    pread = os.pread
    for data, size, start in zip(held, table.sizes[column].tolist(), table.starts[column].tolist()):
        if data is None:
            data = pread(descriptor, size, start)
            if len(data) != size:  # over 2 GiB, or the file cut short meanwhile
                data = _whole(descriptor, path, table, start, size, data)
        yield data


def _read_again(descriptor, path, table, column):
    """The members in ``column`` of ``table``, from a shard read before: a large one as ``_read``
    reads it, one that came with its header read with its header again, which must begin with
    the mark kept (else the shard changed since: the table is forgotten, and the error names the
    member)."""
    pread, columns = os.pread, (table.marks, table.sizes, table.starts)
    for mark, size, start in zip(*(values[column].tolist() for values in columns)):
        if mark is None:
            data = pread(descriptor, size, start)
            if len(data) != size:
                data = _whole(descriptor, path, table, start, size, data)
        else:
            data = pread(descriptor, BLOCK + size, start - BLOCK)
            if len(data) != BLOCK + size:
                data = _whole(descriptor, path, table, start, size, data, header=BLOCK)
            if data[:MARK] != mark:
                TABLES.forget(path)
                raise _changed(path, table.name(start), start - BLOCK)
            data = data[BLOCK:]
        yield data


def _whole(descriptor, path, table, start, size, data, header=0):
    """``data``, the first read of the member at ``start`` (``header`` bytes before it too), read
    on to all its bytes (``tario.pread_exactly``), naming the member if the file ends first."""
    offset, member = start - header, f"member {table.name(start)!r}"
    hint = "was it cut short while it was read?"
    return pread_exactly(descriptor, header + size, offset, path, member, hint, data)


def _changed(path, name, offset):
    return TarFormatError(
        f"{path} changed since this process last read it: the header of member {name!r} at offset "
        f"{offset} is not the one read then (was the shard rewritten while it was in use?)"
    )


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
