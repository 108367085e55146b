"""The peers lab's harness: what every tool's driver shares, and the process that runs one rank.

A driver (``tool_<name>.py`` beside this file) is a module with:

- ``TITLE``: the tool's name in the table; ``PACKAGE``: the distribution whose version is shown;
  ``VENV``: ``"peers"`` or ``"mosaic"``, the side environment it runs in; ``READS``: how it reads
  the store, in words; ``KEEPS``: whether it keeps a local copy that epoch 2 reads instead of the
  store; ``WRITER``: which writer made its files, in words;
- ``convert(root, out, shards)``: write the photos at ``root`` into ``out`` with the tool's own
  writer, about ``shards`` files of samples;
- ``open_loader(place, state=None)``: an iterable of ``(keys, images)`` batches for one rank and
  epoch (``Place``), resumed from ``state`` when given, with ``state_dict()`` for a checkpoint; a
  tool that cannot resume raises ``NotImplementedError`` for a ``state``.

Every tool gets the same bytes of the same photos and decodes them the same way in its loader's
workers: PIL, then a 224×224 ``RandomResizedCrop`` (``decode_crop``). Only the reading differs.

``python harness.py JOB.json`` runs one rank of a job, with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set as ``torchrun`` sets them; it joins a gloo process group
(tools that split by rank look for one), and writes what it saw to the job's ``out`` folder:

- ``epochs``: every epoch of the job in turn, timed from the start of ``open_loader`` (the ranks
  start together, after a barrier): time to the first batch, seconds, every sample's key;
- ``kill``: epoch 0 until ``at`` batches, then a checkpoint (the loader's state and the keys
  delivered so far, written atomically), then on, slowly, until the parent kills the process;
- ``resume``: epoch 0 again from the checkpoint, to its end.

This module runs in both side environments, so it needs only torch, torchvision, numpy and
``packdata.images`` (packdata is installed without its dependencies in .venv-mosaic).
"""

import gc
import importlib
import importlib.metadata
import json
import os
import shutil
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torchvision.transforms import v2

from packdata.images import decode_image

CROP = 224
TRANSFORM = v2.RandomResizedCrop(CROP, antialias=True)
SLOW_AFTER_CHECKPOINT = 0.3  # seconds per batch once checkpointed: the kill lands mid-epoch


@dataclass(frozen=True)
class Place:
    """One rank's loader: who it is, what it reads, with which settings."""

    rank: int
    world: int
    workers: int
    batch: int
    seed: int
    buffer: int  # shuffle buffer, in samples, for tools that have one
    epoch: int
    url: str  # the tool's folder in the store, ending in "/"
    files: tuple  # the names convert wrote, relative to the folder
    cache: str  # a fresh folder for this run: tools that download keep their copies there

    def urls(self, suffix):
        """The store URLs of the tool's files that end in ``suffix``, in name order."""
        return [self.url + name for name in sorted(self.files) if name.endswith(suffix)]


# --- the same data and the same decoding for every tool -------------------------------------------


def photos(root, seed=0):
    """``(key, label, JPEG bytes)`` of every photo at ``root``, in one shuffled order (so that each
    file of samples holds a mix of classes), the same for every tool."""
    root = Path(root)
    samples = json.loads((root / "manifest.json").read_text())["samples"]
    order = np.random.default_rng(seed).permutation(len(samples))
    for index in order:
        sample = samples[index]
        yield sample["key"], sample["label"], (root / sample["path"]).read_bytes()


def manifest_keys(root):
    """The key of every photo at ``root``: what each epoch must deliver exactly once."""
    samples = json.loads((Path(root) / "manifest.json").read_text())["samples"]
    return [sample["key"] for sample in samples]


