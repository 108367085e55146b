"""MosaicML streaming 0.13.0 (in its own environment, .venv-mosaic: it needs an older numpy than
the course's): ``MDSWriter`` writes MDS shards and an ``index.json``; ``StreamingDataset``
downloads shards from ``remote`` into ``local`` as it needs them and partitions samples across
ranks and workers; ``StreamingDataLoader`` saves and restores its position.

streaming ships downloaders for cloud stores and SFTP, none for plain HTTP; ``StoreDownloader``
(a GET per file) joins its table of downloaders by URL scheme, so it reads the same store as
everyone else."""

import functools
import json
import os
import urllib.request
from pathlib import Path

from harness import Batches, decode_batch, photos
from streaming import MDSWriter, StreamingDataLoader, StreamingDataset
from streaming.base.storage import download as mosaic_download
from streaming.base.util import clean_stale_shared_memory

TITLE = "MosaicML streaming"
PACKAGE = "mosaicml-streaming"
VENV = "mosaic"
READS = "HTTP: shards downloaded whole to a local cache (a GET each, a downloader added)"
KEEPS = True  # a local copy read again in epoch 2
WRITER = "streaming.MDSWriter (MDS)"
COLUMNS = {"key": "str", "label": "int", "jpg": "bytes"}


class StoreDownloader(mosaic_download.CloudDownloader):
    """Fetch one file from the store with a GET."""

    @staticmethod
    def _client_identifier():
        return "http"

    def clean_up(self):
        pass

    def _download_file_impl(self, remote, local, timeout):
        partial = f"{local}.{os.getpid()}.part"
        with urllib.request.urlopen(remote, timeout=timeout) as answer, open(partial, "wb") as out:
            out.write(answer.read())
        os.replace(partial, local)


mosaic_download.DOWNLOADER_MAPPINGS["http"] = StoreDownloader


def convert(root, out, shards):
    manifest = json.loads((Path(root) / "manifest.json").read_text())
    size_limit = int(sum(s["bytes"] for s in manifest["samples"]) / shards * 1.05)
    with MDSWriter(out=str(out), columns=COLUMNS, size_limit=size_limit) as writer:
        for key, label, jpeg in photos(root):
            writer.write({"key": key, "label": label, "jpg": jpeg})


def collate(items):
    return decode_batch([(item["key"], item["jpg"]) for item in items])


@functools.cache
def rank_loader(url, cache, seed, batch, workers):
    """One dataset and loader for the rank's process, iterated once each epoch, as streaming
    expects: a ``StreamingDataset`` counts the epochs itself, from 0 when it is new, so one made
    anew each epoch would repeat the first epoch's order."""
    dataset = StreamingDataset(
        remote=url.rstrip("/"),
        local=f"{cache}/mosaic",
        shuffle=True,
        shuffle_seed=seed,
        batch_size=batch,
    )
    return StreamingDataLoader(dataset, batch_size=batch, num_workers=workers, collate_fn=collate)


def open_loader(place, state=None):
    if state is not None:  # after a kill: streaming's own advice, once, before the dataset
        clean_stale_shared_memory()
    loader = rank_loader(place.url, place.cache, place.seed, place.batch, place.workers)
    if state is not None:
        loader.load_state_dict(state)
    return Batches(loader)
