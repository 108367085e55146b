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

The next epoch needs no walk: what it found (each member's name, size, offset and the start of its
header) is kept as the shard's ``Table``, by path, in ``TABLES``, for as long as the file keeps its
size, inode and times (``persistent_workers=True`` keeps a DataLoader's workers, and with them their
tables). It is used when a read asks for every member of a sample; otherwise the headers of those
left unread could not be checked, and the shard is walked. No member's bytes are handed out then
before its header is found where the table says, as it was: a label comes in one read with its
header and the next member's, a large member after it in one read of its own, as in the first epoch.
The first sample is read at once, as the walk is: a header that differs there (a rewrite the stamp
missed) sends the shard to the walk again; one that differs later stops the read naming the member.
The tables take about 360 bytes a sample of two members, up to ``TABLES.limit`` a process (threads
share them); beyond it the least recently read are let go.

Shards of small members (closer together than ``tarscan.WALK_SPAN`` on average, where a read per
member would cost more than the bytes), another layout, or damage of any kind get None: the caller
maps the shard and takes the usual path, which also names what is wrong.
"""

import os
import threading
import weakref
from itertools import chain
from typing import NamedTuple

import numpy as np

from . import tarscan
from .layout import keys_digest
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
    table = TABLES.get(path, stamp)
    # read again from the table only when every member is read, and so every header checked
    if table is not None and table.layout and set(table.layout.extensions) <= set(keys):
        again = ReadAgain(descriptor, path, table)
        samples = grouped_tuples(table.layout, path, keys, again.column)
        if samples is None:
            return None
        try:
            first = next(samples, None)  # read now, as the walk reads at once: before any goes out
        except TarFormatError:  # a rewrite the stamp missed, or damage: walk it again
            TABLES.forget(path)
        else:
            if seen is not None:  # the keys of the table, now that the first sample agrees
                seen(keys_digest(table.layout.keys.tolist()))
            return chain([] if first is None else [first], samples, again.end())
    walked = walk_headers(descriptor, status.st_size)
    table = None if walked is None else checked_table(walked, stamp)
    if table is None:
        return None
    TABLES.keep(path, table)
    held = walked[2]

    def members(position, width):
        column = slice(position, None, width)
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
    # the first ``MARK`` bytes (name to checksum) of each member's header, and of the end-of-archive
    # block after the last: compared with the bytes there when the shard is read again
    marks: np.ndarray
    small: np.ndarray  # whether each member came with its header in the walk's read

    @property
    def nbytes(self):
        arrays = [field for field in self if isinstance(field, np.ndarray)]
        keys = 0 if self.layout is None else self.layout.keys.nbytes
        return sum(array.nbytes for array in arrays) + keys + TABLE_OVERHEAD

    def name(self, index):
        return self.names[index].decode("utf-8", "surrogateescape")


MARK = 156
TABLE_OVERHEAD = 2048  # bytes of a table's objects beside its arrays, about


class Tables:
    """The ``Table`` of the shards this process read, by path, up to ``limit`` bytes (the least
    recently read are let go first): the next epoch reads each member where the table says and
    skips the walk."""

    def __init__(self, limit):
        self.limit, self.tables, self.nbytes = limit, {}, 0
        self.lock = threading.Lock()  # threads may read shards at once

    def get(self, path, stamp):
        """The table of ``path`` if kept and its file still has the same ``stamp``, else None."""
        with self.lock:
            table = self.tables.pop(path, None)
            if table is not None and table.stamp == stamp:
                self.tables[path] = table  # the most recently read
                return table
            if table is not None:
                self.nbytes -= table.nbytes
            return None

    def keep(self, path, table):
        with self.lock:
            self._forget(path)
            while self.tables and self.nbytes + table.nbytes > self.limit:
                self._forget(next(iter(self.tables)))  # the least recently read
            if self.nbytes + table.nbytes <= self.limit:
                self.tables[path] = table
                self.nbytes += table.nbytes

    def forget(self, path):
        with self.lock:
            self._forget(path)

    def _forget(self, path):
        table = self.tables.pop(path, None)
        if table is not None:
            self.nbytes -= table.nbytes

    def clear(self):
        with self.lock:
            self.tables.clear()
            self.nbytes = 0


# about 360 bytes a sample of a jpg and a label: some 180,000 samples a process
TABLES = Tables(limit=64 * 1024 * 1024)


def _unlocked():
    TABLES.lock = threading.Lock()  # a thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_unlocked)


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
    marks = np.ascontiguousarray(np.vstack([rows[:, :MARK], np.zeros((1, MARK), np.uint8)]))
    small = np.array([data is not None for data in small], dtype=bool)
    starts = np.array(starts, dtype=np.int64)
    layout = plain_layout(names)
    return Table(stamp, names, layout, sizes, starts, marks.view(f"V{MARK}").ravel(), small)


def _read(descriptor, path, table, column, held):
    """The members in ``column`` of ``table``: those ``held`` (bytes read with their headers) as
    they are, the others (None) read when taken, one ``os.pread`` each."""
    pread = os.pread
    starts = table.starts[column].tolist()
    for data, size, start in zip(held, table.sizes[column].tolist(), starts):
        if data is None:
            data = pread(descriptor, size, start)
            if len(data) != size:  # over 2 GiB, or the file cut short meanwhile
                index = table.starts.searchsorted(start)
                data = _whole(descriptor, path, table, index, size, start, data)
        yield data


class ReadAgain:
    """One more read of a shard from its ``Table``, no walk: no member's bytes are handed out
    before its header is found where the table says, beginning with the mark kept (else the shard
    changed since: the table is forgotten, and the error names the member). A small member comes
    in one read with its header and the next one's (or the end-of-archive block); a large one
    whose header came with no such read costs a read of its header first."""

    def __init__(self, descriptor, path, table):
        self.descriptor, self.path, self.table = descriptor, path, table
        self.lists = [field.tolist() for field in (table.sizes, table.starts, table.small)]
        self.marks = table.marks.tolist()
        self.found = [None] * len(self.marks)  # headers read with the member before them

    def column(self, position, width):
        """The bytes of members ``position``, ``position + width``, ... in turn."""
        pread, descriptor, found, marks = os.pread, self.descriptor, self.found, self.marks
        sizes, starts, small = self.lists
        for index in range(position, len(sizes), width):
            size, start = sizes[index], starts[index]
            if small[index]:
                # its header, its bytes, and the next header: ``span`` bytes from ``header``
                header, span = start - BLOCK, BLOCK + size + -size % BLOCK + MARK
                data = pread(descriptor, span, header)
                if len(data) != span:
                    data = self.read(index, span, header, data)
                if data[:MARK] != marks[index]:
                    self.changed(index)
                found[index + 1] = data[span - MARK :]
                yield data[BLOCK : BLOCK + size]
            else:
                if (found[index] or self.read(index, MARK, start - BLOCK)) != marks[index]:
                    self.changed(index)
                data = pread(descriptor, size, start)
                if len(data) != size:
                    data = self.read(index, size, start, data)
                yield data

    def end(self):
        """Nothing, once the block after the last member is the end-of-archive block it was."""
        last = len(self.marks) - 1
        size, start = self.lists[0][-1], self.lists[1][-1]
        after = start + size + -size % BLOCK
        if (self.found[last] or self.read(last - 1, MARK, after)) != self.marks[last]:
            self.changed(last)
        yield from ()

    def read(self, index, size, offset, data=None):
        return _whole(self.descriptor, self.path, self.table, index, size, offset, data)

    def changed(self, index):
        TABLES.forget(self.path)
        raise _changed(self.path, self.table, index)


def _whole(descriptor, path, table, index, size, offset, data=None):
    """``size`` bytes at ``offset`` for member ``index`` of ``table`` (``data``: a first read of
    them), read on to the end (``tario.pread_exactly``), naming the member if the file ends
    first."""
    hint = "was it cut short while it was read?"
    member = f"member {table.name(index)!r}"
    return pread_exactly(descriptor, size, offset, path, member, hint, data)


def _changed(path, table, index):
    if index < len(table.names):
        where = f"the header of member {table.name(index)!r}"
        offset = table.starts[index] - BLOCK
    else:
        where = "the end-of-archive block"
        offset = table.starts[-1] + table.sizes[-1] + -table.sizes[-1] % BLOCK
    return TarFormatError(
        f"{path} changed since this process last read it: {where} at offset {offset} is not the "
        "one read then (was the shard rewritten while it was in use?)"
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
            following = window[at + BLOCK : at + 2 * BLOCK]
            if len(following) < BLOCK:
                following = os.pread(descriptor, BLOCK, position + BLOCK)
            if following.count(0) != len(following):
                return None  # a header overwritten with zeros: the mapped path names it
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
