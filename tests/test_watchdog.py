"""A forkserver worker is no child of its rank: killed outright, the rank would leave it running.
With ``exit_with`` it goes too."""

import multiprocessing
import os
import signal
import time

from torch.utils.data import DataLoader, IterableDataset

from packdata.watchdog import exit_with


class Endless(IterableDataset):
    """Numbers, one every 10 ms, for ever: a worker that never ends on its own."""

    def __iter__(self):
        number = 0
        while True:
            time.sleep(0.01)
            yield number
            number += 1


def rank(report):
    """A rank whose worker is started by forkserver; it says the worker's pid, then waits."""
    loader = DataLoader(
        Endless(),
        batch_size=None,
        num_workers=1,
        multiprocessing_context="forkserver",
        worker_init_fn=exit_with(os.getpid()),
    )
    batches = iter(loader)
    next(batches)
    report.put(batches._workers[0].pid)
    time.sleep(60)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended
        return stat.read().split(") ")[1][0] != "Z"


def test_a_forkserver_worker_exits_once_its_rank_is_killed_outright():
    context = multiprocessing.get_context("spawn")
    report = context.Queue()
    job = context.Process(target=rank, args=(report,))
    job.start()
    worker = report.get(timeout=120)
    assert alive(worker)
    os.kill(job.pid, signal.SIGKILL)
    job.join()
    deadline = time.monotonic() + 10
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(worker)
