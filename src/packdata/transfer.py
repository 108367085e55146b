"""Datasets on a remote store: upload them (one object per image, or as shards), and stage them to
local scratch.

    client = DatasetClient(service.url)
    manifest = upload_objects(client, "shapes-objects", root)  # a PUT per image, and the manifest
    uploaded = upload_shards(client, "shapes-shards", root, maxcount=1000, processes=2)
    ShardDataset([s.url for s in uploaded], sizes=[s.samples for s in uploaded])
    local = stage([s.url for s in uploaded], "/scratch/shapes")  # copy once, train from disk

Uploads and downloads run in threads: they wait on the network, so they overlap even on one core.
"""

import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from .atomic import written_atomically
from .imagefolder import load_manifest
from .layout import expand_shards, local_targets
from .presigned import secrets_withheld
from .shardread import fetch_shard
from .shardwrite import write_shards


@dataclass(frozen=True)
class RemoteShard:
    """One shard on a store: its URL, how many samples it holds, how many bytes."""

    url: str
    samples: int
    bytes: int


def _in_threads(function, items, threads, desc, progress):
    """``[function(item) for item in items]``, run in ``threads`` threads with a progress bar, in
    order."""
    items = list(items)
    with ThreadPoolExecutor(threads) as pool:
        return list(
            tqdm(
                pool.map(function, items),
                total=len(items),
                desc=desc,
                disable=not progress,
                leave=False,
            )
        )


def upload_objects(client, dataset, root, indices=None, threads=8, progress=True):
    """Upload the images of the dataset folder ``root`` one object each, as ``<key>.jpg`` into
    ``dataset`` (created if missing), plus a ``manifest.json`` whose paths name those objects;
    return that manifest.

    ``indices`` picks manifest samples (default: all). ``HttpDataset(client.url_for(dataset),
    manifest)`` reads them.
    """
    manifest = load_manifest(root)
    chosen = (
        manifest["samples"] if indices is None else [manifest["samples"][int(i)] for i in indices]
    )
    client.create(dataset, exist_ok=True)
    _in_threads(
        lambda s: client.upload(dataset, f"{s['key']}.jpg", Path(root) / s["path"]),
        chosen,
        threads,
        f"{dataset}: objects",
        progress,
    )
    flat = {
        **manifest,
        "size": len(chosen),
        "samples": [{**s, "path": f"{s['key']}.jpg"} for s in chosen],
    }
    client.upload(dataset, "manifest.json", json.dumps(flat).encode())
    return flat


@secrets_withheld
def upload_shards(
    client,
    dataset,
    source,
    *,
    maxcount=1000,
    maxsize=None,
    processes=1,
    threads=4,
    prefix="train",
    shuffle_seed=0,
    resize=None,
    progress=True,
):
    """Write ``source`` (a dataset folder or a map-style dataset of ``(image, label)``, see
    ``shards.write_shards``) as shards of at most ``maxcount`` samples and ``maxsize`` bytes, using
    ``processes`` processes, and upload them into ``dataset`` (created if missing) from ``threads``
    threads. Returns a ``RemoteShard`` per shard, in order."""
    client.create(dataset, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="packdata-upload-") as scratch:
        written = write_shards(
            source,
            scratch,
            prefix=prefix,
            maxcount=maxcount,
            maxsize=maxsize,
            shuffle_seed=shuffle_seed,
            processes=processes,
            resize=resize,
            progress=progress,
        )
        urls = _in_threads(
            lambda info: client.upload(dataset, info.path.name, info.path),
            written,
            threads,
            f"{dataset}: upload",
            progress,
        )
    return [RemoteShard(url, info.samples, info.bytes) for url, info in zip(urls, written)]


def _download(url, target):
    with written_atomically(target) as file:
        file.write(fetch_shard(url))  # as stored: a .tar.gz stays compressed
    return target


@secrets_withheld
def stage(urls, scratch, threads=4, progress=True):
    """Copy shards (``http://`` URLs, a brace pattern or paths) into the local folder ``scratch``,
    in parallel; files already there are kept (each was copied whole: a run stopped part-way goes
    on where it stopped), without asking the store whether it still holds the same: stage each
    version of a dataset into a folder of its own. Returns the local paths in order. Each keeps its
    file name, so two shards with the same name (in different folders) are refused."""
    urls = expand_shards(urls)
    targets = local_targets(urls, scratch)
    missing = [(url, target) for url, target in zip(urls, targets) if not target.exists()]
    _in_threads(lambda pair: _download(*pair), missing, threads, "staging", progress)
    return targets