def per_shard(root, shards):
    """Samples per file when ``root``'s photos are split into ``shards`` files."""
    return -(-len(manifest_keys(root)) // shards)


def decode_crop(jpeg):
    """JPEG bytes to a 3×224×224 uint8 tensor: the course's decoder (``packdata.images``, PIL),
    the one our stream uses, then ``RandomResizedCrop``. The same code for every tool: how a
    tensor is laid out in memory alone moves the crop's cost by half."""
    return TRANSFORM(decode_image(bytes(jpeg)))


def stack(pairs):
    """``[(key, image), …]`` to ``(keys, images)``: the batch every driver hands out."""
    return [str(key) for key, _ in pairs], torch.stack([image for _, image in pairs])


def decode_batch(pairs):
    """``[(key, JPEG bytes), …]`` decoded and cropped, then stacked (a ``collate_fn``)."""
    return stack([(key, decode_crop(jpeg)) for key, jpeg in pairs])


class Batches:
    """A tool's loader as the harness sees it: ``(keys, images)`` batches, and its state."""

    def __init__(self, loader, to_pair=None, state=None):
        self.loader, self.to_pair = loader, to_pair
        self.state = state or getattr(loader, "state_dict", None)

    def __iter__(self):
        return iter(self.loader) if self.to_pair is None else map(self.to_pair, self.loader)

    def state_dict(self):
        if self.state is None:
            raise NotImplementedError("this loader has no state to save")
        return self.state()


def as_text(key):
    """A sample key as str, whatever type a tool stored it as."""
    return key.decode() if isinstance(key, bytes) else str(key)


def download(url, path):
    """GET ``url`` into ``path``, which appears only once complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    with urllib.request.urlopen(url) as answer, partial.open("wb") as file:
        shutil.copyfileobj(answer, file)
    os.replace(partial, path)


# --- one rank -------------------------------------------------------------------------------------


def join_group():
    """``(rank, world size)``, after joining the gloo group the environment describes."""
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def place_for(job, rank, world, epoch):
    return Place(
        rank=rank,
        world=world,
        epoch=epoch,
        files=tuple(job["files"]),
        **{key: job[key] for key in ("workers", "batch", "seed", "buffer", "url", "cache")},
    )


def run_epoch(tool, place, state=None, on_batch=None):
    """``{"keys", "batches", "ttfb", "seconds"}`` of one epoch; ``on_batch(n, loader, keys)`` after
    each batch."""
    keys, batches, first = [], 0, None
    started = time.perf_counter()
    loader = tool.open_loader(place, state)
    for batch_keys, images in loader:
        if images.shape[1:] != (3, CROP, CROP):
            raise ValueError(f"{tool.TITLE}: a batch of shape {tuple(images.shape)}")
        first = first or time.perf_counter() - started
        keys += [as_text(key) for key in batch_keys]
        batches += 1
        if on_batch is not None:
            on_batch(batches, loader, keys)
    seconds = time.perf_counter() - started
    return {"keys": keys, "batches": batches, "ttfb": first, "seconds": seconds}


def write_json(path, value):
    """Write ``value`` as JSON at ``path`` atomically."""
    path = Path(path)
    partial = path.with_name(path.name + ".part")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)


def run_epochs(tool, job, rank, world, out):
    epochs = []
    for epoch in range(job["epochs"]):
        # the last epoch's loader let go now, untimed: some (torchdata.nodes) hold their worker
        # processes in reference cycles that only the collector ends
        gc.collect()
        dist.barrier()  # the ranks start each epoch together
        epochs.append(run_epoch(tool, place_for(job, rank, world, epoch)))
    write_json(out / f"rank{rank}.json", {"epochs": epochs})


def run_until_killed(tool, job, rank, world, out):
    """Epoch 0 with a checkpoint after ``job["at"]`` batches; then slowly on until killed."""
    checkpoint = out / f"checkpoint-rank{rank}.pt"

    def on_batch(batches, loader, keys):
        if batches == job["at"]:
            try:
                state = {"state": loader.state_dict(), "keys": list(keys)}
            except NotImplementedError as why:
                state = {"state": None, "unsupported": str(why), "keys": list(keys)}
            torch.save(state, checkpoint.with_suffix(".part"))
            os.replace(checkpoint.with_suffix(".part"), checkpoint)
        if batches > job["at"]:  # one batch past the checkpoint: it will be delivered again
            write_json(out / f"rank{rank}.progress", {"batches": batches})
            time.sleep(SLOW_AFTER_CHECKPOINT)

    dist.barrier()
    run_epoch(tool, place_for(job, rank, world, 0), on_batch=on_batch)
    write_json(out / f"rank{rank}.progress", {"batches": -1, "ended": True})
    time.sleep(3600)  # the epoch ended before the kill: wait for it all the same


def resume(tool, job, rank, world, out):
    saved = torch.load(Path(job["from"]) / f"checkpoint-rank{rank}.pt", weights_only=False)
    dist.barrier()
    try:
        if saved["state"] is None:
            raise NotImplementedError(saved["unsupported"])
        rest = run_epoch(tool, place_for(job, rank, world, 0), state=saved["state"])
    except NotImplementedError as why:
        rest = {"unsupported": str(why)}
    write_json(out / f"rank{rank}.json", {"before": saved["keys"], "after": rest})


def describe(job):
    """Print what the table says about the tool, and its version, as JSON."""
    tool = importlib.import_module(f"tool_{job['tool']}")
    names = ("TITLE", "PACKAGE", "READS", "KEEPS", "WRITER")
    about = {name.lower(): getattr(tool, name) for name in names}
    about["caveat"] = getattr(tool, "CAVEAT", None)  # what a reader of the table should know
    about["version"] = importlib.metadata.version(tool.PACKAGE)
    print(json.dumps(about))


def convert(job):
    """Time the tool's writer; print the seconds as JSON."""
    tool = importlib.import_module(f"tool_{job['tool']}")
    started = time.perf_counter()
    tool.convert(job["root"], job["dest"], job["shards"])
    print(json.dumps({"seconds": time.perf_counter() - started}))


ONE_PROCESS = {"describe": describe, "convert": convert}
MODES = {"epochs": run_epochs, "kill": run_until_killed, "resume": resume}


def main(argv):
    job = json.loads(Path(argv[1]).read_text())
    if job["mode"] in ONE_PROCESS:
        return ONE_PROCESS[job["mode"]](job)
    tool = importlib.import_module(f"tool_{job['tool']}")
    rank, world = join_group()
    out = Path(job["out"])
    MODES[job["mode"]](tool, job, rank, world, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv)
