"""A bounded local cache of remote shards, shared by every process on one machine: the middle
ground between staging everything before training and streaming every shard every epoch.

    cache = ShardCache("/scratch/shard-cache", max_bytes=20 * 10**9, ahead=2)
    for path in cache.fetched(urls):   # local paths; the next 2 shards download meanwhile
        read_shard(path)
    dataset = ShardDataset(urls, cache=cache)   # every worker reads its shards through it

A shard is downloaded into a hidden temporary file and renamed into place (``atomic``), so a reader
sees either nothing or the whole shard. Per shard, two lock files (``fcntl.flock``) coordinate the
processes: its *download* lock lets one process fetch it while the others wait for that download
instead of repeating it; its *pin* lock is held shared by every process reading the shard, and
eviction takes it exclusively without waiting, so a shard in use is never removed.

When a new shard needs room, the least recently used shards go first (each use touches the file's
modification time). Shards in use stay even then, so the cache can exceed ``max_bytes`` by what is
pinned at once: ``ahead + 1`` shards per worker. A journal (``events``) records every hit, download,
wait and eviction of every process, so a hit rate can be read per epoch.

The folder must be on a local disk: ``flock`` coordinates the processes of one machine, and is not
to be trusted on network filesystems. Only files named as the cache names them are its shards:
other files in the folder are neither counted nor evicted. A copy is kept as long as there is room,
without asking the store again: a shard set is read as written, and a new version of a shard needs
a new name (or the cache's folder emptied). An uncompressed tar whose download lacks the blocks
that end a tar (cut short) is not kept: its read fails, naming the URL (read without the cache, such
a tar is read to its end with a warning).
"""

import fcntl
import glob
import hashlib
import os
import re
import threading
from collections import Counter
from contextlib import closing, contextmanager, suppress
from pathlib import Path

from .atomic import temporary_prefix, written_atomically
from .compression import decompressed, is_tar
from .httpclient import file_name
from .presigned import secrets_withheld, unsigned
from .readahead import fetched_ahead
from .shardread import fetch_shard
from .tario import BLOCK, END_OF_TAR, TarFormatError

HIT, MISS, WAITED, EVICTED = "hit", "miss", "waited", "evicted"
LOOKUPS = (HIT, MISS, WAITED)  # one of these per shard asked for


def cache_name(url):
    """The file name a shard gets in the cache: its own name, after a short hash of the URL (two
    stores may both have a ``train-000000.tar``) without its signature, so that a shard presigned
    anew, for the next job, is still the one in the cache."""
    digest = hashlib.sha256(unsigned(url).encode()).hexdigest()[:12]
    name = file_name(url) or "shard"
    if len(name.encode()) > LONGEST:  # keep its end, where the suffix is
        name = name.encode()[-LONGEST:].decode(errors="ignore")
    return f"{digest}-{name}"


# a name's bytes kept at most: with the hash and its lock file's suffix, under 255 (the most
# a file name may have on Linux file systems)
LONGEST = 200
CACHED = re.compile(r"[0-9a-f]{12}-.+")  # every name ``cache_name`` gives


# The lock files this process has open. A lock of ``flock`` belongs to the open file, which a
# forked child (a DataLoader worker) shares: had the child kept them, a lock the parent gave up
# would stay held as long as the child lived, and a worker could wait on a download lock that only
# its own copy still holds. So a child points its copies at /dev/null as it starts.
_LOCK_FILES = set()
_OPENING = threading.Lock()  # no fork between opening a lock file and adding it, or the reverse


def _open_lock(path):
    with _OPENING:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        _LOCK_FILES.add(descriptor)
    return descriptor


def _close_lock(descriptor):
    """Close a lock file, which releases its lock (unless a forked child shares it)."""
    with _OPENING:
        _LOCK_FILES.discard(descriptor)
        os.close(descriptor)


def _let_go_of_parents_locks():
    """In a forked child: the parent's lock files closed here (``/dev/null`` in their place, so
    that the objects holding the numbers close something of their own); the parent keeps them."""
    null = os.open(os.devnull, os.O_RDONLY)
    for descriptor in _LOCK_FILES:
        os.dup2(null, descriptor)
    os.close(null)
    _LOCK_FILES.clear()
    _OPENING.release()


os.register_at_fork(
    before=_OPENING.acquire,
    after_in_parent=_OPENING.release,
    after_in_child=_let_go_of_parents_locks,
)


