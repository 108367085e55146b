"""Hugging Face datasets 5.2.0, streaming with its ``webdataset`` builder over webdataset's tar
shards in the store (no Hub involved): ``split_dataset_by_node`` gives each rank whole shards (when
the shard count is a multiple of the ranks; else every world_size-th sample), the DataLoader
workers split those, a shuffle buffer mixes them. The ``IterableDataset`` has ``state_dict``, which
torchdata's ``StatefulDataLoader`` saves and restores, but not the samples in the shuffle buffer:
datasets documents that those are lost on a resume."""

import functools

from datasets import load_dataset
from datasets.distributed import split_dataset_by_node
from harness import Batches, decode_batch
from tool_webdataset import write_tars
from torchdata.stateful_dataloader import StatefulDataLoader

TITLE = "HF datasets, webdataset streaming"
PACKAGE = "datasets"
VENV = "peers"
READS = "HTTP: one streamed GET per shard (fsspec)"
KEEPS = False  # every epoch from the store
WRITER = "webdataset.ShardWriter (tar)"
CAVEAT = (
    "its shuffle draws from up to `max_buffer_input_shards` shards at once (10 by default since "
    "datasets 5.0). Restoring that shuffle's state in 2 fresh loader workers raised IndexError in "
    "`load_state_dict` here (datasets 5.2.0). With 0 workers, or with `shuffle(..., "
    "max_buffer_input_shards=1)`, it resumes, but the samples that sat in the shuffle buffer are "
    "lost, as datasets documents. The driver keeps the default."
)


def convert(root, out, shards):
    write_tars(root, out, shards)


def jpeg_bytes(value):
    """The JPEG's bytes, as the builder hands them over undecoded."""
    return value["bytes"] if isinstance(value, dict) else value


def collate(items):
    return decode_batch([(item["__key__"], jpeg_bytes(item["jpg"])) for item in items])


@functools.cache
def streamed(urls):
    """The streaming dataset over ``urls``, loaded once per process: a second ``load_dataset``
    after a DataLoader's workers have streamed the first hangs (in fsspec's HTTP glob)."""
    files = {"train": list(urls)}
    return load_dataset("webdataset", data_files=files, split="train", streaming=True)


def open_loader(place, state=None):
    dataset = streamed(tuple(place.urls(".tar"))).decode(False)
    dataset = split_dataset_by_node(dataset, rank=place.rank, world_size=place.world)
    dataset = dataset.shuffle(seed=place.seed, buffer_size=place.buffer)
    dataset.set_epoch(place.epoch)
    loader = StatefulDataLoader(
        dataset, batch_size=place.batch, num_workers=place.workers, collate_fn=collate
    )
    if state is not None:
        loader.load_state_dict(state)
    return Batches(loader)
