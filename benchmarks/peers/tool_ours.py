"""Our stream: ``packdata.streaming.ShardDataset`` over shards from ``packdata.shardwrite``, each
shard one GET from the store; batches collated in the DataLoader workers.

It resumes through torchdata's ``StatefulDataLoader`` once ``ShardDataset`` has ``state_dict`` /
``load_state_dict``; before that, resuming is "pending".
"""

from harness import TRANSFORM, Batches, per_shard
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from packdata.shardwrite import write_shards
from packdata.streaming import ShardDataset

TITLE = "our stream (packdata)"
PACKAGE = "packdata"
VENV = "peers"
READS = "HTTP: one GET per shard"
WRITER = "packdata.shardwrite (tar)"


def convert(root, out, shards):
    write_shards(root, out, maxcount=per_shard(root, shards), progress=False)


def open_loader(place, state=None):
    dataset = ShardDataset(
        place.urls(".tar"),
        rank=place.rank,
        world_size=place.world,
        seed=place.seed,
        buffer_size=place.buffer,
        keys=("__key__", "jpg"),
        transform=TRANSFORM,
        batch_size=place.batch,
    )
    dataset.set_epoch(place.epoch)
    if not hasattr(dataset, "state_dict"):
        if state is not None:
            raise NotImplementedError("pending: ShardDataset has no state_dict yet")
        return Batches(DataLoader(dataset, batch_size=None, num_workers=place.workers))
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=place.workers)
    if state is not None:
        loader.load_state_dict(state)
    return Batches(loader)
