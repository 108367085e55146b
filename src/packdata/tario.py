"""Tar bytes by hand: 512-byte headers, pax and GNU long-name extensions, read and written.

A tar is a sequence of members, each a 512-byte header block followed by its data padded to whole
blocks, and ends with two zero blocks. ``parse_header`` decodes one header; ``iter_members`` walks
an archive (jumping over the data when the file can seek), ``stream_members`` reads one front to
back with its data; ``tar_member`` writes one member the way every writer of the course does, with
every field that could vary fixed. ``tarindex`` builds a member index on ``iter_members``;
``tarscan`` reads a whole shard in memory with numpy.

    for header, data_offset in iter_members(open("train.tar", "rb")):
        print(header.name, header.size, data_offset)
"""

import mmap
import os
import posixpath
import tarfile
import warnings
from dataclasses import dataclass, replace

from .compression import USTAR_MAGIC, compression_of
from .presigned import withheld

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
REGULAR_TYPES = ("0", "\x00", "7")
LINK_TYPES = ("1", "2")  # hard link, symbolic link: read as the earlier member they name
SPARSE_TYPE = "S"  # a GNU sparse file (pax archives mark one with GNU.sparse.* records instead)
PAX_TYPES = ("x", "X")  # extended header for the next member ("X": an old Solaris spelling)
GNU_LONG_TYPES = {"L": "name", "K": "linkname"}  # GNU long name or link name for the next member
EXTENSION_TYPES = (*PAX_TYPES, *GNU_LONG_TYPES)
GLOBAL_PAX_TYPE = "g"  # global extended header: read past, not applied
PAX_FIELDS = {
    "path": ("name", str),
    "linkpath": ("linkname", str),
    "size": ("size", int),
    "mtime": ("mtime", float),
}
# bytes per read from a stream: a corrupt size of 10**30 then reads to the end, not overflows
READ_LIMIT = 1 << 24


class TarFormatError(ValueError):
    """The bytes are not a well-formed tar: a bad checksum, a truncated archive, a malformed
    extension."""


@dataclass(frozen=True)
class TarHeader:
    """One member's header. ``name`` is the full path (the ustar prefix joined in, or a pax/GNU long
    name); ``size`` the length of its data (pax may override it); ``offset`` where its own header
    block starts."""

    name: str
    size: int
    mode: int
    mtime: float
    typeflag: str
    linkname: str
    uid: int
    gid: int
    uname: str
    gname: str
    offset: int
    sparse: bool = False  # GNU.sparse.* records in its pax header

    @property
    def data_offset(self):
        """Where the member's data starts: right after its header block."""
        return self.offset + BLOCK

    @property
    def is_file(self):
        """True for regular files (the members an index holds)."""
        return self.typeflag in REGULAR_TYPES


def number_field(field):
    """A numeric header field: octal digits ended by NUL or space, or GNU base-256 when the top bit
    is set."""
    if field[0] & 0x80:
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    digits = field.split(b"\x00", 1)[0].strip()
    return int(digits, 8) if digits else 0


def text_field(field):
    return field.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def parse_header(block, archive="<tar>", offset=0):
    """The ``TarHeader`` in the 512-byte ``block`` read at ``offset``; None for a zero block (end of
    archive).

    The checksum is verified first: a mismatch raises ``TarFormatError`` naming ``archive`` and
    ``offset``.
    """
    if len(block) != BLOCK:
        raise ValueError(
            f"{archive}: a tar header is {BLOCK} bytes, got {len(block)} at offset {offset}"
        )
    if block == ZERO_BLOCK:
        return None
    # the checksum field itself counts as spaces
    computed = sum(block[:148]) + 8 * ord(" ") + sum(block[156:])
    try:
        stored = number_field(block[148:156])
    except ValueError:
        stored = None
    if stored != computed:
        raise TarFormatError(
            f"{archive}: bad header checksum at offset {offset} (stored {stored}, computed "
            f"{computed}): {not_a_header(block, offset)}"
        )
    prefix = text_field(block[345:500]) if block[257:263] == USTAR_MAGIC else ""
    name = text_field(block[0:100])
    try:
        return TarHeader(
            name=f"{prefix}/{name}" if prefix else name,
            size=number_field(block[124:136]),
            mode=number_field(block[100:108]),
            mtime=number_field(block[136:148]),
            typeflag=chr(block[156]),
            linkname=text_field(block[157:257]),
            uid=number_field(block[108:116]),
            gid=number_field(block[116:124]),
            uname=text_field(block[265:297]),
            gname=text_field(block[297:329]),
            offset=offset,
        )
    except ValueError as error:
        raise TarFormatError(
            f"{archive}: unreadable header of {name!r} at offset {offset}: {error}"
        ) from error


