"""A training job that a lesson (or a test) really kills, and restarts from its checkpoint.

The job streams shards with ``ShardDataset`` through a ``StatefulDataLoader``, logs the keys of
every batch it takes, and every ``every`` steps writes a checkpoint atomically: the epoch, the step
and the loader's state. Started again on the same folder it resumes from that checkpoint; started
with another number of workers, it resumes the rest of the epoch (``resume.rest_of_epoch``)::

    job = preemption.start(shards, folder, num_workers=2)
    preemption.kill_after(job, folder, steps=7)        # SIGKILL, the job's workers with it
    job = preemption.start(shards, folder, num_workers=2)
    job.wait()
    print(preemption.audit(folder, killed_pid, job.pid, expected_keys)[0])

Exactly once is counted against the checkpoint: the batches a job took after its last checkpoint
and before the kill come again after the restart, as a training job restarted from that checkpoint
needs (the model's weights of those steps were lost too).
"""

import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import torch

from .atomic import written_atomically
from .checkpoint import every_rank, resume_loader
from .streaming import ShardDataset

KEYS = ("__key__", "cls")
CHECKPOINT = "checkpoint.pt"
STDERR = "stderr.txt"  # every start's, appended


def job_dataset(shards, buffer_size=16, seed=0):
    """The job's stream of ``(key, label)``: the same arguments on every start, as resuming
    needs."""
    return ShardDataset(shards, buffer_size=buffer_size, seed=seed, keys=KEYS, decode=False)


def keys_of(batch):
    """The sample keys of a batch of ``(keys, labels)``."""
    return [str(key) for key in batch[0]]


def _resumed_loader(data, loader, checkpoint):
    """Resume ``loader`` over ``data`` from ``checkpoint`` (``checkpoint.resume_loader``), when
    there is one; return the epoch and step to go on from."""
    if not checkpoint.exists():
        return 0, 0
    saved = torch.load(checkpoint, weights_only=False)
    resume_loader(saved["loaders"], data, loader)
    return saved["epoch"], saved["step"]


def train(shards, folder, num_workers, every=3, epochs=1, pause=0.005, batch_size=8, **stream):
    """Read ``epochs`` epochs of ``shards`` (``job_dataset(shards, **stream)``) in batches of
    ``batch_size`` (a ``pause`` stands for each step's compute), log every batch's keys to
    ``folder``, checkpoint every ``every`` steps."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    warnings.filterwarnings("ignore", message=".*set_vital.*")  # torchdata 0.11 on torch 2.14
    folder = Path(folder)
    data = job_dataset(shards, **stream)
    loader = StatefulDataLoader(data, batch_size=batch_size, num_workers=num_workers)
    checkpoint = folder / CHECKPOINT
    start, step = _resumed_loader(data, loader, checkpoint)
    with open(folder / f"log-{os.getpid()}.jsonl", "a") as log:
        log.write(json.dumps({"resumed from": [start, step]}) + "\n")
        for epoch in range(start, epochs):
            data.set_epoch(epoch)
            for batch in loader:
                log.write(json.dumps({"epoch": epoch, "step": step, "keys": keys_of(batch)}) + "\n")
                log.flush()
                step += 1
                if step % every == 0:
                    state = {"epoch": epoch, "step": step, "loaders": every_rank(loader)}
                    with written_atomically(checkpoint) as file:
                        torch.save(state, file)
                time.sleep(pause)
            step = 0


def start(shards, folder, num_workers, **options):
    """Start the job in a process of its own session (its workers die with it when killed)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    arguments = json.dumps(
        {
            "shards": list(map(str, shards)),
            "folder": str(folder),
            "num_workers": num_workers,
            **options,
        }
    )
    command = [sys.executable, "-m", "packdata.preemption", arguments]
    with open(Path(folder) / STDERR, "ab") as stderr:  # what a failing job says, for the error
        return subprocess.Popen(command, start_new_session=True, stderr=stderr)


def logged(folder, pid):
    """The batches the job with ``pid`` logged in ``folder``, in order, after the line that says
    where it started: ``(epoch, step)``."""
    path = Path(folder) / f"log-{pid}.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return lines[1:], lines[0]["resumed from"] if lines else None


def kill_after(job, folder, steps, timeout=120):
    """SIGKILL ``job`` and its workers once it has logged ``steps`` batches."""
    deadline = time.monotonic() + timeout
    while len(logged(folder, job.pid)[0]) < steps:
        if job.poll() is not None or time.monotonic() > deadline:
            said = (Path(folder) / STDERR).read_text(errors="replace").strip().splitlines()
            raise RuntimeError(
                f"the job ended or stalled before step {steps} (exit {job.poll()}); the last line "
                f"of its {Path(folder) / STDERR}: {said[-1] if said else '(none)'}"
            )
        time.sleep(0.005)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()


class Tally(NamedTuple):
    """Keys delivered in one epoch, counted against the keys the epoch holds."""

    delivered: int
    expected: int
    duplicates: int  # deliveries beyond the first of a key
    missing: int  # keys never delivered

    def __str__(self):
        verdict = "exactly once" if not (self.duplicates or self.missing) else "NOT exactly once"
        return (
            f"{self.delivered} delivered for {self.expected} samples: {self.duplicates} twice, "
            f"{self.missing} missing ({verdict})"
        )


def tally(keys, expected):
    """A ``Tally`` of ``keys`` (as delivered, in order) against the ``expected`` keys."""
    counts = Counter(keys)
    duplicates = sum(count - 1 for count in counts.values())
    return Tally(len(keys), len(expected), duplicates, len(set(expected) - set(counts)))


def cut_and_resume(make_loader, batches):
    """Keys of ``batches`` batches from ``make_loader()`` (a ``StatefulDataLoader`` of ``(keys,
    labels)``), then its ``state_dict()`` loaded into a fresh ``make_loader()``, as a restarted
    job would, and the keys that one delivers: ``(before, after)``."""
    loader = make_loader()
    batch_iterator = iter(loader)
    before = [key for _ in range(batches) for key in keys_of(next(batch_iterator))]
    state = loader.state_dict()
    del batch_iterator, loader  # its workers stop with the loader, like a killed job's
    resumed = make_loader()
    resumed.load_state_dict(state)
    return before, [key for batch in resumed for key in keys_of(batch)]


def audit(folder, killed, resumed, expected, epoch=0):
    """Epoch ``epoch`` of the ``killed`` job and the ``resumed`` one, counted against the
    checkpoint the restart loaded: the killed job's batches before it, then the resumed job's.
    Returns the ``Tally`` and how many samples the killed job took after the checkpoint (they
    come again)."""
    then, (start, step) = logged(folder, resumed)
    # the step the restart's checkpoint had reached in this epoch: all of it, in an epoch before
    step = step if start == epoch else math.inf if start > epoch else 0
    first = [line for line in logged(folder, killed)[0] if line["epoch"] == epoch]
    kept = [key for line in first if line["step"] < step for key in line["keys"]]
    again = sum(len(line["keys"]) for line in first if line["step"] >= step)
    after = [key for line in then if line["epoch"] == epoch for key in line["keys"]]
    return tally(kept + after, expected), again


if __name__ == "__main__":
    options = json.loads(sys.argv[1])
    train(options.pop("shards"), options.pop("folder"), options.pop("num_workers"), **options)
