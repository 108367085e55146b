"""torchdata.nodes 0.11.0: a pipeline of nodes over webdataset's tar shards. Each rank takes every
``world``-th shard of the epoch's shuffled list; threads GET each shard whole from the store and
split it into samples (``tarfile``), processes decode and crop, then batches. ``Loader`` saves and
restores the whole pipeline's state."""

import io
import random
import tarfile
import urllib.request

from harness import Batches, decode_crop, stack
from tool_webdataset import write_tars
from torchdata import nodes

TITLE = "torchdata.nodes"
PACKAGE = "torchdata"
VENV = "peers"
READS = "HTTP: one GET per shard (urllib, in threads)"
KEEPS = False  # every epoch from the store
WRITER = "webdataset.ShardWriter (tar); nodes has no format"
FETCH_THREADS = 2


def convert(root, out, shards):
    write_tars(root, out, shards)


def shard_samples(url):
    """``[(key, JPEG bytes), …]`` of the shard at ``url``, fetched whole."""
    with urllib.request.urlopen(url) as answer:
        data = answer.read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [
            (member.name.rsplit(".", 1)[0], tar.extractfile(member).read())
            for member in tar
            if member.isfile() and member.name.endswith(".jpg")
        ]


def decode_pair(pair):
    key, jpeg = pair
    return key, decode_crop(jpeg)


def open_loader(place, state=None):
    shards = place.urls(".tar")
    random.Random(f"{place.seed}:{place.epoch}").shuffle(shards)
    node = nodes.IterableWrapper(shards[place.rank :: place.world])
    node = nodes.ParallelMapper(node, shard_samples, num_workers=FETCH_THREADS, method="thread")
    node = nodes.Unbatcher(node)
    node = nodes.ParallelMapper(node, decode_pair, num_workers=place.workers, method="process")
    node = nodes.Mapper(nodes.Batcher(node, batch_size=place.batch, drop_last=False), stack)
    loader = nodes.Loader(node)
    if state is not None:
        loader.load_state_dict(state)
    return Batches(loader)
