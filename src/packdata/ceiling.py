"""What parallel workers could reach here: the same work in plain processes, in the same rounds.

N DataLoader workers decode at most N times as fast as one process, and only when this program
gets N cores: in a container (a JupyterHub), its CPU quota decides; on Linux with autogroup (the
default on desktops and many servers) a notebook kernel and all the processes it starts share one
scheduling group, and with a busy program in another session they get about one core between them,
however many workers there are. So "2 workers are
faster than none" holds on a quiet machine and fails on a busy one, while what the lesson teaches
still holds: the workers use what the cores allow.

The ceiling measures what the cores allow, now: the loader's per-sample work (``work(i)`` for every
index) split over plain processes that send nothing back, measured in the same interleaved rounds
as the loader (``compare.in_turn``), so that it moves with the load. A verdict then judges the
workers against it:

    ceiling = plain_runs(dataset.__getitem__, len(dataset), processes=2)
    found = compare.in_turn({"2 workers": compare.epochs_of(dataset, num_workers=2), **ceiling})
    print(verdict(found, "2 workers", processes=2))
"""

import contextlib
import multiprocessing
import multiprocessing.connection
import traceback
from multiprocessing.util import Finalize

import torch

# the share of the ceiling that a loader reaches in every round for the verdict "most of": the rest
# is its own cost (every batch handed to the main process, which needs a share of the cores too)
ENOUGH = 0.6
ABOVE = 1.1  # a loader this far above the plain processes shows a disturbed measurement
LITTLE = 1.3  # plain processes gaining less on one, in every round, had about one core between them


def plain(processes):
    """The name of the ceiling run with ``processes`` plain processes."""
    return "1 plain process" if processes == 1 else f"{processes} plain processes"


def serve(connection, work, indices):
    """A plain process: say it is ready, then on each message call ``work(i)`` for every index of
    its share and answer how many; an error is answered with its traceback. ``None`` ends it."""
    torch.set_num_threads(1)  # as in a DataLoader worker
    # Ctrl-C, or a kernel that stops its children, ends it without a traceback, as it does a
    # DataLoader worker, and so does a parent gone before the answer: the parent reports what
    # matters. "ready" is inside: the interrupt can land just after its bytes are written
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        connection.send("ready")
        while told(connection) is not None:
            try:
                for index in indices:
                    work(index)
                connection.send(len(indices))
            except Exception:  # noqa: BLE001  sent back, raised in the parent
                connection.send(traceback.format_exc())


def told(connection):
    """The parent's next message on ``connection``; None when it says stop or is gone (a forked
    child holds the parent's end of the pipe too, so no end of file would tell it)."""
    parent = multiprocessing.parent_process()
    waited = [connection] if parent is None else [connection, parent.sentinel]
    if connection in multiprocessing.connection.wait(waited):
        return connection.recv()
    return None


class PlainProcesses:
    """A run for ``compare.in_turn``: ``work(i)`` for ``i`` in ``range(count)``, the indices dealt
    round-robin over ``processes`` processes; returns ``count``.

    The processes start here, and are ready when it returns (not timed), and stay, as a
    DataLoader's persistent workers do, until ``close()``, the exit of this process, or this
    object's end. ``work`` must pickle
    under ``spawn`` and ``forkserver``: a function or class of a module, or a method of a picklable
    object such as a dataset's ``__getitem__``. ``context``: a start method's name, or the default.
    A call that fails or is interrupted stops the processes, and the next call starts new ones.
    """

    def __init__(self, work, count, processes, context=None):
        if processes < 1:
            raise ValueError(f"a ceiling needs at least 1 process, got {processes}")
        self.work, self.count, self.processes = work, count, processes
        self.context = multiprocessing.get_context(context)
        self.connections, self.children, self._closer = [], [], None
        self._guarded(self.start)

    def start(self):
        """Start the processes, each with its share of the indices; return when all are ready."""
        self.connections, self.children = [], []
        # registered first, so that it also stops those started before an interruption
        self._closer = Finalize(self, stop, args=(self.connections, self.children), exitpriority=10)
        for part in range(self.processes):
            parent_end, child_end = self.context.Pipe()
            indices = range(part, self.count, self.processes)
            child = self.context.Process(
                target=serve, args=(child_end, self.work, indices), daemon=True
            )
            child.start()
            child_end.close()  # the parent keeps its end only: a dead child then reads as EOF
            self.connections.append(parent_end)
            self.children.append(child)
        self.answers()

    def __call__(self):
        return self._guarded(self._run)

    def _run(self):
        if not self.connections:
            self.start()
        for part, connection in enumerate(self.connections):
            try:
                connection.send(True)
            except OSError:
                raise self._died(part) from None
        return sum(self.answers())

    def _guarded(self, action):
        """``action()``; when it fails or is interrupted, the processes stop at once (they may be
        busy with their share) and the error goes on."""
        try:
            return action()
        except BaseException:
            self.close(wait=False)
            raise

    def _died(self, part):
        """The error for process ``part``, found gone."""
        return RuntimeError(f"plain process {part} of {self.processes} died")

    def answers(self):
        """Each process's answer; an error or a dead process raises ``RuntimeError`` naming it."""
        found = []
        for part, connection in enumerate(self.connections):
            try:
                answer = connection.recv()
            except EOFError:
                raise self._died(part) from None
            if isinstance(answer, str) and answer != "ready":
                raise RuntimeError(f"plain process {part} of {self.processes} failed:\n{answer}")
            found.append(answer)
        return found

    def close(self, wait=True):
        """Stop the processes: each when its share is done, or at once unless ``wait``; the next
        call starts new ones."""
        if not wait:
            for child in self.children:
                child.terminate()
        if self._closer:
            self._closer()
        self.connections, self.children, self._closer = [], [], None