def not_a_header(block, offset):
    """What a block that fails its checksum most likely is, for the error message."""
    compression = compression_of(block) if offset == 0 else None
    if compression:
        return (
            f"the file is {compression}-compressed; shards stream compressed (ShardDataset, "
            "shardread), but an index and random access need a plain tar: decompress it first"
        )
    return "not a tar archive, or corrupt at this point"


def parse_pax(data, archive="<tar>", offset=0):
    """The records of a pax extended header, ``"<length> <key>=<value>\\n"`` each, as a dict of
    strings."""
    records, position = {}, 0
    while position < len(data):
        try:
            length = int(data[position:].split(b" ", 1)[0])
            record = data[position : position + length]
            if length < 1 or not record.endswith(b"\n"):
                raise ValueError(f"record length {length} does not end a record")
            key, value = record[record.index(b" ") + 1 : -1].split(b"=", 1)
            key = key.decode("utf-8")  # keys are UTF-8 by the standard; values may hold any bytes
        except ValueError as error:  # UnicodeDecodeError included
            raise TarFormatError(
                f"{archive}: malformed pax header at offset {offset}: {error}"
            ) from error
        records[key] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


def pax_overrides(header, data, archive):
    """The fields an extension header (pax or GNU long name) sets on the member that follows it."""
    if header.typeflag in GNU_LONG_TYPES:
        return {GNU_LONG_TYPES[header.typeflag]: text_field(data)}
    records, overrides = parse_pax(data, archive, header.offset), {}
    if any(key.startswith("GNU.sparse.") for key in records):
        overrides["sparse"] = True
        if "GNU.sparse.name" in records:  # formats 0.1 and 1.0 hide the real name there
            overrides["name"] = records["GNU.sparse.name"]
    for key, (field, kind) in PAX_FIELDS.items():
        if key in records:
            try:
                overrides[field] = kind(records[key])
            except ValueError as error:
                raise TarFormatError(
                    f"{archive}: bad pax record {key}={records[key]!r} in the header at offset "
                    f"{header.offset}: {error}"
                ) from None
    return overrides


# --- which members hold file bytes ----------------------------------------------------------------


class FileSpans:
    """Where each member's file bytes are, as ``tarfile.extractfile`` reads them: a regular file's
    are its own data; a hard or symbolic link's are those of the earlier member it names; a folder,
    a device or a fifo has none. A sparse file is refused: its data on the tape is not its bytes.

    Feed it the members in archive order; ``span`` answers ``(data offset, size)`` or None."""

    def __init__(self, archive):
        self.archive, self.spans = archive, {}

    def span(self, name, typeflag, linkname, offset, start, size, sparse=False):
        """``(start, size)`` of the member's file bytes, or None when it has none."""
        where = f"{self.archive}: member {name!r} at offset {offset}"
        if sparse or typeflag == SPARSE_TYPE:
            raise TarFormatError(
                f"{where} is a sparse file, which packdata does not read: write the archive "
                "without --sparse, or unpack it and pack it again"
            )
        if typeflag in REGULAR_TYPES and not (typeflag == "\x00" and name.endswith("/")):
            found = (start, size)
        elif typeflag in LINK_TYPES:
            found = self.spans.get(self.target(name, typeflag, linkname))
            if found is None:
                raise TarFormatError(
                    f"{where} links to {linkname!r}, which is no earlier file of the archive"
                )
        else:
            return None  # a folder (also a v7 one, named with a slash), a device, a fifo
        self.spans[posixpath.normpath(name)] = found
        return found

    @staticmethod
    def target(name, typeflag, linkname):
        """The normalised name a link points at: a hard link's from the archive's root, a symbolic
        link's from the link's own folder (as tarfile resolves them)."""
        if typeflag == "2":
            linkname = posixpath.join(posixpath.dirname(name), linkname)
        return posixpath.normpath(linkname)


