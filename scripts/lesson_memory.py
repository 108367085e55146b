"""Measure what one learner's run of each lesson costs: peak memory, CPU time and wall time.

    PACKDATA_SIZE=workshop flock /tmp/cpu.lock .venv/bin/python scripts/lesson_memory.py \
        notebooks/*.md solutions/*.md

Each jupytext notebook is executed with nbclient in its own folder, as ``make schedule`` does. While
it runs, a thread reads ``/proc`` every ``--interval`` seconds and adds up the memory of every
process below this one: the kernel, its DataLoader workers, the loopback servers a lesson starts.
It reports two sums, both peaks over the run:

- RSS, the resident memory of each process. Forked workers share the kernel's pages (PyTorch's
  libraries, the dataset's arrays) until they write to them, so this sum counts shared pages
  once per process and overstates what the machine needs.
- PSS (proportional set size, from ``/proc/PID/smaps_rollup``): every shared page divided among
  the processes that share it. The sum is what the run adds to the machine's memory; use it to
  size a hub.

CPU is the user plus system time of the kernel and every child it waited for (``getrusage``), once
the kernel has exited; divided by the wall time it gives the cores the run kept busy on average.
Linux only (``/proc``). Samples can miss a process that lives less than one interval.
"""

import argparse
import os
import resource
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from packdata.course.schedule import run_seconds


@dataclass
class Usage:
    """What running one notebook cost: peaks over its samples, and totals."""

    name: str
    wall_s: float
    cpu_s: float
    peak_rss: int
    peak_pss: int
    peak_processes: int


def children_by_parent():
    """``{parent pid: [child pids]}`` for every process visible in ``/proc``."""
    tree = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended between listing and reading
            continue
        # the command name (field 2) may hold spaces and parentheses: split after the last ")"
        parent = int(text.rsplit(")", 1)[1].split()[1])
        tree.setdefault(parent, []).append(int(stat.parent.name))
    return tree


def descendants(pid):
    """Pids of every process below ``pid``, not ``pid`` itself."""
    tree, found, todo = children_by_parent(), [], [pid]
    while todo:
        children = tree.get(todo.pop(), [])
        found += children
        todo += children
    return found


def memory_bytes(pid):
    """``(rss, pss)`` of process ``pid`` in bytes; ``(0, 0)`` when it has already ended."""
    fields = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return 0, 0
    return fields.get("Rss", 0), fields.get("Pss", 0)


class TreeSampler(threading.Thread):
    """Samples the memory of every process below this one until ``stop()``; keeps the peaks."""

    def __init__(self, interval):
        super().__init__(daemon=True)
        self.interval = interval
        self.peak_rss = self.peak_pss = self.peak_processes = 0
        self._done = threading.Event()

    def run(self):
        me = os.getpid()
        while not self._done.wait(self.interval):
            pids = descendants(me)
            usage = [memory_bytes(pid) for pid in pids]
            self.peak_rss = max(self.peak_rss, sum(rss for rss, _ in usage))
            self.peak_pss = max(self.peak_pss, sum(pss for _, pss in usage))
            self.peak_processes = max(self.peak_processes, len(pids))

    def stop(self):
        """End the sampling and wait for the last sample."""
        self._done.set()
        self.join()


def children_cpu_seconds():
    """User plus system CPU seconds of every child this process has waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(path, interval=0.1):
    """Execute the jupytext notebook at ``path`` and return its ``Usage``."""
    path = Path(path)
    sampler = TreeSampler(interval)
    cpu_before = children_cpu_seconds()
    sampler.start()
    try:
        wall = run_seconds(path)
    finally:
        sampler.stop()
    return Usage(
        name=f"{path.parent.name}/{path.stem}",
        wall_s=wall,
        cpu_s=children_cpu_seconds() - cpu_before,
        peak_rss=sampler.peak_rss,
        peak_pss=sampler.peak_pss,
        peak_processes=sampler.peak_processes,
    )


def markdown_table(rows):
    """The measurements as a Markdown table (MB = 10^6 bytes)."""
    lines = [
        "| notebook | wall | CPU | cores busy | peak PSS | peak RSS | peak processes |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| `{row.name}` | {row.wall_s:.0f} s | {row.cpu_s:.0f} s | "
            f"{row.cpu_s / row.wall_s:.2f} | {row.peak_pss / 1e6:.0f} MB | "
            f"{row.peak_rss / 1e6:.0f} MB | {row.peak_processes} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help="jupytext .md notebooks to run")
    parser.add_argument(
        "--interval", type=float, default=0.1, help="seconds between samples (default 0.1)"
    )
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.notebooks if not path.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    rows = []
    for path in args.notebooks:
        rows.append(measure(path, args.interval))
        print(f"measured {rows[-1].name}", file=sys.stderr, flush=True)
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
