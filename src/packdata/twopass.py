"""Shuffle a dataset bigger than memory before sharding, in two passes over buckets on disk.

A full shuffle needs every sample in memory, or the input read in random order: a request per
sample, the small-files problem again. Two passes need neither:

1. **scatter**: each input (a chunk of a dataset folder, a shard, an inner tar) is read front to
   back, and each sample appended to one of ``buckets`` piece files, chosen by a hash of its key
   and the seed (``bucket_of``);
2. **gather**: each bucket is loaded alone, shuffled in memory with a generator seeded by the seed
   and the bucket (``shuffle_bucket``), and written as output shards.

Buckets drawn independently and uniformly, then a uniform shuffle inside each, make the whole order
a uniform random permutation, as good as a full shuffle in memory; memory holds one bucket.

Every input and every bucket is a task for any ``concurrent.futures.Executor`` (a process pool, a
Dask cluster's); without one the tasks run here, one after the other. A scatter task writes only
its own piece of each bucket, a gather task only its own shards, each file atomically and the same
bytes every time, so a task that dies can simply run again.

    sources = folder_sources("data/photos-workshop", per_task=100)
    result = two_pass_shuffle(sources, "data/shards-shuffled", buckets=8, seed=0, maxcount=100,
                              executor=ProcessPoolExecutor(2))
"""

import hashlib
import math
import os
import shutil
import tempfile
from collections import Counter
from concurrent.futures import wait
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .atomic import written_atomically
from .layout import members_of
from .samples import FolderSamples
from .shardread import iter_shard_samples
from .shardwrite import (
    SHARD_NAME,
    ShardInfo,
    remove_stale_shards,
    sample_bytes,
    with_unique_keys,
    write_tar,
)
from .tario import END_OF_TAR

PIECE = "t{task:06d}.tar"  # one scatter task's piece of a bucket
BUCKET = "b{bucket:05d}"  # a bucket's folder of pieces


# --- the two random choices -----------------------------------------------------------------------


def bucket_of(key, seed, buckets):
    """The bucket of the sample ``key``: a hash of the seed and the key, uniform over ``0 ..
    buckets - 1``. It depends on nothing else (not on the input's order, nor on which task reads
    the sample), so a task that runs again sends every sample where it sent it the first time."""
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % buckets


def shuffle_bucket(samples, seed, bucket):
    """``samples`` (one bucket's, in the order its pieces hold them) in a uniformly random order,
    drawn from a generator seeded by ``(seed, bucket)``: each bucket its own, the same every run."""
    order = np.random.default_rng([seed, bucket]).permutation(len(samples))
    return [samples[index] for index in order]


# --- inputs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FolderChunk:
    """Samples ``start`` to ``stop`` (in key order) of a dataset folder, as ``jpg`` and ``cls``."""

    root: str
    start: int
    stop: int

    @property
    def name(self):
        return f"{self.root} samples {self.start}..{self.stop - 1}"

    def samples(self, skipped):
        """``(key, {extension: bytes})`` of each sample, read one file after the other."""
        source = FolderSamples(self.root)
        for index in range(self.start, min(self.stop, len(source))):
            key, label, data = source(index)
            yield key, {"jpg": data, "cls": str(label).encode("ascii")}


@dataclass(frozen=True)
class ShardSource:
    """Every sample of one shard (a path or an ``http://`` URL), read whole, in order."""

    shard: str

    @property
    def name(self):
        return self.shard

    def samples(self, skipped):
        for sample in iter_shard_samples([self.shard]):
            yield sample["__key__"], members_of(sample)


def folder_sources(root, per_task=100):
    """The dataset folder at ``root`` as ``FolderChunk`` inputs of ``per_task`` samples each."""
    count = len(FolderSamples(root))
    return [FolderChunk(str(root), start, start + per_task) for start in range(0, count, per_task)]


# --- pass 1: scatter ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScatterTask:
    """Read input ``source`` (task number ``index``) into the bucket folders under ``work``."""

    index: int
    source: object
    work: str
    buckets: int
    seed: int


