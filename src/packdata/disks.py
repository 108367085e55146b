"""What many small files cost the filesystem: page-cache eviction for cold reads, space and inode
overhead, listing and stat time, and published reference figures for common storage types."""

import os
import time
import warnings
from dataclasses import dataclass

NOT_MEASURED = "published typical figure, not measured here"
UNEVICTABLE = {  # filesystems whose files cannot be dropped from memory with posix_fadvise
    "tmpfs": "which keeps files only in memory",
    "ramfs": "which keeps files only in memory",
    "zfs": "whose own cache (the ARC) ignores the request",
}


@dataclass(frozen=True)
class StorageType:
    """Round, typical figures for one kind of storage: ``latency`` in seconds per request or seek,
    ``bandwidth`` in bytes/s for one stream."""

    name: str
    latency: float
    bandwidth: float
    typical: str
    source: str
    usd_per_1000_requests: float | None = None
    status: str = NOT_MEASURED


# Published typical figures, NOT measured here: round numbers from vendor spec sheets and cloud
# provider docs, for orientation only. The lessons measure the emulated store and the local disk
# themselves.
REFERENCE_STORAGE = (
    StorageType(
        "HDD (7,200 rpm)",
        0.012,
        200e6,
        "~8 ms average seek + ~4.2 ms rotational delay (half a turn at 7,200 rpm); 150–285 MB/s "
        "sequential, the most on today's high-capacity drives",
        "hard-drive vendor spec sheets",
    ),
    StorageType(
        "SATA SSD",
        0.0001,
        500e6,
        "~0.1 ms access, ~500 MB/s (the SATA III link caps it)",
        "SSD vendor spec sheets",
    ),
    StorageType(
        "NVMe SSD",
        0.00008,
        3.5e9,
        "0.05–0.1 ms random read at queue depth 1 for NAND flash (~0.01 ms is Optane class); "
        "~3.5 GB/s on PCIe 3.0, ~7 on 4.0, 12–14 on 5.0",
        "SSD vendor spec sheets",
    ),
    StorageType(
        "network filesystem",
        0.001,
        1e9,
        "0.5–2 ms per operation; bandwidth bounded by the link (~1 GB/s on 10 GbE)",
        "NFS/SMB server and network vendor documentation",
    ),
    StorageType(
        "object store (S3-class)",
        0.05,
        100e6,
        "50 ms to the first byte of a small object per GET (AWS gives medians of tens of ms, "
        "and elsewhere roughly 100–200 ms); 85–100 MB/s per connection",
        "AWS's S3 performance guidelines and design patterns, and S3 pricing",
        usd_per_1000_requests=0.0004,
    ),
)


def walk(root):
    """Every entry under ``root`` (files, folders, links) as ``os.DirEntry``, without following
    links."""
    with os.scandir(root) as entries:
        for entry in entries:
            yield entry
            if entry.is_dir(follow_symlinks=False):
                yield from walk(entry.path)


def regular_files(paths):
    """The files named by ``paths``: a path or an iterable of paths; folders are walked."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    for path in paths:
        if os.path.isdir(path):
            yield from (entry.path for entry in walk(path) if entry.is_file(follow_symlinks=False))
        else:
            yield path


def filesystem_type(path):
    """The type of the filesystem holding ``path`` (``"ext4"``, ``"tmpfs"``, …) from
    ``/proc/self/mounts``: the mount point that contains it most closely. None where there is no
    such table (macOS, Windows)."""
    path, best, kind = os.path.realpath(path), "", None
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                _, point, fstype, *_ = line.split()
                point = point.replace("\\040", " ")  # the table escapes spaces in mount points
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fstype
    except OSError:
        return None
    return kind


def evict_from_page_cache(paths):
    """Ask the kernel to drop ``paths`` (files, or folders to walk) from the page cache, so the next
    read comes from the device. Needs no root. Returns False, with a warning, where that cannot
    work: no ``posix_fadvise`` (macOS, Windows), or a filesystem that ignores the request
    (``UNEVICTABLE``)."""
    if not hasattr(os, "posix_fadvise"):
        warnings.warn(
            "os.posix_fadvise is not available on this platform (macOS, Windows): "
            "the page cache was not evicted, so the next reads may be served from memory",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    files = list(regular_files(paths))
    folders = {os.path.dirname(os.path.abspath(path)) for path in files}
    unevictable = sorted({filesystem_type(folder) for folder in folders} & set(UNEVICTABLE))
    if unevictable:
        kind = unevictable[0]
        warnings.warn(
            f"these files are on {kind}, {UNEVICTABLE[kind]}: nothing was evicted, so the next "
            "reads are "
            "served from memory; put the data on a disk to measure cold reads",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    # the kernel drops only clean pages: write out freshly written files first (one call for all)
    os.sync()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def fs_overhead(root):
    """Counts and sizes under ``root``: what many small files cost beyond their bytes.

    ``allocated_bytes`` is what the files occupy on disk (``st_blocks * 512``); for files smaller
    than a block it usually exceeds ``apparent_bytes``, though compressing or inlining filesystems
    can differ.
    """
    files = directories = apparent = allocated = 0
    for entry in walk(root):
        if entry.is_dir(follow_symlinks=False):
            directories += 1
        elif entry.is_file(follow_symlinks=False):
            stat = entry.stat(follow_symlinks=False)
            files += 1
            apparent += stat.st_size
            allocated += stat.st_blocks * 512
    return {
        "files": files,
        "directories": directories,
        "inodes": files + directories,
        "apparent_bytes": apparent,
        "allocated_bytes": allocated,
        "mean_file_bytes": apparent / files if files else 0.0,
        "block_size": os.statvfs(root).f_frsize,  # the unit of allocation (f_bsize: of I/O)
        "waste_fraction": 1 - apparent / allocated if allocated else 0.0,
    }


def time_listing(root):
    """Seconds to list every entry under ``root`` with ``os.scandir`` (metadata only, no file
    contents)."""
    started = time.perf_counter()
    for _ in walk(root):
        pass
    return time.perf_counter() - started


def time_stat(root):
    """Seconds to ``os.stat`` every file under ``root``: one metadata lookup per file, as opening
    each would need."""
    paths = list(regular_files(root))
    started = time.perf_counter()
    for path in paths:
        os.stat(path)
    return time.perf_counter() - started
