"""Start worker processes in a notebook kernel the way Python 3.14 or macOS would.

`make test` points ``PYTHONSTARTUP`` at this file, and IPython kernels run it before the first
cell: every ``DataLoader``, ``WebLoader`` and ``Pool`` a lesson makes without a
``multiprocessing_context`` of its own then starts its workers with ``$PACKDATA_START_METHOD``,
``forkserver`` unless set (the default on Linux from Python 3.14; 3.11 to 3.13 fork).
tests/test_lessons.py runs the lessons once more with ``spawn``, the default on macOS and
Windows.

The forkserver imports torch and torchvision once, before it forks the first worker: each worker
then starts in milliseconds instead of spending about 1.5 s of CPU importing them, which keeps
`make test` short. What a worker must receive by pickle is the same either way.

``$PACKDATA_MOST_WORKERS``, when set, caps the workers of every ``DataLoader`` (a ``WebLoader``
makes one) and torchdata ``StatefulDataLoader`` that starts them by the default method: the spawn
run sets it to 1, so that each such loader still starts a spawned worker, which must unpickle what
it is sent, but only one. A loader that names its start method keeps its workers (lesson 3's
``fork`` race needs four). ``$PACKDATA_PROCESS_LOG``, when set, names a file that gets a line for
each process started from the kernel: tests/test_lessons.py checks which lessons start none.
"""


def start():
    """Set the start method; cap the workers when ``$PACKDATA_MOST_WORKERS`` says so."""
    import functools
    import multiprocessing
    import os

    method = os.environ.get("PACKDATA_START_METHOD", "forkserver")
    multiprocessing.set_start_method(method)
    if method == "forkserver":
        multiprocessing.set_forkserver_preload(["torch", "torchvision"])
    if os.environ.get("PACKDATA_PROCESS_LOG"):  # a line for each process started from here
        log, starts = os.environ["PACKDATA_PROCESS_LOG"], multiprocessing.process.BaseProcess.start

        def noted(self):
            with open(log, "a") as file:
                file.write(f"{type(self).__name__}\n")
            starts(self)

        multiprocessing.process.BaseProcess.start = noted
    if not os.environ.get("PACKDATA_MOST_WORKERS"):
        return
    most = int(os.environ["PACKDATA_MOST_WORKERS"])
    if most < 1:
        raise ValueError(f"PACKDATA_MOST_WORKERS must be at least 1, got {most}")

    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader  # an __init__ of its own

    def capped(made):
        @functools.wraps(made)
        def init(self, *args, **kwargs):
            made(self, *args, **kwargs)
            if self.multiprocessing_context is None:
                self.num_workers = min(self.num_workers, most)

        return init

    for loader in (DataLoader, StatefulDataLoader):
        loader.__init__ = capped(loader.__init__)


start()
del start  # IPython runs this file in the notebook's namespace: leave nothing there
