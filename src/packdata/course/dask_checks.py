"""Checks for the exercises on engines: a per-shard task that is safe to retry, and collecting an
executor's results as they complete.

Each check runs the learner's code for real (on shards it writes, on a real executor) and names the
mistake it sees.
"""

import io
import itertools
import multiprocessing
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

from ..layout import members_of
from ..mapshards import resize_sample
from ..shardread import iter_shard_samples
from ..shardwrite import write_tar
from .feedback import CheckFailed, passed

SYSTEM_TMP = Path("/tmp")  # where a temporary file goes when a task names the folder itself
SLOW_JOB = 0  # the job the collect check makes slow: submitted first, done last
# the exit statuses of a task ended as its writer closes on a file already at `target`, and
# right after it copied a file onto `target`
RENAMED_OPEN, COPIED = 75, 76


def _samples(paths):
    """``{key: {extension: bytes}}`` of every sample in ``paths``; a key seen twice is named."""
    samples = {}
    for sample in iter_shard_samples([str(path) for path in paths]):
        key = sample["__key__"]
        if key in samples:
            raise CheckFailed(
                f"sample {key!r} is written twice: every sample must come out once, under its "
                "own key (sample['__key__'])"
            )
        samples[key] = members_of(sample)
    return samples


def _leftovers(folder, expected):
    """Files anywhere under ``folder`` other than ``expected``, by their path in it."""
    return sorted(
        str(path.relative_to(folder))
        for path in Path(folder).rglob("*")
        if path.is_file() and path not in expected
    )


def _check_outputs(task, jobs, folder):
    """Run every job once; the outputs hold every input sample once, resized as resize_sample
    does, and nothing else is left in the check's folder."""
    counts = [task(source, target) for source, target in jobs]
    targets = [target for _, target in jobs]
    missing = [target.name for target in targets if not target.exists()]
    if missing:
        raise CheckFailed(f"no {missing[0]} after its task: write the output at `target`")
    inputs = _samples(source for source, _ in jobs)
    outputs, ended = _read_whole(targets)
    if not ended:
        raise CheckFailed(
            "an output ends without tar's end-of-archive blocks: the TarWriter was never "
            "closed. Close it (end a `with wds.TarWriter(...) as sink:` block) before the rename"
        )
    if sorted(outputs) != sorted(inputs):
        lost, extra = sorted(set(inputs) - set(outputs)), sorted(set(outputs) - set(inputs))
        which = f"{lost[0]!r} is missing" if lost else f"{extra[0]!r} is no input's"
        raise CheckFailed(
            f"the outputs hold {len(outputs)} samples, the inputs {len(inputs)}, and {which}: "
            "every sample must come out exactly once, under its own key"
        )
    for key, members in inputs.items():
        expected = resize_sample({"__key__": key, **members})
        if outputs[key] != expected:
            raise CheckFailed(
                f"{_difference(key, outputs[key], expected)}: write the members it returns, as "
                "they are"
            )
    if sum(counts) != len(inputs):
        raise CheckFailed(f"the task returned {counts}: return the samples it wrote")
    left = _leftovers(folder, targets)
    if left:
        raise CheckFailed(f"{left[0]} is left after the tasks: rename the temporary file")


def _difference(key, got, expected):
    """How the members ``got`` for sample ``key`` differ from ``expected``, resize_sample's."""
    if sorted(got) != sorted(expected):
        return f"sample {key!r} holds {sorted(got)}; resize_sample(sample) gives {sorted(expected)}"
    name = next(name for name in sorted(got) if got[name] != expected[name])
    written, resized = _described(got[name]), _described(expected[name])
    return f"the {name} of sample {key!r} is {written}; resize_sample(sample) gives {resized}"


def _described(data):
    """'a 64×64 image of 2,051 bytes', or '3 bytes' for what is not an image."""
    from PIL import Image, UnidentifiedImageError

    try:
        width, height = Image.open(io.BytesIO(data)).size
    except UnidentifiedImageError:
        return f"{len(data):,} bytes"
    return f"a {width}×{height} image of {len(data):,} bytes"


