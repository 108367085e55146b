"""Our stream: ``packdata.streaming.ShardDataset`` over shards from ``packdata.shardwrite``, each
shard one GET from the store every epoch; batches collated in the DataLoader workers, resumed
through torchdata's ``StatefulDataLoader`` (``ShardDataset.state_dict`` / ``load_state_dict``).

``tool_ours_cache`` reads the same way through a ``packdata.shardcache.ShardCache``."""

from harness import TRANSFORM, Batches, per_shard
from torchdata.stateful_dataloader import StatefulDataLoader

from packdata.shardwrite import write_shards
from packdata.streaming import ShardDataset

TITLE = "our stream (packdata)"
PACKAGE = "packdata"
VENV = "peers"
READS = "HTTP: one GET per shard, every epoch"
KEEPS = False  # every epoch from the store
WRITER = "packdata.shardwrite (tar)"


def convert(root, out, shards):
    write_shards(root, out, maxcount=per_shard(root, shards), progress=False)


def open_loader(place, state=None, cache=None):
    """The loader of one rank and epoch; ``cache``: a ``ShardCache`` to read the shards through."""
    dataset = ShardDataset(
        place.urls(".tar"),
        rank=place.rank,
        world_size=place.world,
        seed=place.seed,
        buffer_size=place.buffer,
        keys=("__key__", "jpg"),
        transform=TRANSFORM,
        batch_size=place.batch,
        cache=cache,
    )
    dataset.set_epoch(place.epoch)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=place.workers)
    if state is not None:
        loader.load_state_dict(state)
    return Batches(loader)
