"""A tar's member index: where each member's data starts, so that one read fetches any member.

The index is stored next to the tar as ``<tar>.idx.json`` with the tar's size and mtime; an index
whose tar has changed since is stale, and is rebuilt (or refused, with ``rebuild=False``).

    members = load_index("train.tar")       # {member name: (data offset, size)}
    offset, size = members["000042.jpg"]
"""

import errno
import json
import warnings
from pathlib import Path

from .atomic import written_atomically
from .tario import FileSpans, TarFormatError, iter_members

INDEX_SUFFIX = ".idx.json"
INDEX_FORMAT = ("packdata-tar-index", 1)


class StaleIndexError(ValueError):
    """A tar's index is missing or no longer describes the tar (its size or modification time
    changed)."""


def index_members(fileobj, name=None):
    """``{member name: (data offset, size)}`` of every member that holds file bytes, in archive
    order: regular files, and links (hard or symbolic) at the bytes of the file they name
    (``tario.FileSpans``). A name that appears twice raises ``TarFormatError`` (an index can point
    at only one copy, and streaming refuses it too)."""
    archive = name or getattr(fileobj, "name", "<tar>")
    members, offsets, files = {}, {}, FileSpans(archive)
    for h, offset in iter_members(fileobj, name):
        span = files.span(h.name, h.typeflag, h.linkname, h.offset, offset, h.size, h.sparse)
        if span is None:
            continue
        if h.name in members:
            raise TarFormatError(
                f"{archive}: duplicate member {h.name!r}, at offsets {offsets[h.name]} and "
                f"{h.offset}"
            )
        members[h.name], offsets[h.name] = span, h.offset
    return members


def index_path(tar_path):
    """Where the index of ``tar_path`` lives: next to it, ``<tar>.idx.json``."""
    tar_path = Path(tar_path)
    return tar_path.with_name(tar_path.name + INDEX_SUFFIX)


def build_index(tar_path):
    """Scan ``tar_path``, store its index with the tar's size and mtime in ``<tar>.idx.json``;
    return the index. In a folder this process may not write to (a read-only dataset mount), the
    index is only returned, with a warning: every process that opens the tar scans it again."""
    tar_path = Path(tar_path)
    # before the scan: a tar rewritten meanwhile makes this index stale, not wrong
    stat = tar_path.stat()
    with tar_path.open("rb") as file:
        members = index_members(file, str(tar_path))
    format_name, version = INDEX_FORMAT
    stored = {
        "format": format_name,
        "version": version,
        "tar_size": stat.st_size,
        "tar_mtime_ns": stat.st_mtime_ns,
        "members": members,
    }
    try:
        with written_atomically(index_path(tar_path)) as file:
            file.write(json.dumps(stored).encode("utf-8"))
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):  # a read-only mount: EROFS
            raise
        warnings.warn(
            f"cannot store the index of {tar_path} next to it ({error.strerror}): it is kept in "
            "memory, "
            "and every process that opens the tar scans it again",
            stacklevel=2,
        )
    return members


def mismatch(stored, tar_size, tar_mtime_ns=None):
    """Why a decoded index file does not describe a tar of this size (and mtime, unless None), in
    words; None when it does."""
    if not isinstance(stored, dict):
        return "unreadable: not a JSON object"
    if (stored.get("format"), stored.get("version")) != INDEX_FORMAT:
        return f"unreadable: not an index of format {INDEX_FORMAT}"
    if stored.get("tar_size") != tar_size:
        return f"stale: it is of a tar of {stored.get('tar_size')} bytes, this one holds {tar_size}"
    if tar_mtime_ns not in (None, stored.get("tar_mtime_ns")):
        return "stale: the tar was modified after it was indexed (its mtime changed)"
    if not _spans(stored.get("members")):
        return "unreadable: its members are not names with an offset and a size each"
    return None


def _spans(members):
    """True when ``members`` is ``{name: [offset, size]}`` of whole numbers, none negative."""
    return isinstance(members, dict) and all(
        isinstance(span, list)
        and len(span) == 2
        and all(isinstance(number, int) and number >= 0 for number in span)
        for span in members.values()
    )


def current_members(stored, tar_size, tar_mtime_ns=None):
    """The members of a decoded index file when it describes a tar of this size (and mtime, unless
    None), else None."""
    if mismatch(stored, tar_size, tar_mtime_ns) is not None:
        return None
    return {name: tuple(span) for name, span in stored["members"].items()}


def load_index(tar_path, rebuild=True):
    """The index of ``tar_path`` from ``<tar>.idx.json``. When that is missing, unreadable or stale
    (the tar's size or mtime changed), rebuild it, or with ``rebuild=False`` raise
    ``StaleIndexError``."""
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
        state = "missing" if stored is None else mismatch(stored, stat.st_size, stat.st_mtime_ns)
        raise StaleIndexError(
            f"the index of {tar_path} is {state}; rebuild it with build_index({str(tar_path)!r})"
        )
    return build_index(tar_path)