@dataclass(frozen=True)
class Scattered:
    """What one scatter task wrote: samples per bucket, and what it skipped, by reason."""

    index: int
    counts: tuple
    skipped: Counter


def scatter(task):
    """Pass 1 for one input: append each sample to its bucket's piece for this task. Each piece is
    written front to back and appears whole, or not at all."""
    counts, skipped = [0] * task.buckets, Counter()
    with ExitStack() as pieces:
        files = {}
        for key, members in task.source.samples(skipped):
            bucket = bucket_of(key, task.seed, task.buckets)
            if bucket not in files:
                path = (
                    Path(task.work) / BUCKET.format(bucket=bucket) / PIECE.format(task=task.index)
                )
                files[bucket] = pieces.enter_context(written_atomically(path))
            files[bucket].write(sample_bytes(key, members))
            counts[bucket] += 1
        for file in files.values():
            file.write(END_OF_TAR)
    return Scattered(task.index, tuple(counts), skipped)


# --- pass 2: gather -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GatherTask:
    """Shuffle bucket ``bucket`` and write it as ``shards`` shards numbered from ``first``."""

    bucket: int
    work: str
    sources: tuple  # the name of each scatter task's input, by task number
    seed: int
    out_dir: str
    prefix: str
    first: int
    shards: int


@dataclass(frozen=True)
class Gathered:
    """One bucket written: its shards, and the samples and bytes it held in memory."""

    bucket: int
    shards: list
    held_samples: int
    held_bytes: int


def load_bucket(task):
    """The samples of one bucket, ``(key, members)``, its pieces read in task order; a key that
    comes twice (it always lands in the same bucket) raises ``ValueError`` naming both inputs."""
    folder = Path(task.work) / BUCKET.format(bucket=task.bucket)
    # each piece tNNNNNN.tar holds what input NNNNNN put in the bucket
    inputs = {str(piece): task.sources[int(piece.stem[1:])] for piece in folder.glob("t*.tar")}
    samples = iter_shard_samples(sorted(inputs))
    return list(with_unique_keys(samples, lambda sample: inputs[sample["__url__"]]))


def gather(task):
    """Pass 2 for one bucket: load it, shuffle it, write it as shards of about equal size."""
    samples = shuffle_bucket(load_bucket(task), task.seed, task.bucket)
    held = sum(len(data) for _, members in samples for data in members.values())
    written = []
    for offset, part in enumerate(np.array_split(np.arange(len(samples)), task.shards)):
        name = SHARD_NAME.format(prefix=task.prefix, index=task.first + offset)
        written.append(write_tar(Path(task.out_dir) / name, (samples[i] for i in part)))
    return Gathered(task.bucket, written, len(samples), held)


# --- both passes ----------------------------------------------------------------------------------


@dataclass
class TwoPassResult:
    """The shards written (in order), what was skipped by reason, and each pass's task results."""

    shards: list
    skipped: Counter
    scattered: list = field(repr=False)
    gathered: list = field(repr=False)

    @property
    def samples(self):
        return sum(info.samples for info in self.shards)


def plan(scattered, buckets, maxcount):
    """``(bucket, first shard, shard count)`` of each bucket that holds samples: ``ceil(n /
    maxcount)`` shards for ``n`` samples, numbered on from the buckets before it."""
    totals = np.sum([result.counts for result in scattered], axis=0, dtype=np.int64)
    jobs, first = [], 0
    for bucket in range(buckets):
        count = math.ceil(int(totals[bucket]) / maxcount)
        if count:
            jobs.append((bucket, first, count))
            first += count
    return jobs


