"""Map a function over every sample of every shard, one shard per task, in parallel.

    map_shards(partial(resize_sample, size=32), "data/shards/train-{000000..000009}.tar",
    "data/shards-32")

Each shard is an independent task that reads one shard and writes one (atomically), which is what
lets a cluster engine run the same function on many machines. ``resize_shard`` is one such task
written with webdataset alone, for a process pool of your own.
"""

import os
from functools import partial

import webdataset as wds
from tqdm.auto import tqdm

from .images import ENCODED_IMAGES, encode_payload
from .layout import expand_shards, local_targets, members_of
from .perprocess import map_in_processes
from .shardread import count_shard_samples, iter_shard_samples
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


def resize_shard(job, size=32):
    """One task of a map over shards, in webdataset alone: resize every sample of the
    shard ``source`` into the shard ``target``; ``job`` is ``(source, target)``.
    Returns ``(target, samples written)``."""
    source, target = job
    temporary = f"{target}.partial"  # renamed when whole: never half a shard at target
    samples = 0
    with wds.TarWriter(temporary) as sink:
        for sample in wds.WebDataset(str(source), shardshuffle=False):
            sink.write({"__key__": sample["__key__"], **resize_sample(sample, size)})
            samples += 1
    os.replace(temporary, target)  # a rename is atomic within one file system
    return target, samples


def map_shard(function, shard, target):
    """Write ``function(sample)`` (``{extension: bytes}``, or None to drop it) for every sample of
    ``shard`` into the shard ``target``, atomically; returns ``(target, samples written)``."""
    mapped = ((sample["__key__"], function(sample)) for sample in iter_shard_samples([shard]))
    info = write_tar(target, ((key, members) for key, members in mapped if members is not None))
    return info.path, info.samples


def map_shards(function, shards, out_dir, processes=2, progress=True):
    """Run ``map_shard`` on every shard in ``processes`` processes, each output named like its input
    in ``out_dir`` (two inputs with the same file name, in different folders, are refused).

    Outputs already in ``out_dir`` are kept, as ``stage`` keeps its copies: each is written
    atomically, so one that exists is complete, and running the map again after a crash or an
    interrupt maps only the shards still missing (after changing ``function``, empty ``out_dir``
    first). ``function`` must be picklable (a module-level function, or a ``functools.partial`` of
    one). Each shard is an independent task, which is what lets a cluster engine run the same
    function on many machines. Returns the ``(path, samples)`` of each output shard, in input
    order.
    """
    shards = expand_shards(shards)
    pairs = list(zip(shards, local_targets(shards, out_dir)))
    missing = [(shard, target) for shard, target in pairs if not target.exists()]
    mapped = map_in_processes(partial(_map_pair, function), missing, processes)
    written = dict(
        tqdm(
            mapped,
            total=len(missing),
            desc="map over shards",
            unit="shard",
            disable=not progress,
            leave=False,
        )
    )
    return [
        (target, written[target] if target in written else count_shard_samples(target))
        for _, target in pairs
    ]


def _map_pair(function, pair):
    return map_shard(function, *pair)
