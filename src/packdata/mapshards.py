"""Map a function over every sample of every shard, one shard per task, in parallel.

    map_shards(partial(resize_sample, size=32), "data/shards/train-{000000..000009}.tar",
    "data/shards-32")

Each shard is an independent task that reads one shard and writes one (atomically), which is what
lets a cluster engine run the same function on many machines.
"""

from functools import partial

from tqdm.auto import tqdm

from .images import ENCODED_IMAGES, encode_payload
from .layout import expand_shards, local_targets, members_of
from .perprocess import map_in_processes
from .shardread import iter_shard_samples
from .shardwrite import write_tar


def resize_sample(sample, size=32):
    """A sample with its image resized to ``size``×``size`` and re-encoded as JPEG; other members
    unchanged. Decoded pixels (an ``.npy`` member) raise ``ValueError``: resize those before they
    are packed."""
    if "npy" in sample:
        raise ValueError(
            f"{sample.get('__url__', 'a shard')}: sample {sample.get('__key__')!r} holds decoded "
            "pixels "
            "(.npy); resize_sample re-encodes JPEG and PNG images only"
        )
    members = members_of(sample)
    for extension in ENCODED_IMAGES:
        if extension in members:
            members.pop(extension)
            members["jpg"] = encode_payload(sample[extension], "jpeg", size)
    return members


def map_shard(function, shard, target):
    """Write ``function(sample)`` (``{extension: bytes}``, or None to drop it) for every sample of
    ``shard`` into the shard ``target``, atomically; returns ``(target, samples written)``."""
    mapped = ((sample["__key__"], function(sample)) for sample in iter_shard_samples([shard]))
    info = write_tar(target, ((key, members) for key, members in mapped if members is not None))
    return info.path, info.samples


def map_shards(function, shards, out_dir, processes=2, progress=True):
    """Run ``map_shard`` on every shard in ``processes`` processes, each output named like its input
    in ``out_dir`` (two inputs with the same file name, in different folders, are refused).

    ``function`` must be picklable (a module-level function, or a ``functools.partial`` of one).
    Each shard is an independent task, which is what lets a cluster engine run the same function on
    many machines. Returns the ``(path, samples)`` of each output shard, in input order.
    """
    shards = expand_shards(shards)
    pairs = list(zip(shards, local_targets(shards, out_dir)))
    mapped = map_in_processes(partial(_map_pair, function), pairs, processes)
    return list(
        tqdm(
            mapped,
            total=len(pairs),
            desc="map over shards",
            unit="shard",
            disable=not progress,
            leave=False,
        )
    )


def _map_pair(function, pair):
    return map_shard(function, *pair)
