"""Read the next shards while this one is used: a background thread fetches ahead, in order.

A worker that streams shards from a store spends each shard's download waiting, then its decoding
computing. With one shard fetched ahead, the download of shard i+1 overlaps the decoding of shard
i, for the memory of one more shard per worker:

    reads = ReadAhead(urls, read_shard, ahead=1)
    for url in urls:
        data = reads(url)   # this shard's bytes; the next one downloads meanwhile
    reads.close()           # also when stopping early: what is still queued is cancelled
"""

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import islice


def fetched_ahead(read, items, ahead, unused=None):
    """``(item, future of read(item))`` for each of ``items`` in turn, with the next ``ahead``
    already submitted to one background thread. Closing the generator cancels the queued reads and
    lets the running one finish on its own; ``unused(result)``, when given, then gets the result of
    every read made ahead that nobody will take (a cache's pin to release), as it finishes."""
    items, pending = iter(items), deque()
    pool = ThreadPoolExecutor(1, thread_name_prefix="read-ahead")
    try:
        while True:
            wanted = islice(items, ahead + 1 - len(pending))
            pending.extend((item, pool.submit(read, item)) for item in wanted)
            if not pending:
                return
            yield pending.popleft()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        if unused is not None:
            for _, future in pending:
                future.add_done_callback(partial(_hand_back, unused))


def _hand_back(unused, future):
    """``unused(result)`` of a read that finished; a read cancelled or failed left nothing."""
    if not future.cancelled() and future.exception() is None:
        unused(future.result())


class ReadAhead:
    """Call it with each of ``items`` in their order: ``read(item)``, or the exception it raised
    (raised here, for the caller to name the item); the next ``ahead`` items are read meanwhile.
    ``close()`` drops what was read ahead."""

    def __init__(self, items, read, ahead=1):
        self._fetched = fetched_ahead(read, items, ahead)

    def __call__(self, item):
        expected, future = next(self._fetched, (None, None))
        if expected != item:
            raise RuntimeError(f"asked for {item}, and the read-ahead order has {expected} next")
        return future.result()

    def close(self):
        self._fetched.close()