@contextmanager
def flocked(path, operation):
    """Hold ``fcntl.flock(operation)`` on the lock file ``path`` (created when missing) for the
    block."""
    descriptor = _open_lock(path)
    try:
        fcntl.flock(descriptor, operation)
        yield
    finally:
        _close_lock(descriptor)  # closing releases the lock


class Pin:
    """A shard held in the cache: ``path`` to read, ``outcome`` (hit, miss or waited), and a shared
    lock that keeps eviction away until ``release()``."""

    def __init__(self, path, descriptor, outcome):
        self.path, self.outcome, self._descriptor = path, outcome, descriptor

    def release(self):
        """Let eviction remove the shard again (a second call does nothing)."""
        if self._descriptor is not None:
            _close_lock(self._descriptor)
            self._descriptor = None


class ShardCache:
    """Shards from ``http://`` URLs, kept in the folder ``root`` up to about ``max_bytes``, least
    recently used evicted first; a reader going through shards in turn has the next ``ahead`` of
    them downloaded meanwhile. Any number of processes may use one folder at once; the object
    itself pickles as its folder and settings, so DataLoader workers (fork, spawn or forkserver)
    take it along."""

    def __init__(self, root, max_bytes, ahead=2):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        if ahead < 0:
            raise ValueError(f"ahead must be 0 or more shards, got {ahead}")
        self.root, self.max_bytes, self.ahead = Path(root), int(max_bytes), int(ahead)
        (self.root / ".locks").mkdir(parents=True, exist_ok=True)
        self.journal = self.root / ".journal"

    def _lock_file(self, name, kind):
        return self.root / ".locks" / f"{name}.{kind}"

    @secrets_withheld
    def pin(self, url):
        """The shard at ``url`` in the cache, downloaded first unless it is there (or another
        process is downloading it: then wait for that download). Returns a ``Pin``; release it
        when done reading."""
        name = cache_name(url)
        path = self.root / name
        descriptor = _open_lock(self._lock_file(name, "pin"))
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH)  # waits only for an eviction in progress
            if path.exists():
                os.utime(path)  # most recently used now
                outcome = HIT
            else:
                outcome = self._download(url, path)
            self._record(outcome, name, path.stat().st_size)
        except BaseException:  # the lock let go, or the shard stays pinned while this process runs
            _close_lock(descriptor)
            raise
        return Pin(path, descriptor, outcome)

    def _download(self, url, path):
        """Fetch ``url`` into ``path`` (MISS), unless another process did while this one waited
        for the shard's download lock (WAITED)."""
        with flocked(self._lock_file(path.name, "download"), fcntl.LOCK_EX):
            if path.exists():
                os.utime(path)
                return WAITED
            # what a download of this shard killed part-way left (none runs: this lock is ours)
            for leftover in self.root.glob(f"{glob.escape(temporary_prefix(path.name))}*"):
                leftover.unlink(missing_ok=True)
            data = fetch_shard(url)  # one GET; errors name the URL
            if is_tar(data) and (len(data) % BLOCK or data[-len(END_OF_TAR) :] != END_OF_TAR):
                raise TarFormatError(
                    f"{url}: {len(data):,} bytes came, without the blocks that end a tar: the "
                    "download was cut short, or the shard is (it is not kept in the cache)"
                )
            # room made and file written by one process at a time, so the sizes add up
            with flocked(self.root / ".locks" / "cache", fcntl.LOCK_EX):
                self._make_room(len(data))
                with written_atomically(path) as file:
                    file.write(data)
            return MISS

    def entries(self):
        """``[(last use in ns, bytes, name)]`` of the shards in the cache, least recently used
        first: the files named as ``cache_name`` names them. Hidden files (locks, the journal,
        downloads in progress) are no shards, and other files in the folder are not the cache's:
        they are neither counted nor evicted."""
        found = []
        for entry in os.scandir(self.root):
            if not CACHED.fullmatch(entry.name) or not entry.is_file():
                continue
            with suppress(FileNotFoundError):  # evicted meanwhile
                stat = entry.stat()
                found.append((stat.st_mtime_ns, stat.st_size, entry.name))
        return sorted(found)

    def size(self):
        """Bytes of the shards in the cache now."""
        return sum(size for _, size, _ in self.entries())

    def _make_room(self, incoming):
        """Evict least recently used shards that nobody is reading until ``incoming`` more bytes
        fit under ``max_bytes``, or nothing more can go."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        for _, size, name in entries:
            if total + incoming <= self.max_bytes:
                return
            if self._evict(name, size):
                total -= size

    def _evict(self, name, size):
        """Remove shard ``name`` unless some process has it pinned; True when removed."""
        try:
            with flocked(self._lock_file(name, "pin"), fcntl.LOCK_EX | fcntl.LOCK_NB):
                (self.root / name).unlink(missing_ok=True)
        except BlockingIOError:  # pinned: being read, or fetched ahead for a reader
            return False
        self._record(EVICTED, name, size)
        return True

    def _record(self, event, name, size):
        """Append one line to the journal; small appends from many processes do not interleave."""
        descriptor = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, f"{event} {name} {size}\n".encode())
        finally:
            os.close(descriptor)

    def events(self, since=0):
        """The journal from line ``since`` on, every process's: ``[(event, shard name, bytes)]``.
        ``len(cache.events())`` taken before an epoch and passed as ``since`` after it: that
        epoch's."""
        if not self.journal.exists():
            return []
        lines = self.journal.read_text().splitlines()[since:]
        return [_event(line) for line in lines]

    @secrets_withheld
    def read(self, url):
        """The bytes of the shard at ``url`` (decompressed, as ``shardread.read_shard`` gives
        them), through the cache. They stay readable after eviction: removing a file leaves its
        mapping alone."""
        pin = self.pin(url)
        try:
            return decompressed(fetch_shard(str(pin.path)), url)
        finally:
            pin.release()

    @secrets_withheld
    def fetched(self, urls, ahead=None):
        """Yield the local path of each of ``urls`` in turn while a background thread downloads the
        next ``ahead`` (default: the cache's). Each shard stays pinned from its fetch until the next
        path is asked for (or the generator is closed), so eviction never takes a shard that is read
        or about to be. A shard that cannot be fetched raises, naming its URL."""
        for _, path in self.prefetched(urls, ahead):
            if isinstance(path, Exception):
                raise path
            yield path

    def prefetched(self, urls, ahead=None):
        """``(url, local path)`` for each of ``urls`` in turn, as ``fetched``; a shard that cannot
        be fetched comes as ``(url, the exception)``, and the next ones still do. The pins of shards
        fetched ahead and never asked for are released when their fetch ends."""
        ahead = self.ahead if ahead is None else ahead
        with closing(fetched_ahead(self.pin, urls, ahead, unused=Pin.release)) as fetches:
            for url, fetch in fetches:
                try:
                    pin = fetch.result()
                except Exception as error:  # handed to the reader, who names the shard
                    yield url, error
                    continue
                try:
                    yield url, str(pin.path)
                finally:
                    pin.release()

    def reads(self, urls):
        """A ``PrefetchedReads`` of ``urls``: their bytes, asked for in this order, each shard
        downloaded while the ones before it are read."""
        return PrefetchedReads(self.prefetched(urls))


