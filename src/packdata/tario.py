"""Reading tar archives by hand: 512-byte headers, pax and GNU long-name extensions, and a member index.

A tar is a sequence of members, each a 512-byte header block followed by its data padded to whole
blocks, and ends with a zero block. ``parse_header`` decodes one header; ``iter_members`` walks an
archive (jumping over the data when the file can seek); ``build_index`` records where every member's
data starts, so a reader can later fetch any one member with a single read.

    for header, data_offset in iter_members(open("train.tar", "rb")):
        print(header.name, header.size, data_offset)
"""

import json
import os
import tempfile
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np


BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
USTAR_MAGIC = b"ustar\x00"  # POSIX ustar; GNU tar writes "ustar  \x00" and has no name prefix field
REGULAR_TYPES = ("0", "\x00", "7")
PAX_TYPES = ("x", "X")  # extended header for the next member ("X": an old Solaris spelling)
GNU_LONG_TYPES = {"L": "name", "K": "linkname"}  # GNU long name or link name for the next member
EXTENSION_TYPES = (*PAX_TYPES, *GNU_LONG_TYPES)
GLOBAL_PAX_TYPE = "g"  # global extended header: read past, not applied
PAX_FIELDS = {"path": ("name", str), "linkpath": ("linkname", str), "size": ("size", int), "mtime": ("mtime", float)}
INDEX_SUFFIX = ".idx.json"
READ_LIMIT = 1 << 24  # bytes per read from a stream: a corrupt size of 10**30 then reads to the end, not overflows
INDEX_FORMAT = ("packdata-tar-index", 1)


# --- writing files safely --------------------------------------------------------------------------


@contextmanager
def written_atomically(path):
    """Yield a binary file that becomes ``path`` only when the block succeeds; otherwise nothing is left."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder: give the name of the file to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.partial-", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())  # on disk before the rename: after a crash the name never holds a partial file
        os.chmod(temporary, 0o644)  # mkstemp makes it private; an archive should be readable like any file
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


class TarFormatError(ValueError):
    """The bytes are not a well-formed tar: a bad checksum, a truncated archive, a malformed extension."""


class StaleIndexError(ValueError):
    """A tar's index is missing or no longer describes the tar (its size or modification time changed)."""


@dataclass(frozen=True)
class TarHeader:
    """One member's header. ``name`` is the full path (the ustar prefix joined in, or a pax/GNU long name);
    ``size`` the length of its data (pax may override it); ``offset`` where its own header block starts."""

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

    @property
    def data_offset(self):
        """Where the member's data starts: right after its header block."""
        return self.offset + BLOCK

    @property
    def is_file(self):
        """True for regular files (the members an index holds)."""
        return self.typeflag in REGULAR_TYPES


def _number(field):
    """A numeric header field: octal digits ended by NUL or space, or GNU base-256 when the top bit is set."""
    if field[0] & 0x80:
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    digits = field.split(b"\x00", 1)[0].strip()
    return int(digits, 8) if digits else 0


def _text(field):
    return field.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def parse_header(block, archive="<tar>", offset=0):
    """The ``TarHeader`` in the 512-byte ``block`` read at ``offset``; None for a zero block (end of archive).

    The checksum is verified first: a mismatch raises ``TarFormatError`` naming ``archive`` and ``offset``.
    """
    if len(block) != BLOCK:
        raise ValueError(f"a tar header is {BLOCK} bytes, got {len(block)}")
    if block == ZERO_BLOCK:
        return None
    computed = sum(block[:148]) + 8 * ord(" ") + sum(block[156:])  # the checksum field itself counts as spaces
    try:
        stored = _number(block[148:156])
    except ValueError:
        stored = None
    if stored != computed:
        raise TarFormatError(
            f"{archive}: bad header checksum at offset {offset} (stored {stored}, computed {computed}): "
            "not a tar archive, or corrupt at this point"
        )
    prefix = _text(block[345:500]) if block[257:263] == USTAR_MAGIC else ""
    name = _text(block[0:100])
    try:
        return TarHeader(
            name=f"{prefix}/{name}" if prefix else name,
            size=_number(block[124:136]),
            mode=_number(block[100:108]),
            mtime=_number(block[136:148]),
            typeflag=chr(block[156]),
            linkname=_text(block[157:257]),
            uid=_number(block[108:116]),
            gid=_number(block[116:124]),
            uname=_text(block[265:297]),
            gname=_text(block[297:329]),
            offset=offset,
        )
    except ValueError as error:
        raise TarFormatError(f"{archive}: unreadable header of {name!r} at offset {offset}: {error}") from error


