"""Map a function over every sample of every shard, one shard per task, in parallel.

    map_shards(partial(resize_sample, size=32), "data/shards/train-{000000..000009}.tar",
    "data/shards-32")

    with engines.dask("tcp://scheduler:8786") as executor:     # the same map on a Dask cluster
        map_shards(resize_sample, shards, "data/shards-32", executor=executor)

Each shard is an independent task that reads one shard and writes one (atomically), which is what
lets a cluster engine run the same function on many machines. ``resize_shard`` is one such task
written with webdataset alone, for a process pool of your own; ``shell_sample`` maps a shell
command over samples, as ``tarproc -c`` does (``packdata shards map``).
"""

import glob
import os
import subprocess
import sys
import tempfile
from concurrent.futures import as_completed
from functools import partial
from pathlib import Path

import webdataset as wds

from . import engines
from .atomic import temporary_prefix
from .httpclient import is_url
from .images import ENCODED_IMAGES, resize_short_side
from .layout import expand_shards, local_targets, members_of
from .presigned import secrets_withheld, withheld
from .shardread import count_shard_samples, iter_shard_samples
from .shardwrite import check_sample, write_tar
from .tario import member_bytes


def resize_sample(sample, size=32):
    """A sample with its image resized to ``size`` pixels on its shorter side (the aspect ratio
    kept) and re-encoded as JPEG; other members unchanged. Decoded pixels (an ``.npy`` member)
    raise ``ValueError``: resize those before they are packed."""
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
            try:
                members["jpg"] = resize_short_side(sample[extension], size)
            except (OSError, ValueError) as error:  # PIL's unreadable image is an OSError
                raise ValueError(
                    f"{sample.get('__url__', 'a shard')}: sample {sample.get('__key__')!r}: its "
                    f".{extension} cannot be resized: {error}"
                ) from error
    return members


SAMPLE_STEM = "sample"  # tarproc's name for a sample's files: sample.jpg, sample.cls, ...


def shell_sample(sample, command):
    """``tarproc``'s map in one sample: its members written as ``sample.<extension>`` files into an
    empty temporary folder, ``command`` run there by the shell, and the ``sample.*`` files found
    afterwards returned as the new members (a file added is a new member, a file removed is
    dropped; no file left drops the sample). The command's output is discarded; a command that
    fails raises ``ValueError`` naming the shard, the sample and the end of its error output."""
    with tempfile.TemporaryDirectory(prefix="packdata-map-") as folder:
        folder = Path(folder)
        for extension, data in members_of(sample).items():
            (folder / f"{SAMPLE_STEM}.{extension}").write_bytes(data)
        done = subprocess.run(command, shell=True, cwd=folder, capture_output=True)
        if done.returncode != 0:
            error = done.stderr.decode(errors="replace").strip()[-500:]
            raise ValueError(
                f"{sample.get('__url__', 'a shard')}: sample {sample.get('__key__')!r}: "
                f"{command!r} exited with status {done.returncode}: {error or 'no error output'}"
            )
        files = sorted(folder.glob(f"{SAMPLE_STEM}.*"), key=lambda path: path.name)
        members = {path.name.partition(".")[2]: path.read_bytes() for path in files}
    kept = {extension: members.pop(extension) for extension in sample if extension in members}
    return {**kept, **members} or None  # the sample's own order first, then new members


def resize_shard(job, size=32):
    """One task of a map over shards, in webdataset alone: the samples of the shard
    ``source``, resized, into the shard ``target``, where ``job = (source, target)``.
    Returns ``(target, samples written)``."""
    source, target = job
    temporary = f"{target}.partial"  # renamed when whole: never half a shard at target
    samples = 0
    try:
        with wds.TarWriter(temporary, mtime=0) as sink:  # mtime: the same bytes every run
            for sample in wds.WebDataset(str(source), shardshuffle=False):
                sink.write({"__key__": sample["__key__"], **resize_sample(sample, size)})
                samples += 1
    except BaseException:
        Path(temporary).unlink(missing_ok=True)  # a failed task leaves nothing behind
        raise
    os.replace(temporary, target)  # a rename is atomic within one file system
    return target, samples


@secrets_withheld
def map_shard(function, shard, target):
    """Write ``function(sample)`` (``{extension: bytes}``, or None to drop it) for every sample of
    ``shard`` into the shard ``target``, atomically; returns ``(target, samples written)``. An
    error in ``function``, or members it returns that cannot be written, raise ``ValueError``
    naming the shard and the sample (an error that names them already passes as it is)."""
    mapped = (_mapped(function, sample) for sample in iter_shard_samples([shard]))
    info = write_tar(target, (pair for pair in mapped if pair[1] is not None))
    return info.path, info.samples