def _check_skips(task, jobs):
    """A second run writes nothing and returns 0."""
    times = [target.stat().st_mtime_ns for _, target in jobs]
    counts = [task(source, target) for source, target in jobs]
    if [target.stat().st_mtime_ns for _, target in jobs] != times:
        raise CheckFailed(
            "a second run rewrote the outputs: when `target` exists it is complete (it was "
            "renamed whole), so return 0 without writing"
        )
    if any(count != 0 or isinstance(count, bool) for count in counts):
        raise CheckFailed(
            f"a second run returned {counts}: return 0 for a skipped shard (a number, so that "
            "the caller can add up the samples written)"
        )


def _check_failure(task, folder):
    """A task whose shard fails part-way leaves nothing under the target name, nor anywhere else."""
    broken = folder / "broken" / "train-000000.tar"
    broken.parent.mkdir()
    # the second sample holds decoded pixels, which resize_sample refuses
    write_tar(broken, [("a", {"jpg": _tiny_jpeg(), "cls": b"1"}), ("b", {"npy": b"\x93NUMPY"})])
    target = folder / "out-broken" / "train-000000.tar"
    target.parent.mkdir()
    before = set(Path(folder).rglob("*"))
    try:
        task(broken, target)
    except ValueError:
        pass
    except Exception as error:
        raise CheckFailed(
            f"resize_sample raises ValueError on sample 'b' of a broken shard, but the task "
            f"raised {type(error).__name__}: {error}. Let the error out as it came (raise)"
        ) from None
    else:
        raise CheckFailed("a shard that resize_sample refuses gave no error: let it raise")
    if target.exists():
        raise CheckFailed(
            f"after a failure part-way, {target.name} exists with half a shard: write to a "
            "temporary name in the same folder, and os.replace it onto `target` only when whole"
        )
    left = _leftovers(folder, before)
    if left:
        raise CheckFailed(
            f"a failed task left {left[0]} behind: remove the temporary file when the task "
            "fails (except BaseException: unlink it, then raise)"
        )


