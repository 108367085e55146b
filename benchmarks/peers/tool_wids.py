"""wids 0.1.11: webdataset's indexed reader. A map-style ``ShardListDataset`` from an index
(``index.json``: each shard's URL and sample count) read from the store; it downloads each shard
whole into a local cache (``curl``) and reads samples from the cached tar by index. Split by
``DistributedChunkedSampler``; resumed through torchdata's ``StatefulDataLoader``, which skips what
the sampler already gave."""

import json
from pathlib import Path

import wids
from harness import Batches, decode_crop, stack
from tool_webdataset import write_tars
from torchdata.stateful_dataloader import StatefulDataLoader

TITLE = "wids"
PACKAGE = "wids"
VENV = "peers"
READS = "HTTP: shards downloaded whole to a local cache (curl), then read by index"
KEEPS = True  # a local copy read again in epoch 2
WRITER = "webdataset.ShardWriter (tar) + index"
CAVEAT = (
    "`DistributedChunkedSampler` gives each rank a fixed range of the samples, the same every "
    "epoch; only the order within it changes."
)


def convert(root, out, shards):
    write_tars(root, out, shards)
    shardlist = [
        {"url": path.name, "nsamples": count_samples(path), "filesize": path.stat().st_size}
        for path in sorted(Path(out).glob("*.tar"))
    ]
    index = {"wids_version": 1, "name": "photos", "shardlist": shardlist}
    (Path(out) / "index.json").write_text(json.dumps(index))


def count_samples(path):
    """Samples in one tar shard, counted by wids's own reader."""
    return len(wids.wids.IndexedTarSamples(path=str(path)))


def key_and_image(sample):
    return sample["__key__"], decode_crop(sample[".jpg"].read())  # wids hands over a stream


def open_loader(place, state=None):
    dataset = wids.ShardListDataset(
        place.url + "index.json",
        cache_dir=f"{place.cache}/rank{place.rank}",
        transformations=[key_and_image],
    )
    sampler = wids.DistributedChunkedSampler(
        dataset, num_replicas=place.world, rank=place.rank, seed=place.seed, shuffle=True
    )
    sampler.set_epoch(place.epoch)
    loader = StatefulDataLoader(
        dataset,
        batch_size=place.batch,
        sampler=sampler,
        num_workers=place.workers,
        collate_fn=stack,
    )
    if state is not None:
        loader.load_state_dict(state)
    return Batches(loader)
