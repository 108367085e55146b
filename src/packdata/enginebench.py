"""The same map over shards on a local process pool and on Dask, measured side by side.

    result = enginebench.compare_engines(photo_shards, processes=2)
    print(result)                      # samples/s of each engine, start-up and cost per task
    print(result.verdict())

Both engines are started once, before the rounds (their start-up is timed on its own), and the map
runs on each in turn (``compare.in_turn``), each run into an empty folder. An engine's cost per task
is measured with empty tasks: what it adds to every shard, whatever the shard holds.
"""

import shutil
import tempfile
import time
from concurrent.futures import wait
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from . import compare, engines
from .mapshards import map_shard, map_shards, resize_sample
from .shardread import count_shard_samples

EMPTY_TASKS = 200


@dataclass
class EngineComparison:
    """The map's rates by engine (a ``compare.Comparison``), each engine's start-up in seconds, its
    seconds per empty task, its CPU seconds per shard (in the process that ran the task), and the
    seconds one shard's task takes on the pool."""

    rates: compare.Comparison
    startup: dict
    per_task: dict
    cpu_per_shard: dict
    task_seconds: float

    def verdict(self, top="dask", bottom="pool"):
        """The measured ratio in words; the share of a shard's time that the engine's cost per
        task takes; and the ratio that the CPU each spends per shard predicts where the map keeps
        every core busy (rates then go as one over the CPU a shard takes)."""
        share = self.per_task[top] / self.task_seconds
        cpu = self.cpu_per_shard[top] / self.cpu_per_shard[bottom]
        return (
            f"{self.rates.verdict(top, bottom)}\n"
            f"one shard's task takes {self.task_seconds * 1e3:,.0f} ms; {top} adds "
            f"{self.per_task[top] * 1e3:.1f} ms a task ({share:.1%} of it), {bottom} "
            f"{self.per_task[bottom] * 1e3:.2f} ms\n"
            f"{top} spends {cpu:.2f}× {bottom}'s CPU per shard: with the cores full, that alone "
            f"predicts {1 / cpu:.2f}×"
        )

    def __str__(self):
        costs = "\n".join(
            f"{name:<4}  start-up {self.startup[name]:.1f} s, "
            f"{self.per_task[name] * 1e3:.2f} ms per empty task, "
            f"{self.cpu_per_shard[name] * 1e3:,.0f} ms of CPU per shard"
            for name in self.startup
        )
        return f"{self.rates}\n{costs}"


def per_task_seconds(executor, tasks=EMPTY_TASKS):
    """Seconds per task of ``tasks`` empty tasks submitted at once to ``executor``: what the
    engine adds to each task (submitting, scheduling, sending the result back)."""
    started = time.perf_counter()
    wait([executor.submit(int) for _ in range(tasks)])
    return (time.perf_counter() - started) / tasks


def _shard_cpu_seconds(function, shard, out):
    """Map one shard into ``out``; the CPU seconds the process that ran it spent."""
    started = time.process_time()
    map_shard(function, shard, Path(out) / Path(shard).name)
    return time.process_time() - started


def cpu_per_shard(executor, function, shards):
    """Mean CPU seconds of one shard's task on ``executor``, in the process that ran it (all of
    its threads: the task's and the engine's own)."""
    with tempfile.TemporaryDirectory(prefix="packdata-enginebench-") as out:
        tasks = [executor.submit(_shard_cpu_seconds, function, shard, out) for shard in shards]
        return sum(task.result() for task in tasks) / len(shards)


def timed_map(executor, function, shards):
    """A ``run`` for ``compare.in_turn``: the map on ``executor`` into an empty folder (removed
    afterwards); returns the samples written."""
    out = Path(tempfile.mkdtemp(prefix="packdata-enginebench-"))
    try:
        written = map_shards(function, shards, out, executor=executor, progress=False)
        return sum(samples for _, samples in written)
    finally:
        shutil.rmtree(out)


def compare_engines(shards, processes=2, rounds=3, size=64):
    """``resize_sample`` (to ``size`` pixels on the short side) over every shard on a pool of
    ``processes`` processes and on a Dask ``LocalCluster`` of as many one-thread workers, in turn
    for ``rounds`` rounds; returns an ``EngineComparison``."""
    function = partial(resize_sample, size=size)
    startup, executors = {}, {}
    with ExitStack() as stack:
        for name, start in (
            ("pool", partial(engines.local, processes)),
            ("dask", partial(engines.dask, workers=processes)),
        ):
            started = time.perf_counter()
            executors[name] = stack.enter_context(start())
            executors[name].submit(int).result()  # its processes are up
            startup[name] = time.perf_counter() - started
        runs = {name: partial(timed_map, ex, function, shards) for name, ex in executors.items()}
        rates = compare.in_turn(runs, rounds=rounds)
        per_task = {name: per_task_seconds(ex) for name, ex in executors.items()}
        cpu = {name: cpu_per_shard(ex, function, shards) for name, ex in executors.items()}
    samples = sum(count_shard_samples(shard) for shard in shards)
    # the pool's run time, spread over its processes: the time of one shard's task
    task_seconds = samples / rates.median("pool") * processes / len(shards)
    return EngineComparison(rates, startup, per_task, cpu, task_seconds)
