"""Checks for the exercises on engines: a per-shard task that is safe to retry, and collecting an
executor's results as they complete.

Each check runs the learner's code for real (on shards it writes, on a real executor) and names the
mistake it sees.
"""

import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..shardread import iter_shard_samples
from ..shardwrite import write_tar
from .checks import CheckFailed, passed

SLOW_JOB = 0  # the job the collect check makes slow: submitted first, done last


def _keys(paths):
    return sorted(sample["__key__"] for sample in iter_shard_samples([str(p) for p in paths]))


def _leftovers(folder, expected):
    return sorted(path.name for path in Path(folder).iterdir() if path not in expected)


def _check_outputs(task, jobs):
    """Run every job once; the outputs hold every input sample exactly once."""
    counts = [task(source, target) for source, target in jobs]
    targets = [target for _, target in jobs]
    missing = [target.name for target in targets if not target.exists()]
    if missing:
        raise CheckFailed(f"no {missing[0]} after its task: write the output at `target`")
    keys_in, keys_out = _keys(source for source, _ in jobs), _keys(targets)
    if keys_out != keys_in:
        raise CheckFailed(
            f"the outputs hold {len(keys_out)} samples ({len(set(keys_out))} distinct), the "
            f"inputs {len(keys_in)}: every sample must come out exactly once"
        )
    if sum(counts) != len(keys_in):
        raise CheckFailed(f"the task returned {counts}: return the samples it wrote")
    left = _leftovers(targets[0].parent, targets)
    if left:
        raise CheckFailed(f"{left[0]} is left beside the outputs: rename the temporary file")


def _check_skips(task, jobs):
    """A second run writes nothing and returns 0."""
    times = [target.stat().st_mtime_ns for _, target in jobs]
    counts = [task(source, target) for source, target in jobs]
    if [target.stat().st_mtime_ns for _, target in jobs] != times:
        raise CheckFailed(
            "a second run rewrote the outputs: when `target` exists it is complete (it was "
            "renamed whole), so return 0 without writing"
        )
    if any(counts):
        raise CheckFailed(f"a second run returned {counts}: return 0 for a skipped shard")


def _check_failure(task, folder):
    """A task whose shard fails part-way leaves nothing under the target name, nor beside it."""
    broken = folder / "broken" / "train-000000.tar"
    broken.parent.mkdir()
    # the second sample holds decoded pixels, which resize_sample refuses
    write_tar(broken, [("a", {"jpg": _tiny_jpeg(), "cls": b"1"}), ("b", {"npy": b"\x93NUMPY"})])
    target = folder / "out-broken" / "train-000000.tar"
    target.parent.mkdir()
    try:
        task(broken, target)
    except ValueError:
        pass
    else:
        raise CheckFailed("a shard that resize_sample refuses gave no error: let it raise")
    if target.exists():
        raise CheckFailed(
            f"after a failure part-way, {target.name} exists with half a shard: write to a "
            "temporary name in the same folder, and os.replace it onto `target` only when whole"
        )
    left = _leftovers(target.parent, [])
    if left:
        raise CheckFailed(
            f"a failed task left {left[0]} behind: remove the temporary file when the task "
            "fails (except BaseException: unlink it, then raise)"
        )


def _tiny_jpeg():
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "JPEG")
    return buffer.getvalue()


def check_shard_task(task, shards):
    """``task(source, target)``: every sample once at ``target``, nothing written when ``target``
    exists (returns 0), and nothing at ``target`` (or beside it) when the shard fails part-way."""
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "out").mkdir()
        jobs = [(Path(shard), folder / "out" / Path(shard).name) for shard in shards]
        _check_outputs(task, jobs)
        _check_skips(task, jobs)
        _check_failure(task, folder)
    passed(
        f"{len(shards)} shards written whole, every sample once; a re-run writes nothing; a "
        "failed task leaves nothing behind: safe to retry on any engine"
    )


def _job_task(state):
    """A task for ``check_collect``: job ``SLOW_JOB`` takes 0.3 s, the others 0.02 s; it records
    how many tasks ran at once, and job ``"fails"`` raises."""

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

    return task


def check_collect(collect):
    """``collect(executor, task, jobs)`` returns ``[(job, result)]`` in the order the results came:
    all submitted first, collected as they complete, a failure raised."""
    state = {"lock": threading.Lock(), "running": 0, "most": 0}
    jobs = list(range(6))
    with ThreadPoolExecutor(2) as executor:
        got = list(collect(executor, _job_task(state), jobs))
    if sorted(got) != [(job, job * 10) for job in jobs]:
        raise CheckFailed(f"got {got}: every job once, as (job, task(job))")
    if state["most"] < 2:
        raise CheckFailed(
            "the tasks ran one at a time: submit them all first, then wait for the results"
        )
    if got[0][0] == SLOW_JOB:
        raise CheckFailed(
            f"job {SLOW_JOB} takes 0.3 s, the others 0.02 s, yet it came first: the results "
            "are collected in submission order. Use concurrent.futures.as_completed"
        )
    with ThreadPoolExecutor(2) as executor:
        try:
            list(collect(executor, _job_task(state), [1, "fails", 2]))
        except ValueError:
            pass
        else:
            raise CheckFailed(
                "a failing task was swallowed: future.result() raises the task's error; let it"
            )
    passed("results collected as they complete, the slow job last; a failure is raised")