# --- walking an archive ---------------------------------------------------------------------------


def truncated_error(archive, what, needed, left):
    return TarFormatError(
        f"{archive} is truncated: {what} needs {needed} bytes, only {left} are left"
    )


def pread_exactly(descriptor, size, offset, archive, what, hint, data=None):
    """``size`` bytes at ``offset`` of the file open as ``descriptor``: one ``os.pread``, more for
    over about 2 GiB, the most Linux reads at once (``data``: what a first ``pread`` there already
    returned). A file that ends first raises ``TarFormatError`` naming ``what`` of ``archive``, with
    ``hint``, a guess at why."""
    if data is None:
        data = os.pread(descriptor, size, offset)
    while 0 < len(data) < size:
        more = os.pread(descriptor, size - len(data), offset + len(data))
        if not more:
            break
        data += more
    if len(data) != size:
        raise TarFormatError(
            f"{archive} is truncated: {what} at offset {offset}: {len(data):,} of its {size:,} "
            f"bytes ({hint})"
        )
    return data


def negative_size_error(archive, member, size):
    return TarFormatError(
        f"{archive}: {member} has a negative size ({size}): the header is corrupt"
    )


def missing_end_warning(archive, previous):
    """The warning for a tar that ends right after a member, without its two zero blocks."""
    warnings.warn(
        f"{withheld(str(archive))} ends after member {previous!r} without its end-of-archive "
        "blocks: read to there, as tar reads it (was the file cut short at a member's end?)",
        stacklevel=3,
    )


def check_end(archive, position, following):
    """A zero block at ``position`` ends the tar when ``following``, the block after it (shorter at
    the end of the file, empty after its last byte), is zero too; a zero block with data after it
    is a header overwritten with zeros: ``TarFormatError`` naming the offset, where tar (and
    ``tarfile``) would end there and lose every member after it without a word."""
    if following.count(0) != len(following):
        raise TarFormatError(
            f"{archive}: a zero block at offset {position}, then data: a tar ends with two zero "
            "blocks, so a header there was overwritten with zeros"
        )


def _read_upto(fileobj, count):
    """Up to ``count`` bytes: fewer only at the end of the file."""
    chunks, missing = [], count
    while missing:  # a pipe or a socket may return less than asked for before its end
        chunk = fileobj.read(min(missing, READ_LIMIT))
        if not chunk:
            break
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def _read_exactly(fileobj, count, archive, what):
    data = _read_upto(fileobj, count)
    if len(data) < count:
        raise truncated_error(archive, what, count, len(data))
    return data


def iter_members(fileobj, name=None):
    """Yield ``(header, data_offset)`` for every member of the tar in ``fileobj``, extension headers
    applied, without reading any data when the file can seek. ``name`` (default: ``fileobj.name``)
    is the archive's name in errors.

    Every member must have a size of at least zero and end inside the file; otherwise
    ``TarFormatError`` names the archive and the member. An archive that ends right after a member,
    without its zero blocks, is read to there with a warning, as tar reads it."""
    for header, _ in _walk(fileobj, name, keep_data=False):
        yield header, header.data_offset


def stream_members(fileobj, name=None):
    """Yield ``(header, data)`` for every member of the tar in ``fileobj``, read front to back: a
    pipe, a socket, an HTTP response or a slice of a file will do (``fileobj.read`` is all it
    needs). Every header's checksum is checked, and problems raise as in ``iter_members`` (where
    Python's ``tarfile`` in stream mode takes a bad header after the first for the end)."""
    return _walk(fileobj, name, keep_data=True)