def stop(connections, children):
    """Tell each process to end and wait for it."""
    for connection in connections:
        with contextlib.suppress(OSError):  # already gone
            connection.send(None)
        connection.close()
    for child in children:
        child.join(timeout=10)
        if child.is_alive():
            child.terminate()


def plain_runs(work, count, processes, context=None):
    """``{name: run}``: the ceiling's two runs, ``work`` over ``range(count)`` in one plain process
    and in ``processes``, started and ready, to measure in turn with the loader."""
    return {
        plain(n): PlainProcesses(work, count, n, context) for n in dict.fromkeys((1, processes))
    }


def verdict(
    comparison,
    loaders,
    processes,
    reached="the workers use most of what the cores allow",
    short="the workers lose much of what the cores allow",
    enough=ENOUGH,
):
    """What the cores allow (``processes`` plain processes against one), then for each of
    ``loaders`` (a run's name, or several) the share of the ceiling it reaches, each with the
    spread of its rounds, a line each. The words judge a share: ``reached`` when every round's is
    at least ``enough``, ``short`` when none is, else that the rounds straddle it; a share over
    ``ABOVE`` in every round judges nothing (the loaders do the plain processes' work and more, so
    only a machine that moved can put them far above it; on about one core, where loader and
    ceiling gain next to nothing, single rounds land above it by chance). The share is judged on
    busy cores too, where the ceiling itself is low: loaders slower than one plain process in
    every round are named in one line more, with that ratio and why; else, when the plain
    processes gained less than ``LITTLE`` on one in every round, that line says so, since no
    loader could gain much either.
    Lines stay short enough for a slide, and a busy machine adds at most one."""
    many, one = plain(processes), plain(1)
    allowed = comparison.ratio(many, one)
    lines = [f"the cores this notebook gets allow {allowed:.2f}: {many} / {one}"]
    slower = []
    for loader in [loaders] if isinstance(loaders, str) else loaders:
        share, gain = comparison.ratio(loader, many), comparison.ratio(loader, one)
        above = share.low > ABOVE
        if above:
            words = "above the ceiling: the machine moved; run it again"
        elif share.low >= enough:
            words = reached
        elif share.high < enough:
            words = short
        else:
            words = f"no clear verdict: the rounds straddle {enough:.0%}"
        lines.append(
            f"{loader}: {share.value:.0%} of what {many} reach here "
            f"(rounds {share.low:.0%} to {share.high:.0%}): {words}"
        )
        if not above and gain.high < 1:
            slower.append(f"{loader} {gain.value:.2f}×")
    if slower:
        lines.append(
            f"  {', '.join(slower)} of {one} in every round: other programs hold the cores"
        )
    elif allowed.high < LITTLE:
        lines.append(
            f"  {many} gain under {LITTLE}× on 1 in every round: this notebook has about one "
            "core now"
        )
    return "\n".join(lines)