def _long_shard(shards, path, least=200):
    """A shard at ``path`` of at least ``least`` samples, copies of those of ``shards[0]`` under
    new keys: long enough that a task is caught writing even where ``resize_sample`` cannot stall
    it (a task that resizes every sample before it writes any)."""
    samples = list(_samples([shards[0]]).items())
    copies = range(-(-least // len(samples)))
    write_tar(path, [(f"{key}-{n}", members) for n in copies for key, members in samples])
    return path


def _stall_resizes_once_writing(writing):
    """In this (forked) process, ``resize_sample``, under every name a module holds it by, blocks
    for good from its second call on once ``writing()`` is true: a task that streams its samples
    into a file is then always caught writing, however fast the machine."""
    calls, resize = itertools.count(), resize_sample

    def resize_or_stall(*args, **kwargs):
        if next(calls) and writing():
            threading.Event().wait()
        return resize(*args, **kwargs)

    _replace_everywhere(resize, resize_or_stall)


def _replace_everywhere(function, substitute):
    """In this (forked) process, ``substitute`` for ``function`` under every name that a module
    holds it by (``os.replace``, and a notebook's ``from os import replace`` too)."""
    for module in list(sys.modules.values()):
        for name, value in list(getattr(module, "__dict__", {}).items()):
            if value is function:  # not a global: this module's own name is replaced on the way
                setattr(module, name, substitute)


def _written_in(watched, before):
    """The folders of ``watched`` (folder: a part of the name to look for, "" for any) that hold
    a file that was not in ``before``."""
    return [
        folder
        for folder, named in watched.items()
        if any(named in path.name for path in set(folder.iterdir()) - before[folder])
    ]


def _stalled_task(task, source, target, watched, before):
    """``task(source, target)`` in the forked process, stalled once it writes a watched file."""
    _stall_resizes_once_writing(lambda: _written_in(watched, before))
    task(source, target)


def _killed_while_writing(task, source, target):
    """Run ``task(source, target)`` in a forked process and kill it (SIGKILL, as an engine does
    with a lost worker) once it creates a file in ``target``'s folder, in tempfile's, or one named
    after ``target`` in /tmp (where other processes' files come and go too): it stalls at its next
    sample there, so the kill finds it mid-write. Return that folder (None when the task ended
    first); what the killed task left in /tmp is removed."""
    watched = {target.parent: "", Path(tempfile.gettempdir()): ""}
    if SYSTEM_TMP.is_dir():
        watched.setdefault(SYSTEM_TMP, target.name)
    before = {folder: set(folder.iterdir()) for folder in watched}
    child = multiprocessing.get_context("fork").Process(
        target=_stalled_task, args=(task, source, target, watched, before)
    )
    child.start()
    wrote_in = []
    while child.is_alive() and not wrote_in:
        wrote_in = _written_in(watched, before)
        time.sleep(0.001)
    child.kill()
    child.join()
    if SYSTEM_TMP in watched:
        for path in set(SYSTEM_TMP.iterdir()) - before[SYSTEM_TMP]:
            if target.name in path.name and path.is_file():
                path.unlink(missing_ok=True)
    return wrote_in[0] if wrote_in else None


def _read_whole(paths):
    """``_samples(paths)``, and whether every tar there ends with its end-of-archive blocks (a
    writer never closed leaves them out, and the reader only warns)."""
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        samples = _samples(paths)
    return samples, not any("end-of-archive" in str(warning.message) for warning in warned)


def _holds(shard, keys):
    """Whether ``shard`` holds the samples ``keys``, sorted, and tar's end-of-archive blocks;
    one cut short quietly does not."""
    if not Path(shard).exists():
        return False
    try:
        samples, ended = _read_whole([shard])
    except (ValueError, CheckFailed):
        return False
    return ended and sorted(samples) == keys


def _check_kill(task, shards, folder):
    """A task killed part-way leaves no half shard at ``target``; run again, it writes it whole."""
    source = _long_shard(shards, folder / "long" / "train-000000.tar")
    target = folder / "out-killed" / "train-000000.tar"
    target.parent.mkdir()
    if _killed_while_writing(task, source, target) in (Path(tempfile.gettempdir()), SYSTEM_TMP):
        raise CheckFailed(
            "the task made its temporary file in tempfile's own folder, not beside `target`: on "
            "a cluster that is another file system (a node's /tmp, the shards on shared "
            "storage), where os.replace fails and shutil.move copies, which a kill can cut "
            "half-way. Make it in target's folder: tempfile.mkstemp(dir=target.parent)"
        )
    strays = sorted(path.name for path in target.parent.glob("*.tar") if path != target)
    if strays:
        raise CheckFailed(
            f"a task killed while it wrote left {strays[0]} beside the shards, where a *.tar "
            "pattern takes it for one (half of one). Give the temporary file a name no reader "
            "takes for a shard: a leading dot, or .partial at the end"
        )
    expected = sorted(_samples([source]))
    if target.exists() and not _holds(target, expected):
        raise CheckFailed(
            f"a task killed while it wrote left {target.name} with half a shard: a killed "
            "process runs no except or finally, so a re-run would skip that shard. Write a "
            "temporary file and os.replace it onto `target` only when it is whole"
        )
    try:
        task(source, target)
    except Exception as error:
        raise CheckFailed(
            f"after a killed task, running it again raised {type(error).__name__}: {error}. The "
            "killed task left its temporary file: take a fresh name (tempfile.mkstemp) or "
            "overwrite it"
        ) from None
    if not _holds(target, expected):
        raise CheckFailed(
            f"after a killed task, running it again left {target.name} "
            f"{'without every sample' if target.exists() else 'unwritten'}: a temporary file left "
            "by the killed one must not get in its way (nor count as done: only `target` does)"
        )


def _exit_when_target_comes_early(target):
    """In this (forked) process, a tar writer that closes when its file is already ``target``
    (renamed before it was whole), and a copy onto ``target``, end it at once, as a kill there
    would, with a status that says which: ``os._exit`` flushes and closes nothing."""
    close, copyfile = tarfile.TarFile.close, shutil.copyfile

    def close_unless_renamed(self):
        if self.mode != "r" and not self.closed and _is_at(self.fileobj, target):
            os._exit(RENAMED_OPEN)
        close(self)

    def copy_then_exit(source, destination, *args, **kwargs):
        copied = copyfile(source, destination, *args, **kwargs)
        if os.path.abspath(destination) == str(target):
            os._exit(COPIED)
        return copied

    tarfile.TarFile.close = close_unless_renamed
    _replace_everywhere(copyfile, copy_then_exit)


def _is_at(stream, path):
    """Whether the file under ``stream`` (a file, or a tar stream around one) is at ``path``."""
    for _ in range(3):
        try:
            held, there = os.fstat(stream.fileno()), os.stat(path)
        except (AttributeError, ValueError, OSError):
            stream = getattr(stream, "fileobj", None)
            continue
        return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)
    return False


def _run_watching_target(task, source, target):
    _exit_when_target_comes_early(target)
    task(source, target)


def _check_renamed_whole(task, folder):
    """The task puts ``target`` in place by a rename, once its writer is closed: not before (a
    kill after the rename would leave half a shard there), and not by a copy (a kill mid-copy
    would)."""
    source = folder / "long" / "train-000000.tar"  # _check_kill's
    target = folder / "out-renamed" / "train-000000.tar"
    target.parent.mkdir()
    child = multiprocessing.get_context("fork").Process(
        target=_run_watching_target, args=(task, source, target)
    )
    child.start()
    child.join()
    if child.exitcode == COPIED:
        raise CheckFailed(
            f"{target.name} was copied into place: a copy (shutil.copy, copyfile, move across "
            "file systems) writes it piece by piece, and a kill mid-copy leaves half a shard. "
            "Rename the temporary file onto it: os.replace(temporary, target)"
        )
    if child.exitcode == RENAMED_OPEN:
        raise CheckFailed(
            f"{target.name} was renamed into place while its TarWriter was still open: its last "
            "bytes and end blocks come at the close, so a kill right after the rename leaves "
            "half a shard. Close the writer (end its with block) first, then os.replace"
        )


@contextmanager
def _temporary_files_in(folder):
    """``tempfile``'s default folder is ``folder`` meanwhile, so that the check sees what a task
    leaves there too."""
    folder.mkdir()
    saved, tempfile.tempdir = tempfile.tempdir, str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = saved


def _tiny_jpeg():
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "JPEG")
    return buffer.getvalue()


