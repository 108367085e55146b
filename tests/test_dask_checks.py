"""Lesson 8's engine checks: a per-shard task that is safe to retry and kill passes, results
collected as they complete pass, and each way to get either wrong is named."""

import os
import re
import shutil
import tempfile
import uuid
from concurrent.futures import as_completed, wait
from pathlib import Path
from shutil import copyfile

import pytest
import webdataset as wds

from packdata import shardwrite
from packdata.course.dask_checks import check_collect, check_shard_task
from packdata.course.feedback import CheckFailed
from packdata.mapshards import resize_sample


@pytest.fixture(scope="module")
def shards(tiny_dataset, tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    written = shardwrite.write_shards(tiny_dataset, folder, maxcount=20, progress=False)
    return [info.path for info in written]


def resized(source):
    for sample in wds.WebDataset(str(source), shardshuffle=False):
        yield {"__key__": sample["__key__"], **resize_sample(sample)}


def write(samples, path, close=True):
    """Write ``samples`` to a tar at ``path``; the samples written. ``close=False`` leaves the
    writer open, as a task that forgets to close it does."""
    sink, count = wds.TarWriter(str(path)), 0
    try:
        for sample in samples:
            sink.write(sample)
            count += 1
    finally:
        if close:
            sink.close()
    return count


def through(temporary, target, samples, move=os.replace, close=True):
    """Write ``samples`` to ``temporary``, then ``move`` it onto ``target``; remove it when that
    fails. The samples written."""
    try:
        count = write(samples, temporary, close)
        move(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return count


def atomic(source, target, samples=resized, folder=None):
    """The lesson's answer: a hidden temporary file in ``folder`` (``target``'s own by default),
    renamed onto ``target`` when whole, removed when the task fails."""
    target = Path(target)
    if target.exists():
        return 0
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=folder or target.parent)
    os.close(handle)
    return through(temporary, target, samples(source))


def straight_to_target(source, target):
    """Writes ``target`` itself and removes it on an error: a kill leaves half a shard."""
    if Path(target).exists():
        return 0
    try:
        return write(resized(source), target)
    except BaseException:
        Path(target).unlink()
        raise


def not_resized(source, target):
    members = (
        {name: data for name, data in sample.items() if name != "__url__"}
        for sample in wds.WebDataset(str(source), shardshuffle=False)
    )
    return atomic(source, target, samples=lambda _: members)


def kept_on_failure_elsewhere(source, target):
    """A temporary file in tempfile's own folder, moved onto ``target``, left there when the task
    fails."""
    if Path(target).exists():
        return 0
    handle, temporary = tempfile.mkstemp(suffix=".tar")
    os.close(handle)
    count = write(resized(source), temporary)
    shutil.move(temporary, target)
    return count


def kept_on_failure(source, target):
    """A hidden temporary file beside ``target``, left there when the task fails."""
    target = Path(target)
    if target.exists():
        return 0
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(handle)
    count = write(resized(source), temporary)
    os.replace(temporary, target)
    return count


def keys_renamed(source, target):
    renamed = ({**s, "__key__": f"{s['__key__']}-resized"} for s in resized(source))
    return atomic(source, target, samples=lambda _: renamed)


def without_labels(source, target):
    images = ({"__key__": s["__key__"], "jpg": s["jpg"]} for s in resized(source))
    return atomic(source, target, samples=lambda _: images)


def stuck_on_a_stale_temporary(source, target):
    """One fixed temporary name, opened exclusively: what a killed task left there blocks it."""
    if Path(target).exists():
        return 0
    temporary = Path(target).with_name(f".{Path(target).name}.partial")
    temporary.touch(exist_ok=False)
    return through(temporary, target, resized(source))


def temporary_named_as_a_shard(source, target):
    """A temporary file beside the shards whose name ends in .tar, as theirs do."""
    target = Path(target)
    if target.exists():
        return 0
    return through(target.with_name(f"tmp-{target.name}"), target, resized(source))


def beside_as_partial(source, target, **how):
    """Unless ``target`` exists, the resized samples written ``through`` a hidden ``.partial``
    file beside it; ``how``: ``through``'s ``move`` or ``close``."""
    target = Path(target)
    if target.exists():
        return 0
    temporary = target.with_name(f".{target.name}.partial")
    return through(temporary, target, resized(source), **how)


def never_closed(source, target):
    """The writer is never closed: its end-of-archive blocks are never written."""
    return beside_as_partial(source, target, close=False)


def copied_onto_target(source, target):
    """A whole temporary file, copied onto ``target``: the copy itself can be cut by a kill."""
    return beside_as_partial(source, target, move=copy_then_remove)


def copy_then_remove(temporary, target):
    copyfile(temporary, target)  # by a name imported from shutil
    os.unlink(temporary)


def renamed_before_closing(source, target):
    """Renamed while the writer still holds the last bytes."""
    target = Path(target)
    if target.exists():
        return 0
    temporary = target.with_name(f".{target.name}.partial")
    with wds.TarWriter(str(temporary)) as sink:
        count = 0
        for sample in resized(source):
            sink.write(sample)
            count += 1
        os.replace(temporary, target)
    return count


def none_when_skipped(source, target):
    return atomic(source, target) or None


def collect_the_done_set(executor, task, jobs):
    futures = {executor.submit(task, job): job for job in jobs}
    done, _ = wait(futures)
    # the order of a set: here fixed for the test, the slow job 0 last and the others backwards
    in_no_order = sorted(done, key=lambda future: (futures[future] == 0, -futures[future]))
    return [(futures[future], future.result()) for future in in_no_order]


def collect_sorted(executor, task, jobs):
    return sorted(collect_as_completed(executor, task, jobs))


def failure_wrapped(source, target):
    try:
        return atomic(source, target)
    except ValueError as error:
        raise RuntimeError("the shard failed") from error


def test_an_atomic_task_passes(shards, capsys):
    check_shard_task(atomic, shards)
    assert capsys.readouterr().out.count("✓") == 1


def in_the_system_tmp(source, target):
    """A temporary file under /tmp, named in full, moved onto ``target`` when whole."""
    target = Path(target)
    if target.exists():
        return 0
    temporary = Path("/tmp") / f"{uuid.uuid4().hex}-{target.name}"
    return through(temporary, target, resized(source), move=shutil.move)


def test_a_temporary_file_in_tempfiles_folder_is_named(shards):
    # there, on a cluster, it is on another file system than the shards: no atomic rename
    with pytest.raises(CheckFailed, match="not beside `target`: on a cluster"):
        check_shard_task(
            lambda source, target: atomic(source, target, folder=tempfile.gettempdir()), shards
        )
    with pytest.raises(CheckFailed, match="not beside `target`: on a cluster"):
        check_shard_task(in_the_system_tmp, shards)
    # named so even when the task also leaves it behind on a failure
    with pytest.raises(CheckFailed, match="not beside `target`: on a cluster"):
        check_shard_task(kept_on_failure_elsewhere, shards)


@pytest.mark.parametrize(
    ("task", "named"),
    [
        (straight_to_target, "killed while it wrote"),
        (not_resized, "resize_sample(sample) gives a 32×32 image"),
        (keys_renamed, "'000000' is missing"),
        (without_labels, "holds ['jpg']; resize_sample(sample) gives ['cls', 'jpg']"),
        (stuck_on_a_stale_temporary, "running it again raised FileExistsError"),
        (kept_on_failure, "a failed task left out-broken/.train-000000.tar."),
        (failure_wrapped, "raised RuntimeError"),
        (temporary_named_as_a_shard, "left tmp-train-000000.tar beside the shards"),
        (none_when_skipped, "returned [None, None, None]: return 0 for a skipped shard"),
        (never_closed, "the TarWriter was never closed"),
        (copied_onto_target, "train-000000.tar was copied into place"),
        (renamed_before_closing, "renamed into place while its TarWriter was still open"),
    ],
)
def test_each_unsafe_task_is_named(shards, task, named):
    with pytest.raises(CheckFailed, match=re.escape(named)):
        check_shard_task(task, shards)


def collect_as_completed(executor, task, jobs, progress=True):
    futures = {executor.submit(task, job): job for job in jobs}
    results = []
    for future in as_completed(futures):
        results.append((futures[future], future.result()))
        if progress:
            print(f"{len(results)}/{len(jobs)} done")
    return results


def collect_silently(executor, task, jobs):
    return collect_as_completed(executor, task, jobs, progress=False)


def collect_then_report(executor, task, jobs):
    results = collect_silently(executor, task, jobs)
    print(f"{len(results)} done")
    return results


def collect_in_order(executor, task, jobs):
    futures = [(job, executor.submit(task, job)) for job in jobs]
    return [(job, future.result()) for job, future in futures]


def collect_one_at_a_time(executor, task, jobs):
    return [(job, executor.submit(task, job).result()) for job in jobs]


def collect_swallowing_failures(executor, task, jobs):
    futures = {executor.submit(task, job): job for job in jobs}
    results = []
    for future in as_completed(futures):
        if not future.exception():
            results.append((futures[future], future.result()))
            print(f"{len(results)} done")
    return results


def collect_zipped_with_the_jobs(executor, task, jobs):
    """Results as they complete, paired with the jobs in submission order."""
    futures = [executor.submit(task, job) for job in jobs]
    return [(job, future.result()) for job, future in zip(jobs, as_completed(futures))]


def test_collecting_as_completed_passes(capsys):
    check_collect(collect_as_completed)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "1/6 done" and printed[-1].startswith("✓")  # the progress shows too


@pytest.mark.parametrize(
    ("collect", "named"),
    [
        (collect_in_order, "as_completed"),
        (collect_one_at_a_time, "one at a time"),
        (collect_swallowing_failures, "swallowed"),
        (collect_sorted, "or sorted afterwards"),
        (collect_the_done_set, "which had finished earlier"),
        (collect_zipped_with_the_jobs, r"job 0 came with 10, which is task\(1\)'s result"),
        (collect_silently, "collect printed no progress"),
        (collect_then_report, "showed only once every job was done"),
    ],
)
def test_each_collecting_mistake_is_named(collect, named):
    with pytest.raises(CheckFailed, match=named):
        check_collect(collect)


def done_when_any_temporary_exists(source, target):
    """Takes a killed task's leftover for a finished shard, and skips it."""
    target = Path(target)
    if target.exists() or list(target.parent.glob(f".{target.name}.*")):
        return 0
    return atomic(source, target)


def test_a_rerun_that_takes_a_leftover_for_done_is_named(shards):
    with pytest.raises(CheckFailed, match="left train-000000.tar unwritten"):
        check_shard_task(done_when_any_temporary_exists, shards)
