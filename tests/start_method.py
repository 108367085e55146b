"""Start worker processes in a notebook kernel the way Python 3.14 or macOS would.

`make test` points ``PYTHONSTARTUP`` at this file, and IPython kernels run it before the first
cell: every ``DataLoader``, ``WebLoader`` and ``Pool`` a lesson makes without a
``multiprocessing_context`` of its own then starts its workers with ``$PACKDATA_START_METHOD``,
``forkserver`` unless set (the default on Linux from Python 3.14; 3.11 to 3.13 fork).
tests/test_lessons.py runs most lessons once more with ``spawn``, the default on macOS and
Windows.

The forkserver imports torch and torchvision once, before it forks the first worker: each worker
then starts in milliseconds instead of spending about 1.5 s of CPU importing them, which keeps
`make test` short. What a worker must receive by pickle is the same either way.
"""

import multiprocessing
import os

method = os.environ.get("PACKDATA_START_METHOD", "forkserver")
multiprocessing.set_start_method(method)
if method == "forkserver":
    multiprocessing.set_forkserver_preload(["torch", "torchvision"])
