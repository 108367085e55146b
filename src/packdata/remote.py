"""Datasets on a remote store: upload them (one object per image, or as shards), stage them to local scratch,
and transform every shard in parallel.

    client = DatasetClient(service.url)
    manifest = upload_objects(client, "shapes-objects", root)         # one PUT per image (and the manifest)
    uploaded = upload_shards(client, "shapes-shards", root, maxcount=1000, processes=2)
    ShardDataset([s.url for s in uploaded], sizes=[s.samples for s in uploaded])
    local = stage([s.url for s in uploaded], "/scratch/shapes")       # copy once, then train from disk
    map_shards(partial(resize_sample, size=32), local, "/scratch/shapes-32", processes=2)

Uploads and downloads run in threads: they wait on the network, so they overlap even on one core.
"""

import json
import tempfile
import urllib.parse
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from .data import load_manifest
from .datasets import IMAGE_SUFFIXES, HttpDataset, is_url
from .packing import encode_payload
from .shards import iter_shard_samples, members_of, write_shards, write_tar
from .streaming import expand_shards, read_shard
from .tario import written_atomically

IMAGE_MEMBERS = tuple(suffix[1:] for suffix in IMAGE_SUFFIXES)  # encoded images, which resize_sample re-encodes


@dataclass(frozen=True)
class RemoteShard:
    """One shard on a store: its URL, how many samples it holds, how many bytes."""

    url: str
    samples: int
    bytes: int


def _in_threads(function, items, threads, desc, progress):
    """``[function(item) for item in items]``, run in ``threads`` threads with a progress bar, in order."""
    items = list(items)
    with ThreadPoolExecutor(threads) as pool:
        return list(tqdm(pool.map(function, items), total=len(items), desc=desc, disable=not progress, leave=False))


def upload_objects(client, dataset, root, indices=None, threads=8, progress=True):
    """Upload the images of the dataset folder ``root`` one object each, as ``<key>.jpg`` into ``dataset`` (created
    if missing), plus a ``manifest.json`` whose paths name those objects; return that manifest.

    ``indices`` picks manifest samples (default: all). ``HttpDataset(client.url_for(dataset), manifest)`` reads them.
    """
    manifest = load_manifest(root)
    chosen = manifest["samples"] if indices is None else [manifest["samples"][int(i)] for i in indices]
    client.create(dataset, exist_ok=True)
    _in_threads(lambda s: client.upload(dataset, f"{s['key']}.jpg", Path(root) / s["path"]), chosen, threads,
                f"{dataset}: objects", progress)
    flat = {**manifest, "size": len(chosen), "samples": [{**s, "path": f"{s['key']}.jpg"} for s in chosen]}
    client.upload(dataset, "manifest.json", json.dumps(flat).encode())
    return flat


def upload_shards(client, dataset, source, *, maxcount=1000, maxsize=None, processes=1, threads=4, prefix="train",
                  shuffle_seed=0, resize=None, progress=True):
    """Write ``source`` (a dataset folder or a map-style dataset of ``(image, label)``, see ``shards.write_shards``)
    as shards of at most ``maxcount`` samples and ``maxsize`` bytes, using ``processes`` processes, and upload them
    into ``dataset`` (created if missing) from ``threads`` threads. Returns a ``RemoteShard`` per shard, in order."""
    client.create(dataset, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="packdata-upload-") as scratch:
        written = write_shards(source, scratch, prefix=prefix, maxcount=maxcount, maxsize=maxsize,
                               shuffle_seed=shuffle_seed, processes=processes, resize=resize, progress=progress)
        urls = _in_threads(lambda info: client.upload(dataset, info.path.name, info.path), written, threads,
                           f"{dataset}: upload", progress)
    return [RemoteShard(url, info.samples, info.bytes) for url, info in zip(urls, written)]


class EncodedObjects(HttpDataset):
    """One GET per sample like ``HttpDataset``, but items stay ``(encoded bytes, label)``: the network's share
    of the work alone, to compare with shards streamed undecoded."""

    def __getitem__(self, index):
        return self.read_bytes(index), self.labels[index]


def _download(url, target):
    with written_atomically(target) as file:
        file.write(read_shard(url))
    return target


def _local_targets(shards, folder):
    """``folder / <file name>`` of each shard path or URL, in order. Two shards with the same file name (from
    different folders) would overwrite each other there: that raises ``ValueError`` naming both."""
    targets = {}
    for shard in shards:
        target = Path(folder) / Path(urllib.parse.urlsplit(shard).path if is_url(shard) else shard).name
        if target in targets:
            raise ValueError(f"{targets[target]} and {shard} would both become {target}: give the shards "
                             "distinct file names, or use one folder for each")
        targets[target] = shard
    return list(targets)


def stage(urls, scratch, threads=4, progress=True):
    """Copy shards (``http://`` URLs, a brace pattern or paths) into the local folder ``scratch``, in parallel;
    files already there are kept. Returns the local paths in order. Each keeps its file name, so two shards
    with the same name (in different folders) are refused."""
    urls = expand_shards(urls)
    targets = _local_targets(urls, scratch)
    missing = [(url, target) for url, target in zip(urls, targets) if not target.exists()]
    _in_threads(lambda pair: _download(*pair), missing, threads, "staging", progress)
    return targets


# --- map over shards ----------------------------------------------------------------------------------


def resize_sample(sample, size=32):
    """A sample with its image resized to ``size``×``size`` and re-encoded as JPEG; other members unchanged. Decoded
    pixels (an ``.npy`` member) raise ``ValueError``: resize those before they are packed."""
    if "npy" in sample:
        raise ValueError(f"{sample.get('__url__', 'a shard')}: sample {sample.get('__key__')!r} holds decoded pixels "
                         "(.npy); resize_sample re-encodes JPEG and PNG images only")
    members = members_of(sample)
    for extension in IMAGE_MEMBERS:
        if extension in members:
            members.pop(extension)
            members["jpg"] = encode_payload(sample[extension], "jpeg", size)
    return members


def map_shard(function, shard, target):
    """Write ``function(sample)`` (``{extension: bytes}``, or None to drop it) for every sample of ``shard``
    into the shard ``target``, atomically; returns ``(target, samples written)``."""
    mapped = ((sample["__key__"], function(sample)) for sample in iter_shard_samples([shard]))
    info = write_tar(target, ((key, members) for key, members in mapped if members is not None))
    return info.path, info.samples


def map_shards(function, shards, out_dir, processes=2, progress=True):
    """Run ``map_shard`` on every shard in ``processes`` processes, each output named like its input in ``out_dir``
    (two inputs with the same file name, in different folders, are refused).

    ``function`` must be picklable (a module-level function, or a ``functools.partial`` of one). Each shard is an
    independent task, which is what lets a cluster engine run the same function on many machines. Returns the
    ``(path, samples)`` of each output shard, in input order.
    """
    shards = expand_shards(shards)
    targets = _local_targets(shards, out_dir)
    with ProcessPoolExecutor(processes) as pool:
        futures = {pool.submit(map_shard, function, shard, target): i for i, (shard, target) in
                   enumerate(zip(shards, targets))}
        results = [None] * len(futures)
        for future in tqdm(as_completed(futures), total=len(futures), desc="map over shards", unit="shard",
                           disable=not progress, leave=False):
            results[futures[future]] = future.result()
    return results
