"""State that belongs to one process: file handles, connections, a function installed in a pool's
workers.

A dataset that opens its file (a ZIP, a tar, an HDF5 file, an LMDB environment) in ``__init__``
breaks with DataLoader workers. Under ``fork`` every worker inherits the parent's descriptor, so
they share one file offset and their seeks and reads interleave. Under ``spawn`` and ``forkserver``
the dataset is pickled, and an open file cannot be. ``PerProcessHandle`` avoids both: it opens on
first use in each process (keyed by process id), pickles as its opener alone, and closes its handle
when the process exits.

    self.zip = PerProcessHandle(functools.partial(zipfile.ZipFile, path))  # in __init__
    self.zip.get().read(name)  # in __getitem__: opens this process's own on first use

``map_in_processes`` is the same idea for a process pool: the function (with whatever large state it
carries) is sent to each worker once, not with every item.
"""

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.util import Finalize

# process id -> handles PerProcessHandle opened in it (a forked child does not count its parent's)
_opened = {}


def opened_in_this_process():
    """How many handles ``PerProcessHandle`` has opened in the calling process."""
    return _opened.get(os.getpid(), 0)


class PerProcessHandle:
    """``get()`` returns this process's handle, calling ``opener()`` on first use in each process.

    ``opener`` must pickle (a module-level function or class, or a ``functools.partial`` of one, not
    a lambda) for ``spawn`` and ``forkserver``. A handle with a ``close()`` method is closed when
    the process exits.
    """

    def __init__(self, opener):
        self.opener = opener
        self._handle, self._pid, self._closer = None, None, None

    def get(self):
        """This process's handle, opened now if this process has none yet."""
        pid = os.getpid()
        # first use here, or a forked child holding its parent's handle: never use that one
        if self._pid != pid:
            self._handle, self._pid = self.opener(), pid
            _opened[pid] = _opened.get(pid, 0) + 1
            close = getattr(self._handle, "close", None)
            # multiprocessing runs this when the process exits (DataLoader workers included) or this
            # object dies
            self._closer = close and Finalize(self, close, exitpriority=0)
        return self._handle

    def close(self):
        """Close this process's handle, if it opened one; the next ``get()`` opens a fresh one."""
        if self._pid == os.getpid() and self._closer:
            self._closer()  # closes the handle and forgets the exit-time close
        self._handle, self._pid, self._closer = None, None, None

    def __getstate__(self):  # the recipe travels, the open file does not
        return {"opener": self.opener, "_handle": None, "_pid": None, "_closer": None}


_installed = None  # the function map_in_processes runs, in each of its pool's processes


def _install(function):
    global _installed
    _installed = function


def _call_installed(item):
    return _installed(item)


def map_in_processes(function, items, processes=1, chunksize=1):
    """``function(item)`` for each item, in order, computed in ``processes`` processes (in this one
    when ``processes`` ≤ 1). ``function`` must pickle; it is sent to each process once, when the
    process starts."""
    if processes <= 1:
        yield from map(function, items)
        return
    with ProcessPoolExecutor(processes, initializer=_install, initargs=(function,)) as pool:
        yield from pool.map(_call_installed, items, chunksize=chunksize)