def _walk(fileobj, name, keep_data):
    """``(header, data)`` of every member; ``data`` is None for a file member of a file that can
    seek, unless ``keep_data``."""
    archive = name or getattr(fileobj, "name", "<tar>")
    seekable = getattr(fileobj, "seekable", lambda: False)()
    position = fileobj.tell() if seekable else 0
    end = fileobj.seek(0, os.SEEK_END) if seekable else None
    overrides, previous = {}, None
    while True:
        if seekable:
            fileobj.seek(position)  # the caller may have moved the file while it held a member
        after = f"after member {previous!r}" if previous else "at its start"
        block = _read_upto(fileobj, BLOCK)
        if (
            not block
            and previous is not None
            and not overrides
            and (end is None or position == end)
        ):
            missing_end_warning(archive, previous)
            return
        if len(block) < BLOCK:
            what = f"the header at offset {position} ({after})"
            raise truncated_error(archive, what, BLOCK, len(block))
        header = parse_header(block, archive, position)
        if header is None:
            check_end(archive, position, _read_upto(fileobj, BLOCK))
            return
        header = replace(header, **overrides)
        member = f"member {header.name!r} at offset {header.offset}"
        # it would send the walk back to a header it has read, and round forever
        if header.size < 0:
            raise negative_size_error(archive, member, header.size)
        if seekable and header.data_offset + header.size > end:
            raise truncated_error(archive, member, header.size, max(end - header.data_offset, 0))
        is_meta = header.typeflag in EXTENSION_TYPES or header.typeflag == GLOBAL_PAX_TYPE
        data = (
            _read_exactly(fileobj, header.size, archive, member)
            if is_meta or keep_data or not seekable
            else None
        )
        position = header.data_offset + header.size + -header.size % BLOCK
        if not seekable:
            _read_exactly(fileobj, -header.size % BLOCK, archive, f"the padding of {member}")
        if header.typeflag in EXTENSION_TYPES:
            overrides = {**overrides, **pax_overrides(header, data, archive)}
        elif not is_meta:
            overrides, previous = {}, header.name
            yield header, data


# --- writing --------------------------------------------------------------------------------------


FIXED_MTIME = 1_577_836_800  # 2020-01-01 00:00:00 UTC, on every member of every archive
END_OF_TAR = 2 * ZERO_BLOCK  # two zero blocks end an archive


def tar_member(name, data):
    """One member, header and padded data, with every field that could vary fixed: a ustar header,
    or a pax one where ustar cannot hold the name (over 100 bytes, or 155 of folders) or the size
    (8 GiB or more), as tar and webdataset write them. ``data``: ``bytes``, ``bytearray``, ``mmap``
    or a contiguous ``memoryview``; anything else raises ``TypeError`` naming the member."""
    data = member_bytes(name, data)
    return member_header(name, data.nbytes) + data + bytes(-data.nbytes % BLOCK)


def member_header(name, size):
    """``tar_member``'s header (a pax one when ustar cannot hold ``name`` or ``size``)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, FIXED_MTIME
    info.uid, info.gid, info.uname, info.gname = 0, 0, "", ""
    try:
        return info.tobuf(tarfile.USTAR_FORMAT)
    except ValueError:  # a name or a size too long for ustar
        return info.tobuf(tarfile.PAX_FORMAT)


def member_bytes(name, data):
    """``data`` as a flat ``memoryview`` of its bytes (its length is the member's size, whatever
    the items of an array view are); else ``TypeError`` naming member ``name``."""
    if not isinstance(data, (bytes, bytearray, memoryview, mmap.mmap)):
        hint = ".encode()" if isinstance(data, str) else "bytes(...) or .tobytes()"
        raise TypeError(
            f"member {name!r}: got {type(data).__name__}, a member is bytes (bytes, bytearray, "
            f"memoryview or mmap): convert it first, for example with {hint}"
        )
    view = memoryview(data)
    if not view.c_contiguous:  # a Fortran-order array's view: its bytes in another order
        raise TypeError(
            f"member {name!r}: a memoryview whose items are not in C order; pass bytes(view)"
        )
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view
