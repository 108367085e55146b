"""Compressed shards: recognised by their first bytes, decompressed whole, or refused by name.

A shard read whole (``shardread.read_shard``) may be a ``.tar.gz``, ``.tar.bz2`` or ``.tar.xz``,
as ``tar`` and webdataset allow: Python's standard library decompresses all three. A format it
cannot read is named in the error (``zstd-compressed``), so nobody is told "bad header checksum"
about a file that is simply compressed. Random access (``datasets.IndexedTarDataset``) needs an
uncompressed tar.

    decompressed(Path("train.tar.gz").read_bytes(), "train.tar.gz")   # the tar's bytes
"""

import bz2
import gzip
import lzma

# magic bytes -> (name, decompressor or None when the standard library has none)
FORMATS = {
    b"\x1f\x8b": ("gzip", gzip.decompress),
    b"BZh": ("bzip2", bz2.decompress),
    b"\xfd7zXZ\x00": ("xz", lzma.decompress),
    b"\x28\xb5\x2f\xfd": ("zstd", None),
    b"\x04\x22\x4d\x18": ("lz4", None),
}


class CompressionError(ValueError):
    """A shard compressed in a way that cannot be read here, or a damaged compressed stream."""


# bytes 257 to 262 of a tar header: "ustar" then a NUL (POSIX ustar) or a space (GNU tar writes
# "ustar  \x00", and has no name prefix field)
USTAR_MAGIC, GNU_MAGIC = b"ustar\x00", b"ustar "
TAR_MAGICS = (USTAR_MAGIC, GNU_MAGIC)


def is_tar(data):
    """True when ``data`` starts with a ustar header, POSIX or GNU: a tar whose first member's name
    happens to begin like a compressed stream (``BZh0001.jpg``) is still a tar."""
    return data[257:263] in TAR_MAGICS


def compression_of(data):
    """The name of the compression ``data`` starts with (``"gzip"``, ``"zstd"``, ...), or None."""
    if is_tar(data):
        return None
    for magic, (name, _) in FORMATS.items():
        if data[: len(magic)] == magic:
            return name
    return None


def decompressed(data, source="<data>"):
    """``data`` decompressed when it starts with a known compression's magic bytes, else ``data``.

    A compression without a decompressor in the standard library, or a damaged compressed stream,
    raises ``CompressionError`` naming ``source`` and the format."""
    if is_tar(data):
        return data
    for magic, (name, decompress) in FORMATS.items():
        if data[: len(magic)] != magic:
            continue
        if decompress is None:
            raise CompressionError(
                f"{source} is {name}-compressed: not supported; decompress it first "
                f"(for example `{name} -d`) or write the shards uncompressed"
            )
        try:
            return decompress(data)
        except (OSError, EOFError, lzma.LZMAError, ValueError) as error:
            raise CompressionError(f"{source}: damaged {name} stream: {error}") from error
    return data