def check_shard_task(task, shards):
    """``task(source, target)``: every sample once at ``target``, resized as ``resize_sample``
    does; nothing written when ``target`` exists (returns 0); no half shard at ``target`` when the
    task is killed while it writes, and a whole one when it runs again; ``target`` put in place
    by a rename once the writer is closed (not before, not by a copy); nothing at ``target`` nor
    left anywhere when the shard fails part-way. The kill comes before the failure: it names a
    temporary file outside ``target``'s folder, the failure only that it was left behind."""
    with tempfile.TemporaryDirectory() as folder, _temporary_files_in(Path(folder) / "tmp"):
        folder = Path(folder)
        (folder / "out").mkdir()
        jobs = [(Path(shard), folder / "out" / Path(shard).name) for shard in shards]
        _check_outputs(task, jobs, folder)
        _check_skips(task, jobs)
        _check_kill(task, shards, folder)
        _check_renamed_whole(task, folder)
        _check_failure(task, folder)
    passed(
        f"{len(shards)} shards written whole, every sample once; a re-run writes nothing; a "
        "failed task leaves nothing behind, a killed one no half shard: safe to retry on any "
        "engine"
    )


def _job_task(state):
    """A task for ``check_collect``: job ``SLOW_JOB`` takes 0.3 s, the others 0.02 s; it records
    how many tasks ran at once and when each finished, and job ``"fails"`` raises."""

    def task(job):
        with state["lock"]:
            state["running"] += 1
            state["most"] = max(state["most"], state["running"])
        try:
            time.sleep(0.3 if job == SLOW_JOB else 0.02)
            if job == "fails":
                raise ValueError("job 'fails' failed, as the check asked")
            return job * 10
        finally:
            with state["lock"]:
                state["running"] -= 1
                state["finished"][job] = time.perf_counter()

    return task