class PrefetchedReads:
    """Call it with each of the URLs it was made for, in their order: the shard's bytes (as
    ``ShardCache.read``), or the error its download raised; ``close()`` lets the last shard go
    and cancels what is still downloading."""

    def __init__(self, prefetched):
        self._prefetched = prefetched

    @secrets_withheld
    def __call__(self, url):
        expected, path = next(self._prefetched, (None, None))
        if expected != url:
            raise RuntimeError(f"asked for {url}, and the prefetched order has {expected} next")
        if isinstance(path, Exception):
            raise path
        return decompressed(fetch_shard(path), url)  # errors name the URL, not the copy

    def close(self):
        self._prefetched.close()


def _event(line):
    """``(event, name, bytes)`` of a journal line ``event name bytes``, the name perhaps with
    spaces."""
    event, rest = line.split(" ", 1)
    name, size = rest.rsplit(" ", 1)
    return event, name, int(size)


def hit_rate(events):
    """Shards found in the cache over shards asked for, in ``events`` (``ShardCache.events``); a
    shard another process downloaded while this one waited counts as found. None when none was
    asked for."""
    counts = Counter(event for event, _, _ in events)
    lookups = sum(counts[kind] for kind in LOOKUPS)
    return (counts[HIT] + counts[WAITED]) / lookups if lookups else None
