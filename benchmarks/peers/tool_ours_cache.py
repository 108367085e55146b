"""Our stream through our shard cache: ``tool_ours``'s ``ShardDataset`` with
``cache=ShardCache(...)`` in the run's cache folder, shared by both ranks and their workers. Each
worker downloads its next shard while it reads one; from the second epoch on, the shards come from
local disk, as they do for the peers that keep a cache of their own. The limit holds the data (as
the peers' caches do by default)."""

from tool_ours import convert  # noqa: F401 (the same shards as our stream)
from tool_ours import open_loader as open_stream

from packdata.shardcache import ShardCache

TITLE = "our stream + ShardCache (packdata)"
PACKAGE = "packdata"
VENV = "peers"
READS = "HTTP: one GET per shard into a local ShardCache (LRU, next shard fetched ahead)"
KEEPS = True  # a local copy read again in epoch 2
WRITER = "packdata.shardwrite (tar)"
LIMIT = 10 * 10**9  # bytes: far more than the lab's data


def open_loader(place, state=None):
    cache = ShardCache(f"{place.cache}/shard-cache", max_bytes=LIMIT, ahead=1)
    return open_stream(place, state, cache=cache)