def parse_pax(data, archive="<tar>", offset=0):
    """The records of a pax extended header, ``"<length> <key>=<value>\\n"`` each, as a dict of strings."""
    records, position = {}, 0
    while position < len(data):
        try:
            length = int(data[position:].split(b" ", 1)[0])
            record = data[position:position + length]
            if length < 1 or not record.endswith(b"\n"):
                raise ValueError(f"record length {length} does not end a record")
            key, value = record[record.index(b" ") + 1:-1].split(b"=", 1)
            key = key.decode("utf-8")  # keys are UTF-8 by the standard; values may hold any bytes
        except ValueError as error:  # UnicodeDecodeError included
            raise TarFormatError(f"{archive}: malformed pax header at offset {offset}: {error}") from error
        records[key] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


def _overrides(header, data, archive):
    """The fields an extension header (pax or GNU long name) sets on the member that follows it."""
    if header.typeflag in GNU_LONG_TYPES:
        return {GNU_LONG_TYPES[header.typeflag]: _text(data)}
    records, overrides = parse_pax(data, archive, header.offset), {}
    for key, (field, kind) in PAX_FIELDS.items():
        if key in records:
            try:
                overrides[field] = kind(records[key])
            except ValueError as error:
                raise TarFormatError(f"{archive}: bad pax record {key}={records[key]!r} in the header at offset "
                                     f"{header.offset}: {error}") from None
    return overrides


# --- walking an archive ----------------------------------------------------------------------------


def _truncated(archive, what, needed, left):
    return TarFormatError(f"{archive} is truncated: {what} needs {needed} bytes, only {left} are left")


def _negative_size(archive, member, size):
    return TarFormatError(f"{archive}: {member} has a negative size ({size}): the header is corrupt")


def _read_exactly(fileobj, count, archive, what):
    chunks, missing = [], count
    while missing:  # a pipe or a socket may return less than asked for before its end
        chunk = fileobj.read(min(missing, READ_LIMIT))
        if not chunk:
            raise _truncated(archive, what, count, count - missing)
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def iter_members(fileobj, name=None):
    """Yield ``(header, data_offset)`` for every member of the tar in ``fileobj``, extension headers applied, without
    reading any data when the file can seek. ``name`` (default: ``fileobj.name``) is the archive's name in errors.

    Every member must have a size of at least zero and end inside the file, and the archive must end with a zero
    block; otherwise ``TarFormatError`` names the archive and the member."""
    archive = name or getattr(fileobj, "name", "<tar>")
    seekable = fileobj.seekable()
    position = fileobj.tell() if seekable else 0
    end = fileobj.seek(0, os.SEEK_END) if seekable else None
    overrides, previous = {}, None
    while True:
        if seekable:
            fileobj.seek(position)  # the caller may have moved the file while it held a member
        after = f"after member {previous!r}" if previous else "at its start"
        header = parse_header(_read_exactly(fileobj, BLOCK, archive, f"the header at offset {position} ({after})"),
                              archive, position)
        if header is None:
            return
        header = replace(header, **overrides)
        member = f"member {header.name!r} at offset {header.offset}"
        if header.size < 0:  # it would send the walk back to a header it has read, and round forever
            raise _negative_size(archive, member, header.size)
        if seekable and header.data_offset + header.size > end:
            raise _truncated(archive, member, header.size, max(end - header.data_offset, 0))
        is_meta = header.typeflag in EXTENSION_TYPES or header.typeflag == GLOBAL_PAX_TYPE
        data = _read_exactly(fileobj, header.size, archive, member) if is_meta or not seekable else None
        position = header.data_offset + header.size + -header.size % BLOCK
        if not seekable:
            _read_exactly(fileobj, -header.size % BLOCK, archive, f"the padding of {member}")
        if header.typeflag in EXTENSION_TYPES:
            overrides = {**overrides, **_overrides(header, data, archive)}
        elif not is_meta:
            overrides, previous = {}, header.name
            yield header, header.data_offset


