"""Hugging Face datasets 5.2.0, its own format: Arrow files written by ``save_to_disk``. Arrow
files are memory-mapped, so they are read from a local disk: each rank first fetches every file of
the dataset through the store (a GET each), then reads it map-style with ``DistributedSampler``
and torchdata's ``StatefulDataLoader``."""

import json
from pathlib import Path

from datasets import Dataset, Features, Value, load_from_disk
from harness import Batches, decode_batch, download, photos
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

TITLE = "HF datasets, Arrow"
PACKAGE = "datasets"
VENV = "peers"
READS = "HTTP: every file downloaded to local disk first, then memory-mapped"
KEEPS = True  # a local copy read again in epoch 2
WRITER = "datasets save_to_disk (Arrow)"
FEATURES = Features({"key": Value("string"), "label": Value("int64"), "jpg": Value("binary")})


def convert(root, out, shards):
    columns = {"key": [], "label": [], "jpg": []}
    for key, label, jpeg in photos(root):
        for name, value in zip(columns, (key, label, jpeg)):
            columns[name].append(value)
    Dataset.from_dict(columns, features=FEATURES).save_to_disk(str(out), num_shards=shards)


def collate(items):
    return decode_batch([(item["key"], item["jpg"]) for item in items])


def fetch(place):
    """Every file of the dataset, from the store into this rank's folder; that folder."""
    local = Path(place.cache) / f"rank{place.rank}"
    for name in place.files:
        if not (local / name).exists():  # kept from an earlier epoch
            download(place.url + name, local / name)
    json.loads((local / "state.json").read_text())  # there and whole
    return local


def open_loader(place, state=None):
    dataset = load_from_disk(str(fetch(place)))
    sampler = DistributedSampler(
        dataset, num_replicas=place.world, rank=place.rank, shuffle=True, seed=place.seed
    )
    sampler.set_epoch(place.epoch)
    loader = StatefulDataLoader(
        dataset,
        batch_size=place.batch,
        sampler=sampler,
        num_workers=place.workers,
        collate_fn=collate,
    )
    if state is not None:
        loader.load_state_dict(state)
    return Batches(loader)
