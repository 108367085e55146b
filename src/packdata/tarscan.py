"""A whole shard in memory, scanned with numpy: every header checked at once.

A streaming reader of small samples holds a whole shard in memory anyway (mapped, or one GET; large
ones are read member by member, ``memberread``), so it can find every header by walking sizes, then
check all checksums, magics and type flags in a few array operations.
``scan_plain`` handles the layout every shard writer produces (plain ustar members); ``scan_buffer``
falls back to ``tario``'s general walk for pax and GNU extensions.

``scan_plain`` finds the headers one of two ways. Where members are small, it looks for the ustar
magic in every block at once. That reads a word of every 512-byte block; on a shard of large
members (photos: a header every 50 KB or so) those reads cost more than walking would, as each one
misses the CPU's caches and the copies read the same memory again afterwards. There it follows each
header's size to the next header instead: a Python step per member, and only the headers are read.
"""

import numpy as np

from .tario import (
    BLOCK,
    GLOBAL_PAX_TYPE,
    GNU_LONG_TYPES,
    PAX_TYPES,
    USTAR_MAGIC,
    ZERO_BLOCK,
    FileSpans,
    TarFormatError,
    TarHeader,
    check_end,
    missing_end_warning,
    negative_size_error,
    number_field,
    parse_header,
    pax_overrides,
    text_field,
    truncated_error,
)

# members at least this far apart on average (header and data) are found by walking from header to
# header, closer ones by the magic search (photos: about 50 KiB apart; the small shapes: about 1.5);
# the walk lets a few more members come first (a sample's small members may lead)
WALK_SPAN, WALK_SLACK = 16 * 1024, 4

# bytes 256-263 of a header, read as one little-endian 64-bit word, hold the magic at 257-262
_MAGIC_WORD = 256 // 8
_MAGIC_MASK = np.uint64(0x00FFFFFFFFFFFF00)
_MAGIC = np.uint64(int.from_bytes(b"\0" + USTAR_MAGIC + b"\0", "little"))
_MAGIC_BYTES = np.frombuffer(USTAR_MAGIC, np.uint8)


# the place values of an 11-digit octal field, as floats: exact below 2**53, and BLAS multiplies
# them twice as fast
_OCTAL_WEIGHTS = 8.0 ** np.arange(10, -1, -1)
_ENDS = (0, ord(" "))  # what ends an 11-digit field: a 12th digit would be part of the number


def _size_of(data, position, archive):
    """The size field of the header at ``position``: plain octal digits fast, anything else the
    careful way."""
    try:
        # 11 octal digits ended by NUL or space, as tarfile and GNU tar write it
        if data[position + 135] not in _ENDS:
            raise ValueError("a 12th digit")
        return int(data[position + 124 : position + 135], 8)
    except ValueError:
        try:
            # base-256, or digits ended early by NUL or space
            return number_field(data[position + 124 : position + 136])
        except ValueError:
            # a bad checksum says more than we can
            parse_header(data[position : position + BLOCK], archive, position)
            raise TarFormatError(
                f"{archive}: unreadable size in the header at offset {position}"
            ) from None


def _name_of(data, position):
    end = data.find(b"\x00", position, position + 100)
    name = data[position : end if end >= 0 else position + 100].decode("utf-8", "surrogateescape")
    if data[position + 345] and data[position + 257 : position + 263] == USTAR_MAGIC:
        return f"{text_field(data[position + 345 : position + 500])}/{name}"
    return name