# --- the index -------------------------------------------------------------------------------------


def index_members(fileobj, name=None):
    """``{member name: (data offset, size)}`` of every regular file, in archive order. A name that appears twice
    raises ``TarFormatError`` (an index can point at only one copy, and streaming refuses it too)."""
    members = {}
    for header, offset in iter_members(fileobj, name):
        if header.is_file:
            if header.name in members:
                archive = name or getattr(fileobj, "name", "<tar>")
                raise TarFormatError(f"{archive}: duplicate member {header.name!r}, at offsets "
                                     f"{members[header.name][0] - BLOCK} and {header.offset}")
            members[header.name] = (offset, header.size)
    return members


def index_path(tar_path):
    """Where the index of ``tar_path`` lives: next to it, ``<tar>.idx.json``."""
    tar_path = Path(tar_path)
    return tar_path.with_name(tar_path.name + INDEX_SUFFIX)


def build_index(tar_path):
    """Scan ``tar_path``, store its index with the tar's size and mtime in ``<tar>.idx.json``; return the index.
    In a folder this process may not write to (a read-only dataset mount), the index is only returned, with a
    warning: every process that opens the tar scans it again."""
    tar_path = Path(tar_path)
    stat = tar_path.stat()  # before the scan: a tar rewritten meanwhile makes this index stale, not wrong
    with tar_path.open("rb") as file:
        members = index_members(file, str(tar_path))
    format_name, version = INDEX_FORMAT
    stored = {"format": format_name, "version": version, "tar_size": stat.st_size,
              "tar_mtime_ns": stat.st_mtime_ns, "members": members}
    try:
        with written_atomically(index_path(tar_path)) as file:
            file.write(json.dumps(stored).encode("utf-8"))
    except PermissionError as error:
        warnings.warn(f"cannot store the index of {tar_path} next to it ({error.strerror}): it is kept in memory, "
                      "and every process that opens the tar scans it again", stacklevel=2)
    return members


def current_members(stored, tar_size, tar_mtime_ns=None):
    """The members of a decoded index file when it describes a tar of this size (and mtime, unless None),
    else None."""
    if not isinstance(stored, dict) or (stored.get("format"), stored.get("version")) != INDEX_FORMAT:
        return None
    if stored.get("tar_size") != tar_size or tar_mtime_ns not in (None, stored.get("tar_mtime_ns")):
        return None
    return {name: tuple(span) for name, span in stored["members"].items()}


def load_index(tar_path, rebuild=True):
    """The index of ``tar_path`` from ``<tar>.idx.json``. When that is missing, unreadable or stale (the tar's
    size or mtime changed), rebuild it, or with ``rebuild=False`` raise ``StaleIndexError``."""
    tar_path, path = Path(tar_path), index_path(tar_path)
    stat = tar_path.stat()
    try:
        stored = json.loads(path.read_bytes())
    except FileNotFoundError:
        stored = None
    except ValueError:  # not JSON
        stored = {}
    members = current_members(stored, stat.st_size, stat.st_mtime_ns)
    if members is not None:
        return members
    if not rebuild:
        state = "missing" if stored is None else "unreadable, or stale: the tar's size or mtime changed since"
        raise StaleIndexError(f"the index of {tar_path} is {state}; rebuild it with build_index({str(tar_path)!r})")
    return build_index(tar_path)


# --- the fast path: a whole archive in memory ------------------------------------------------------

_REGULAR_FLAGS = {ord(flag) for flag in REGULAR_TYPES}
_PAX_FLAGS = {ord(flag) for flag in PAX_TYPES}
_GLOBAL_PAX_FLAG = ord(GLOBAL_PAX_TYPE)
_MAGIC_WORD = 256 // 8  # bytes 256-263 of a header, read as one little-endian 64-bit word, hold the magic at 257-262
_MAGIC_MASK = np.uint64(0x00FFFFFFFFFFFF00)
_MAGIC = np.uint64(int.from_bytes(b"\0" + USTAR_MAGIC + b"\0", "little"))
# the place values of an 11-digit octal field, as floats: exact below 2**53, and BLAS multiplies them twice as fast
_OCTAL_WEIGHTS = 8.0 ** np.arange(10, -1, -1)


