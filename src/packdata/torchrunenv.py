"""The variables torchrun sets for one rank, set in this process for a block of code.

Lessons play the ranks of a distributed job one after another in one notebook: inside
``with environment(RANK=1, WORLD_SIZE=2):``, webdataset's ``split_by_node`` and ``ShardDataset``
read rank 1 of 2, in this process and in the DataLoader workers started in the block.

A worker started by ``fork`` or ``spawn`` copies this process's environment as it starts. One
started by ``forkserver`` (the default on Linux from Python 3.14) copies the server's instead, and
the server started with the session's first worker: a variable set later never reaches it, and both
"ranks" would silently read every shard. So in the block, workers that would come from a forkserver
are spawned. Under torchrun this never arises: the variables are set before the first worker.
"""

import multiprocessing
import os
from contextlib import contextmanager


@contextmanager
def environment(**variables):
    """Set ``variables`` (``RANK=1, WORLD_SIZE=2``, say) for the block, in this process and its
    new workers; restore the previous values (or their absence) after it."""
    saved = {name: os.environ.get(name) for name in variables}
    chosen = multiprocessing.get_start_method(allow_none=True)  # None: not chosen yet, left so
    method = chosen or multiprocessing.get_all_start_methods()[0]  # the first is the default
    os.environ.update({name: str(value) for name, value in variables.items()})
    if method == "forkserver":
        multiprocessing.set_start_method("spawn", force=True)
    try:
        yield
    finally:
        if method == "forkserver":
            multiprocessing.set_start_method(chosen, force=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
