"""LitData 0.2.76: ``litdata.optimize`` writes binary chunks and an ``index.json``;
``StreamingDataset`` downloads chunks into a local cache as it reads them, and
``StreamingDataLoader`` saves and restores its position.

LitData ships downloaders for cloud stores (s3://, gs://, azure://, hf://) and none for plain HTTP;
its ``register_downloader`` takes one, so ``StoreDownloader`` below (a GET per chunk) lets it read
the same store as everyone else."""

import contextlib
import os
import urllib.request

import litdata
from harness import Batches, decode_batch, per_shard, photos
from litdata.streaming.downloader import Downloader, register_downloader
from litdata.streaming.resolver import Dir

TITLE = "LitData"
PACKAGE = "litdata"
VENV = "peers"
READS = "HTTP: chunks downloaded whole to a local cache (a GET each, its register_downloader)"
KEEPS = True  # a local copy read again in epoch 2
WRITER = "litdata.optimize (chunks)"
CAVEAT = (
    "the driver sets `drop_last=False` so that every sample is delivered; the ranks then take "
    "unequal numbers of batches, which hangs DDP training at its first collective after the "
    "shorter rank stops. LitData's default with several ranks is `drop_last=True`: equal "
    "batches, and the samples beyond the shorter share skipped every epoch."
)


class StoreDownloader(Downloader):
    """Fetch one LitData file from the store with a GET, published atomically."""

    def download_file(self, remote_filepath, local_filepath):
        if os.path.exists(local_filepath):
            return
        os.makedirs(os.path.dirname(local_filepath), exist_ok=True)
        partial = self._temp_download_path(local_filepath)
        with urllib.request.urlopen(remote_filepath) as answer, open(partial, "wb") as file:
            file.write(answer.read())
        self._publish_file(partial, local_filepath)


with contextlib.suppress(ValueError):  # registered already in this process
    register_downloader("http://", StoreDownloader)


def sample(item):
    key, label, jpeg = item
    return {"key": key, "label": label, "jpg": jpeg}


def convert(root, out, shards):
    litdata.optimize(
        fn=sample,
        inputs=list(photos(root)),
        output_dir=str(out),
        chunk_size=per_shard(root, shards),
        num_workers=1,
        mode="overwrite",
    )


def collate(items):
    return decode_batch([(item["key"], item["jpg"]) for item in items])


def open_loader(place, state=None):
    cache = f"{place.cache}/litdata"
    dataset = litdata.StreamingDataset(
        input_dir=Dir(path=cache, url=place.url.rstrip("/")),
        shuffle=True,
        seed=place.seed,
        drop_last=False,  # its default with several ranks drops samples to even them out
    )
    loader = litdata.StreamingDataLoader(
        dataset, batch_size=place.batch, num_workers=place.workers, collate_fn=collate
    )
    if state is not None:
        loader.load_state_dict(state)  # holds the loader's epoch
    else:  # the loader counts the epochs and sets the dataset's: its __iter__ adds 1 first
        loader.current_epoch = place.epoch
    return Batches(loader)