def two_pass_shuffle(
    sources,
    out_dir,
    *,
    buckets,
    seed=0,
    maxcount=1000,
    prefix="train",
    executor=None,
    work_dir=None,
    progress=False,
):
    """Write every sample of ``sources`` (inputs such as ``FolderChunk``, ``ShardSource``,
    ``tartars.InnerTar``) as shuffled shards ``out_dir/<prefix>-NNNNNN.tar`` of at most
    ``maxcount`` samples, holding one of ``buckets`` buckets in memory at a time.

    ``executor`` (any ``concurrent.futures.Executor``) runs the tasks of each pass; None runs them
    here. The buckets live in a hidden folder of this run's own, ``.<prefix>.twopass-XXXXXXXX``,
    in ``work_dir`` (default: ``out_dir``; another folder of the same file system), removed at the
    end with all it holds (a run killed outright leaves it behind), and nothing else of
    ``work_dir``: runs may share it. On a cluster, both folders must be on a file system every
    worker sees. The shards are written into it too and moved into place only when all are
    written; older
    ``<prefix>-NNNNNN.tar`` beyond the new set are then removed. (A stop during those moves can
    still mix the two sets, as with ``shardwrite.ShardWriter``: renaming many files is not
    atomic.)"""
    if buckets < 1 or maxcount < 1:
        raise ValueError(f"buckets and maxcount must be at least 1, got {buckets} and {maxcount}")
    if not isinstance(seed, int) or seed < 0:  # numpy's generators take no negative seed
        raise ValueError(f"seed must be a whole number of 0 or more, got {seed!r}")
    sources = list(sources)  # read twice below: a generator would be empty the second time
    if not sources:
        raise ValueError("no inputs: sources is empty, so there is nothing to shuffle")
    out_dir, base = Path(out_dir), Path(work_dir or out_dir)
    for folder in {out_dir, base}:
        folder.mkdir(parents=True, exist_ok=True)
    if os.stat(base).st_dev != os.stat(out_dir).st_dev:
        raise ValueError(
            f"work_dir {base} is on another file system than out_dir {out_dir}: the shards are "
            "written in it and renamed into out_dir at the end, which only works within one"
        )
    work = Path(tempfile.mkdtemp(prefix=f".{prefix}.twopass-", dir=base))
    staging = work / "shards"
    staging.mkdir()
    run = partial(_run_all, executor)
    try:
        tasks = [
            ScatterTask(i, source, str(work), buckets, seed) for i, source in enumerate(sources)
        ]
        scattered = list(_shown(run(scatter, tasks), len(tasks), "scatter", progress))
        names = tuple(source.name for source in sources)
        jobs = [
            GatherTask(bucket, str(work), names, seed, str(staging), prefix, first, count)
            for bucket, first, count in plan(scattered, buckets, maxcount)
        ]
        if not jobs:
            raise ValueError(f"no samples in {len(tasks)} inputs: no shards to write")
        gathered = list(_shown(run(gather, jobs), len(jobs), "gather", progress))
        shards = _moved_into_place(gathered, out_dir, prefix)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    skipped = sum((result.skipped for result in scattered), Counter())
    return TwoPassResult(shards, skipped, scattered, gathered)


def _run_all(executor, function, tasks):
    """``function`` of each of ``tasks``, in order: here, or on ``executor``. When one fails, the
    others are cancelled or waited for before the error goes on, so that none still writes in the
    work folder once it is removed."""
    if executor is None:
        yield from map(function, tasks)
        return
    futures = [executor.submit(function, task) for task in tasks]
    try:
        for future in futures:
            yield future.result()
    finally:
        for future in futures:
            future.cancel()
        wait(futures)


def _shown(results, total, desc, progress):
    return tqdm(results, total=total, desc=desc, unit="task", disable=not progress, leave=False)


def _moved_into_place(gathered, out_dir, prefix):
    """Move every staged shard into ``out_dir``, remove older shards beyond them; their infos."""
    shards = sorted((info for result in gathered for info in result.shards), key=lambda i: i.path)
    moved = []
    for info in shards:
        target = out_dir / info.path.name
        os.replace(info.path, target)
        moved.append(ShardInfo(target, info.samples, info.bytes))
    remove_stale_shards(out_dir, prefix, {info.path for info in moved})
    return moved