def _mapped(function, sample):
    """``(key, function(sample))``, its members checked, or the error naming shard and sample."""
    key, named = sample["__key__"], f"{sample['__url__']}: sample {sample['__key__']!r}"
    try:
        members = function(sample)
        if members is not None:
            check_sample(key, members)
            for extension, data in members.items():
                member_bytes(f"{key}.{extension}", data)
    except Exception as error:
        if str(error).startswith(named):
            raise
        what = getattr(function, "__name__", None) or repr(function)
        raise ValueError(f"{named}: {what}: {type(error).__name__}: {error}") from error
    return key, members


@secrets_withheld
def map_shards(function, shards, out_dir, processes=2, progress=True, executor=None):
    """Run ``map_shard`` on every shard, one task per shard, each output named like its input in
    ``out_dir`` (two inputs with the same file name, in different folders, are refused, and so is
    ``out_dir`` being the inputs' folder). Members named ``__*__`` (a manifest) are no sample, and
    are left out, as ``split_tar`` leaves them.

    The tasks run on ``executor`` (any ``concurrent.futures.Executor``: ``engines.local`` or
    ``engines.dask``), else in a pool of ``processes`` processes (in this process when
    ``processes`` ≤ 1). ``progress`` prints a line counting the shards as they finish.

    Outputs already in ``out_dir`` are kept, as ``stage`` keeps its copies: each is written
    atomically, so one that exists is complete, and running the map again after a crash or an
    interrupt maps only the shards still missing (after changing ``function``, empty ``out_dir``
    first). A task that dies part-way (its worker killed) leaves only a hidden temporary file,
    removed once the map is done. ``function`` must be picklable (a module-level function, or a
    ``functools.partial`` of one). Returns the ``(path, samples)`` of each output shard, in input
    order.
    """
    shards = expand_shards(shards)
    pairs = list(zip(shards, local_targets(shards, out_dir)))
    for shard, target in pairs:
        if not is_url(shard) and Path(shard).resolve() == target.resolve():
            raise ValueError(
                f"{shard} would be its own output: map into another folder than the shards' "
                f"({out_dir})"
            )
    missing = [(shard, target) for shard, target in pairs if not target.exists()]
    task = partial(_map_pair, function)
    try:
        if executor is not None:
            written = _run_tasks(executor, task, missing, progress)
        elif processes <= 1:
            written = _counted(map(task, missing), len(missing), progress)
        else:
            with engines.local(processes) as pool:
                written = _run_tasks(pool, task, missing, progress)
    finally:  # also when a task failed, or its process died
        _remove_leftovers(target for _, target in pairs)
    return [
        (target, written[target] if target in written else count_shard_samples(target))
        for _, target in pairs
    ]


def _map_pair(function, pair):
    return map_shard(function, *pair)


def _run_tasks(executor, task, items, progress):
    """``{target: samples}`` of ``task(item)`` for each item, submitted to ``executor`` and
    collected as they finish; on the first failure the tasks not started yet are cancelled."""
    futures = {executor.submit(task, item): item for item in items}
    try:
        return _counted(
            (_result(future, futures[future]) for future in as_completed(futures)),
            len(futures),
            progress,
        )
    finally:
        for future in futures:
            future.cancel()  # a no-op for those done or running


def _result(future, item):
    """``future.result()``; an error that does not name the task's shard (its process died, say:
    a pool's ``BrokenProcessPool``, Dask's ``KilledWorker``) is raised naming it. A file system's
    error (the output cannot be written) or a refused value comes back as it was raised."""
    try:
        return future.result()
    except (OSError, ValueError):
        raise
    except Exception as error:
        shard = withheld(item[0])
        if shard in withheld(str(error)):  # a task's error comes back withheld
            raise
        raise RuntimeError(
            f"{shard}: its task did not finish: {type(error).__name__}: {error}"
        ) from error


def _counted(results, total, progress):
    """``{target: samples}`` of the ``(target, samples)`` results, printing ``done/total`` as each
    comes (when ``progress``): on one line rewritten in a terminal; elsewhere (a notebook, a log
    file, saved output where a carriage return glues the lines together) a line each tenth."""
    written = {}
    rewrite = sys.stdout.isatty()
    step = 1 if rewrite else -(-total // 10)
    for target, samples in results:
        written[target] = samples
        done = len(written)
        if progress and (done % step == 0 or done == total):
            line = f"mapped {done}/{total} shards ({target.name}: {samples})"
            if rewrite:
                print(f"\r{line}", end="\n" if done == total else "", flush=True)
            else:
                print(line, flush=True)
    return written


def _remove_leftovers(targets):
    """Remove the hidden temporary files that killed tasks left beside ``targets``."""
    for target in targets:
        prefix = temporary_prefix(target.name)
        for leftover in target.parent.glob(f"{glob.escape(prefix)}*"):
            leftover.unlink(missing_ok=True)
