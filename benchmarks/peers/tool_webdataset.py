"""webdataset 1.0.2: ``WebDataset`` over shards from its own ``ShardWriter``, read from the store
over HTTP (webdataset runs ``curl``), split by node and by worker, then each worker's shards
shuffled with the seed plus the epoch (``detshuffle``, after the split), a shuffle buffer.

webdataset has no state of its own: it resumes through torchdata's ``StatefulDataLoader``, which
replays each worker's stream and skips what was delivered."""

from pathlib import Path

import webdataset as wds
from harness import Batches, decode_crop, per_shard, photos, stack
from torchdata.stateful_dataloader import StatefulDataLoader

TITLE = "webdataset"
PACKAGE = "webdataset"
VENV = "peers"
READS = "HTTP: one GET per shard (curl)"
KEEPS = False  # every epoch from the store
WRITER = "webdataset.ShardWriter (tar)"
CAVEAT = (
    "webdataset 1.0.2 splits the shards over ranks and workers before it shuffles them, so each "
    "rank read the same shards every epoch, in a new order (lesson 5). It resumes through "
    "`StatefulDataLoader`, which replays the epoch up to the checkpoint: every batch before it is "
    "fetched and decoded again, then dropped."
)


def write_tars(root, out, shards):
    """The photos as webdataset shards ``out/train-NNNNNN.tar`` (wids and torchdata.nodes read them
    too)."""
    Path(out).mkdir(parents=True, exist_ok=True)
    pattern = f"{out}/train-%06d.tar"
    with wds.ShardWriter(pattern, maxcount=per_shard(root, shards), verbose=0) as writer:
        for key, label, jpeg in photos(root):
            writer.write({"__key__": key, "jpg": jpeg, "cls": label})


convert = write_tars


def open_loader(place, state=None):
    urls = place.urls(".tar")
    pipeline = (
        wds.WebDataset(
            urls,
            shardshuffle=len(urls),
            detshuffle=True,
            seed=place.seed + place.epoch,  # built anew each epoch: a new order each epoch
            nodesplitter=wds.split_by_node,
            empty_check=False,
        )
        .shuffle(place.buffer, seed=place.seed + place.epoch)
        .to_tuple("__key__", "jpg")
        .map_tuple(None, decode_crop)
        .batched(place.batch, collation_fn=stack)
    )
    loader = StatefulDataLoader(pipeline, batch_size=None, num_workers=place.workers)
    if state is not None:
        loader.load_state_dict(state)
    return Batches(loader)