def _size_of(data, position, archive):
    """The size field of the header at ``position``: plain octal digits fast, anything else the careful way."""
    try:
        return int(data[position + 124:position + 135], 8)  # 11 octal digits, as tarfile and GNU tar write it
    except ValueError:
        try:
            return _number(data[position + 124:position + 136])  # base-256, or digits ended early by NUL or space
        except ValueError:
            parse_header(data[position:position + BLOCK], archive, position)  # a bad checksum says more than we can
            raise TarFormatError(f"{archive}: unreadable size in the header at offset {position}") from None


def _name_of(data, position):
    end = data.find(b"\x00", position, position + 100)
    name = data[position:end if end >= 0 else position + 100].decode("utf-8", "surrogateescape")
    if data[position + 345] and data[position + 257:position + 263] == USTAR_MAGIC:
        return f"{_text(data[position + 345:position + 500])}/{name}"
    return name


def _byte_sums(headers):
    """The sum of each 512-byte row. Its two halves are added as 16-bit numbers (each at most 510); each row of those,
    read as 64 words of four 16-bit lanes, sums without carries between lanes (64 * 510 < 2**16); the lanes add up."""
    halves = np.add(headers[:, :BLOCK // 2], headers[:, BLOCK // 2:], dtype=np.uint16)
    lanes = halves.view("<u8").sum(axis=1)
    return sum((lanes >> np.uint64(shift)) & np.uint64(0xFFFF) for shift in (0, 16, 32, 48)).astype(np.int64)


def _stored_checksums(headers):
    """The checksum field of each row, and the sum of its bytes, when every row writes it as ``"%06o\\0 "`` (as
    tarfile and GNU tar do); else None."""
    field = headers[:, 148:156]
    digits = field[:, :6] - np.uint8(ord("0"))  # a byte below "0" wraps round to above 7
    if (digits > 7).any() or field[:, 6].any() or (field[:, 7] != ord(" ")).any():
        return None
    stored = (digits @ _OCTAL_WEIGHTS[-6:]).astype(np.int64)
    return stored, digits.sum(axis=1, dtype=np.int64) + 6 * ord("0") + ord(" ")


def _bad_checksums(headers):
    """Indices of the 512-byte rows of ``headers`` whose stored checksum differs from their byte sum."""
    common = _stored_checksums(headers)
    if common is not None:
        stored, field_sums = common
    else:
        field = headers[:, 148:156].astype(np.int64)
        field_sums, digits = field.sum(axis=1), field - ord("0")
        is_digit = (digits >= 0) & (digits <= 7)  # octal digits; the NULs and spaces around them are skipped
        weight = 3 * (is_digit[:, ::-1].cumsum(axis=1)[:, ::-1] - is_digit)  # 3 bits per octal digit to its right
        stored = np.where(is_digit, digits << weight, 0).sum(axis=1)
    computed = _byte_sums(headers) - field_sums + 8 * ord(" ")  # the field itself counts as spaces
    return np.flatnonzero(stored != computed)


def verify_checksums(data, positions, archive="<tar>"):
    """Check the header checksums at ``positions`` (multiples of 512) of the tar in ``data`` all at once; a mismatch
    raises ``TarFormatError`` naming the archive and the first bad header's offset."""
    if not len(positions):
        return
    blocks = np.frombuffer(data, np.uint8, count=len(data) // BLOCK * BLOCK).reshape(-1, BLOCK)
    bad = _bad_checksums(blocks[np.asarray(positions) // BLOCK])
    if bad.size:
        position = int(positions[bad[0]])
        parse_header(data[position:position + BLOCK], archive, position)  # raises, with the stored and computed sums
        raise TarFormatError(f"{archive}: bad header checksum at offset {position}")  # a field parse_header accepts


def scan_plain(data, archive="<tar>"):
    """The vectorised scan of the common layout, or None when ``data`` is not that layout (then ``scan_buffer``'s
    member-by-member walk decides): POSIX ustar headers of regular files only, names of at most 100 bytes, 11-digit
    octal sizes, a zero block after the last member. Returns ``(names as bytes, data offsets, sizes)``, numpy arrays.

    Every block whose magic says "ustar" is a candidate header; the candidates must chain exactly (each member's
    data ends where the next header starts), so a lookalike inside a member's data sends the shard the slow way.
    """
    if len(data) % BLOCK or len(data) < 2 * BLOCK:
        return None
    words = np.frombuffer(data, "<u8").reshape(-1, BLOCK // 8)
    candidates = np.flatnonzero((words[:, _MAGIC_WORD] & _MAGIC_MASK) == _MAGIC)
    if not candidates.size or candidates[0] != 0:
        return None
    blocks = np.frombuffer(data, np.uint8).reshape(-1, BLOCK)
    headers = blocks.take(candidates, axis=0)
    digits = headers[:, 124:135] - np.uint8(ord("0"))  # a byte below "0" wraps round to above 7
    flags = headers[:, 156]
    if (digits > 7).any() or headers[:, 345].any() or not ((flags == 0) | (flags == ord("0"))).all():
        return None  # base-256 sizes, a name prefix, links, folders, pax or GNU records: the general walk
    sizes = (digits @ _OCTAL_WEIGHTS).astype(np.int64)
    following = candidates + 1 + (sizes + BLOCK - 1) // BLOCK
    if (following[:-1] != candidates[1:]).any() or following[-1] >= len(blocks) or blocks[following[-1]].any():
        return None
    bad = _bad_checksums(headers)
    if bad.size:
        verify_checksums(data, [int(candidates[bad[0]]) * BLOCK], archive)
    return np.ascontiguousarray(headers[:, :100]).view("S100").ravel(), (candidates + 1) * BLOCK, sizes


def scan_buffer(data, archive="<tar>"):
    """``[(member name, data offset, size)]`` of every regular file of the tar held whole in ``data``, in order.

    The fast path for streaming a shard that was read whole: ``scan_plain`` when the layout allows, else a walk
    that decodes only the name, size and type of each header and applies pax (``x``) and GNU long-name records;
    either way all checksums are verified in one vectorised pass. A member that runs past the end, or a missing
    end-of-archive block, raises ``TarFormatError`` naming ``archive``.
    """
    plain = scan_plain(data, archive)
    if plain is not None:
        names, starts, sizes = (column.tolist() for column in plain)
        return [(name.decode("utf-8", "surrogateescape"), *span) for name, *span in zip(names, starts, sizes)]
    members, positions, overrides, position, end = [], [], {}, 0, len(data)
    while True:
        if position + BLOCK > end:
            after = f"after member {members[-1][0]!r}" if members else "at its start"
            raise _truncated(archive, f"the header at offset {position} ({after})", BLOCK, end - position)
        if data[position] == 0 and data[position:position + BLOCK] == ZERO_BLOCK:
            break
        positions.append(position)
        flag = data[position + 156]
        size = overrides.get("size", None)
        size = _size_of(data, position, archive) if size is None else size
        start = position + BLOCK
        if size < 0 or start + size > end:  # a negative size would send the walk backwards, and round forever
            member = f"member {overrides.get('name') or _name_of(data, position)!r} at offset {position}"
            verify_checksums(data, positions, archive)
            raise _negative_size(archive, member, size) if size < 0 else _truncated(archive, member, size, end - start)
        if flag in _REGULAR_FLAGS:
            members.append((overrides.get("name") or _name_of(data, position), start, size))
            overrides = {}
        elif flag in _PAX_FLAGS or chr(flag) in GNU_LONG_TYPES:
            header = TarHeader(_name_of(data, position), size, 0, 0, chr(flag), "", 0, 0, "", "", position)
            overrides = {**overrides, **_overrides(header, data[start:start + size], archive)}
        elif flag != _GLOBAL_PAX_FLAG:  # a folder, a link, a device: it used up the extension records
            overrides = {}
        position = start + size + -size % BLOCK
    verify_checksums(data, positions, archive)
    return members


def iter_buffer(data, archive="<tar>"):
    """Yield ``(member name, bytes)`` for every regular file of the tar held whole in ``data``, in archive order."""
    for name, start, size in scan_buffer(data, archive):
        yield name, data[start:start + size]
