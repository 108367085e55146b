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
makes one) that starts them by the default method: the spawn run sets it to 1, so that each such
loader still starts a spawned worker, which must unpickle what it is sent, but only one.
"""


def start():
    """Set the start method; cap the workers when ``$PACKDATA_MOST_WORKERS`` says so."""
    import multiprocessing
    import os

    method = os.environ.get("PACKDATA_START_METHOD", "forkserver")
    multiprocessing.set_start_method(method)
    if method == "forkserver":
        multiprocessing.set_forkserver_preload(["torch", "torchvision"])
    if os.environ.get("PACKDATA_MOST_WORKERS"):
        cap_workers(int(os.environ["PACKDATA_MOST_WORKERS"]))


def cap_workers(most):
    """Every ``DataLoader`` made from now on without a start method of its own starts at most
    ``most`` workers (one that names its method, such as lesson 3's ``fork`` race, keeps them)."""
    import functools

    from torch.utils.data import DataLoader

    made = DataLoader.__init__

    @functools.wraps(made)
    def capped(self, *args, num_workers=0, **kwargs):
        if kwargs.get("multiprocessing_context") is None:
            num_workers = min(num_workers, most)
        made(self, *args, num_workers=num_workers, **kwargs)

    DataLoader.__init__ = capped


start()