def _out_of_turn(order, finished, apart=0.005):
    """The first pair of jobs in ``order`` that came the other way round from how they finished
    (more than ``apart`` seconds apart, so that a near tie between two threads never counts), or
    None."""
    for earlier, later in zip(order, order[1:]):
        if finished[earlier] > finished[later] + apart:
            return earlier, later
    return None


def _pairing_problem(got, jobs):
    """Why ``got`` holds every job and every result but pairs them wrongly; None when it does
    not (``task(job)`` is ``job * 10``)."""
    try:
        pairs = [(job, result) for job, result in got]
        if sorted(j for j, _ in pairs) != jobs or sorted(r for _, r in pairs) != [
            j * 10 for j in jobs
        ]:
            return None
    except (TypeError, ValueError):  # not pairs, or not comparable: the general message says it
        return None
    job, result = next((job, result) for job, result in pairs if result != job * 10)
    return (
        f"job {job} came with {result}, which is task({result // 10})'s result: each result must "
        "go with its own future's job. Keep them together as you submit, {future: job}, and look "
        "the job up as each future completes"
    )


class _Timed(io.TextIOBase):
    """A stream that passes what is written on to ``stream`` and notes when, for text that is
    more than white space."""

    def __init__(self, stream):
        self.stream, self.times = stream, []

    def write(self, text):
        if text.strip():
            self.times.append(time.perf_counter())
        return self.stream.write(text)


def _check_progress(times, slow_done):
    """Progress was printed while the results came in: before the slow job, the last, was done."""
    if not times:
        raise CheckFailed(
            "collect printed no progress: print a line as each result comes in, such as "
            'print(f"{len(results)}/{len(jobs)} done")'
        )
    if min(times) > slow_done:
        raise CheckFailed(
            "the progress showed only once every job was done: print inside the loop over "
            "as_completed, as each result comes in"
        )


def check_collect(collect):
    """``collect(executor, task, jobs)`` returns ``[(job, result)]`` in the order the results came:
    all submitted first, collected as they complete, progress printed as they come, a failure
    raised."""
    state = {"lock": threading.Lock(), "running": 0, "most": 0, "finished": {}}
    jobs = list(range(6))
    printed = _Timed(sys.stdout)
    with ThreadPoolExecutor(2) as executor, redirect_stdout(printed):
        got = list(collect(executor, _job_task(state), jobs))
    if sorted(got) != [(job, job * 10) for job in jobs]:
        raise CheckFailed(
            _pairing_problem(got, jobs) or f"got {got}: every job once, as (job, task(job))"
        )
    if state["most"] < 2:
        raise CheckFailed(
            "the tasks ran one at a time: submit them all first, then wait for the results"
        )
    if got[0][0] == SLOW_JOB:
        raise CheckFailed(
            f"job {SLOW_JOB} takes 0.3 s, the others 0.02 s, yet it came first: the results "
            "come in submission order (collected in that order, or sorted afterwards). Return "
            "them in the order concurrent.futures.as_completed yields them"
        )
    swapped = _out_of_turn([job for job, _ in got], state["finished"])
    if swapped:
        raise CheckFailed(
            f"job {swapped[0]} came before job {swapped[1]}, which had finished earlier: the "
            "results are not in the order they came (a set of done futures has no order). "
            "Collect them with concurrent.futures.as_completed, one as each completes"
        )
    _check_progress(printed.times, state["finished"][SLOW_JOB])
    with ThreadPoolExecutor(2) as executor:
        try:
            list(collect(executor, _job_task(state), [1, "fails", 2]))
        except ValueError:
            pass
        else:
            raise CheckFailed(
                "a failing task was swallowed: future.result() raises the task's error; let it"
            )
    passed(
        "results collected as they complete, the slow job last, with progress as they came; a "
        "failure is raised"
    )