def _byte_sums(headers):
    """The sum of each 512-byte row. Its two halves are added as 16-bit numbers (each at most 510);
    each row of those, read as 64 words of four 16-bit lanes, sums without carries between lanes (64
    * 510 < 2**16); the lanes add up."""
    halves = np.add(headers[:, : BLOCK // 2], headers[:, BLOCK // 2 :], dtype=np.uint16)
    lanes = halves.view("<u8").sum(axis=1)
    return sum((lanes >> np.uint64(shift)) & np.uint64(0xFFFF) for shift in (0, 16, 32, 48)).astype(
        np.int64
    )


def _stored_checksums(headers):
    """The checksum field of each row, and the sum of its bytes, when every row writes it as
    ``"%06o\\0 "`` (as tarfile and GNU tar do); else None."""
    field = headers[:, 148:156]
    digits = field[:, :6] - np.uint8(ord("0"))  # a byte below "0" wraps round to above 7
    if (digits > 7).any() or field[:, 6].any() or (field[:, 7] != ord(" ")).any():
        return None
    stored = (digits @ _OCTAL_WEIGHTS[-6:]).astype(np.int64)
    return stored, digits.sum(axis=1, dtype=np.int64) + 6 * ord("0") + ord(" ")


def bad_checksums(headers):
    """Indices of the 512-byte rows of ``headers`` whose stored checksum differs from their byte
    sum."""
    common = _stored_checksums(headers)
    if common is not None:
        stored, field_sums = common
    else:
        field = headers[:, 148:156].astype(np.int64)
        field_sums, digits = field.sum(axis=1), field - ord("0")
        # octal digits; the NULs and spaces around them are skipped
        is_digit = (digits >= 0) & (digits <= 7)
        # 3 bits per octal digit to its right
        weight = 3 * (is_digit[:, ::-1].cumsum(axis=1)[:, ::-1] - is_digit)
        stored = np.where(is_digit, digits << weight, 0).sum(axis=1)
    computed = _byte_sums(headers) - field_sums + 8 * ord(" ")  # the field itself counts as spaces
    return np.flatnonzero(stored != computed)


def verify_checksums(data, positions, archive="<tar>"):
    """Check the header checksums at ``positions`` (multiples of 512) of the tar in ``data`` all at
    once; a mismatch raises ``TarFormatError`` naming the archive and the first bad header's offset.
    """
    position = first_bad_checksum(data, positions)
    if position is not None:
        # raises, with the stored and computed sums
        parse_header(data[position : position + BLOCK], archive, position)
        # a field parse_header accepts
        raise TarFormatError(f"{archive}: bad header checksum at offset {position}")


def first_bad_checksum(data, positions):
    """The first of ``positions`` whose header fails its checksum, or None."""
    if not len(positions):
        return None
    blocks = np.frombuffer(data, np.uint8, count=len(data) // BLOCK * BLOCK).reshape(-1, BLOCK)
    bad = bad_checksums(blocks[np.asarray(positions) // BLOCK])
    return int(positions[bad[0]]) if bad.size else None


def scan_plain(data, archive="<tar>"):
    """The vectorised scan of the common layout, or None when ``data`` is not that layout (then
    ``scan_buffer``'s member-by-member walk decides): POSIX ustar headers of regular files only,
    names of at most 100 bytes, 11-digit octal sizes, a zero block after the last member. Returns
    ``(names as bytes, data offsets, sizes)``, numpy arrays.

    The headers are those ``_walked`` finds, or else every block whose magic says "ustar"; either
    way they must chain exactly (each member's data ends where the next header starts), so a
    lookalike inside a member's data sends a shard of small members the slow way.
    """
    if len(data) % BLOCK or len(data) < 2 * BLOCK:
        return None
    candidates = _walked(data)
    if candidates is None:
        words = np.frombuffer(data, "<u8").reshape(-1, BLOCK // 8)
        candidates = np.flatnonzero((words[:, _MAGIC_WORD] & _MAGIC_MASK) == _MAGIC)
    if not candidates.size or candidates[0] != 0:
        return None
    blocks = np.frombuffer(data, np.uint8).reshape(-1, BLOCK)
    headers = blocks.take(candidates, axis=0)
    sizes = plain_sizes(headers)
    if sizes is None:
        return None
    following = candidates + 1 + (sizes + BLOCK - 1) // BLOCK
    if (
        (following[:-1] != candidates[1:]).any()
        or following[-1] >= len(blocks)
        or blocks[following[-1] : following[-1] + 2].any()  # two zero blocks, or one at the end
    ):
        return None
    bad = bad_checksums(headers)
    if bad.size:
        verify_checksums(data, [int(candidates[bad[0]]) * BLOCK], archive)
    return header_names(headers), (candidates + 1) * BLOCK, sizes


def plain_sizes(headers):
    """The size of each member whose header is a row of ``headers`` (512-byte rows of ``uint8``)
    when every row is a POSIX ustar header of a regular file with an 11-digit octal size (ended by
    NUL or space) and no name prefix; else None: base-256 or 12-digit sizes, a name prefix, links,
    folders, pax or GNU records need the general walk. Checksums are not checked here."""
    digits = headers[:, 124:135] - np.uint8(ord("0"))  # a byte below "0" wraps round to above 7
    flags, ends = headers[:, 156], headers[:, 135]
    if (
        (headers[:, 257:263] != _MAGIC_BYTES).any()
        or (digits > 7).any()
        or not ((ends == _ENDS[0]) | (ends == _ENDS[1])).all()
        or headers[:, 345].any()
        or not ((flags == 0) | (flags == ord("0"))).all()
    ):
        return None
    return (digits @ _OCTAL_WEIGHTS).astype(np.int64)


def header_names(headers):
    """The name field of each row of ``headers``, as a fixed-width bytes array."""
    return np.ascontiguousarray(headers[:, :100]).view("S100").ravel()


def _walked(data):
    """The block numbers of the headers met by going from the first header to the next by its size,
    up to a size field that is no number (the zero block at the end) or the end of ``data``, for
    ``scan_plain`` to check. None as soon as the members met come closer together than
    ``WALK_SPAN`` bytes on average, give or take ``WALK_SLACK``: the magic search is cheaper then
    (a negative size, which sends the walk back, ends here too)."""
    found, position, last = [], 0, len(data) - BLOCK
    while position <= last:
        if len(found) > position // WALK_SPAN + WALK_SLACK:
            return None
        try:
            size = int(data[position + 124 : position + 135], 8)
        except ValueError:
            break
        found.append(position)
        position += BLOCK + size + -size % BLOCK
    return np.array(found, dtype=np.int64) // BLOCK


def scan_buffer(data, archive="<tar>"):
    """``[(member name, data offset, size)]`` of every member of the tar held whole in ``data`` that
    holds file bytes (regular files, and links at the bytes of the file they name), in order.

    The fast path for streaming a shard that was read whole: ``scan_plain`` when the layout allows,
    else a walk that decodes only the name, size and type of each header and applies pax (``x``) and
    GNU long-name records; either way all checksums are verified in one vectorised pass. Damage (a
    bad header, a member that runs past the end) raises ``TarFormatError`` naming ``archive``."""
    members, error = scan_readable(data, archive)
    if error is not None:
        raise error
    return members


def scan_readable(data, archive="<tar>"):
    """``(members, error)``: what ``scan_buffer`` returns for the part of ``data`` before the first
    damage, and the ``TarFormatError`` that describes the damage (None when there is none). For a
    reader that keeps what it can read and reports the rest."""
    try:
        plain = scan_plain(data, archive)
    except TarFormatError:
        plain = None  # a bad checksum: the walk finds where, and keeps what comes before
    if plain is not None:
        names, starts, sizes = (column.tolist() for column in plain)
        return [
            (name.decode("utf-8", "surrogateescape"), *span)
            for name, *span in zip(names, starts, sizes)
        ], None
    members, positions, error = [], [], None
    try:
        _walk(data, archive, members, positions)
    except TarFormatError as caught:
        error = caught
    return _before_bad_checksum(data, archive, members, positions, error)


def _walk(data, archive, members, positions):
    """Walk the headers of ``data`` member by member, appending ``(name, start, size, header
    position)`` of each member with file bytes to ``members`` and every header's position to
    ``positions``."""
    overrides, position, end, files = {}, 0, len(data), FileSpans(archive)
    while True:
        if position + BLOCK > end:
            if position == end and members and not overrides:
                missing_end_warning(archive, members[-1][0])
                return
            after = f"after member {members[-1][0]!r}" if members else "at its start"
            what = f"the header at offset {position} ({after})"
            raise truncated_error(archive, what, BLOCK, max(end - position, 0))
        if data[position] == 0 and data[position : position + BLOCK] == ZERO_BLOCK:
            check_end(archive, position, data[position + BLOCK : position + 2 * BLOCK])
            return
        positions.append(position)
        flag, size = chr(data[position + 156]), overrides.get("size")
        size = _size_of(data, position, archive) if size is None else size
        start = position + BLOCK
        if size < 0 or start + size > end:  # a negative size would send the walk back, forever
            member = f"member {overrides.get('name') or _name_of(data, position)!r} at offset "
            raise (
                negative_size_error(archive, f"{member}{position}", size)
                if size < 0
                else truncated_error(archive, f"{member}{position}", size, end - start)
            )
        if flag in PAX_TYPES or flag in GNU_LONG_TYPES:
            name = _name_of(data, position)
            header = TarHeader(name, size, 0, 0, flag, "", 0, 0, "", "", position)
            overrides = {**overrides, **pax_overrides(header, data[start : start + size], archive)}
        elif flag != GLOBAL_PAX_TYPE:
            name = overrides.get("name") or _name_of(data, position)
            link = overrides.get("linkname") or text_field(data[position + 157 : position + 257])
            sparse = overrides.get("sparse", False)
            span = files.span(name, flag, link, position, start, size, sparse)
            if span is not None:
                members.append((name, *span, position))
            overrides = {}
        position = start + size + -size % BLOCK


def _before_bad_checksum(data, archive, members, positions, error):
    """The walked ``members`` whose header comes before the first bad checksum, and the error: that
    checksum's, when there is one (it comes first in the archive), else the walk's own."""
    bad = first_bad_checksum(data, positions)
    if bad is not None:
        members = [member for member in members if member[3] < bad]
        try:
            verify_checksums(data, [bad], archive)
        except TarFormatError as caught:
            error = caught
    return [member[:3] for member in members], error


def iter_buffer(data, archive="<tar>"):
    """Yield ``(member name, bytes)`` for every regular file of the tar held whole in ``data``, in
    archive order."""
    for name, start, size in scan_buffer(data, archive):
        yield name, data[start : start + size]
