"""Give me an executor: a ``concurrent.futures.Executor`` on this machine's processes or on a Dask
cluster, the same interface on both.

    with engines.local(processes=2) as executor:            # a process pool on this machine
    with engines.dask(workers=2) as executor:               # a Dask LocalCluster on 127.0.0.1
    with engines.dask("tcp://scheduler:8786") as executor:  # a cluster already running

Code that calls ``executor.submit(function, *args)`` and waits on the futures
(``concurrent.futures.as_completed`` or ``wait``) runs unchanged on any of them; each context
manager waits for the submitted tasks and closes its processes or connection on the way out.
``function`` and its arguments must pickle: a function of an installed package (or a
``functools.partial`` of one) works everywhere. Dask also ships a function defined in a notebook, by
value, but what it imports must be installed on every worker; a pool under ``spawn`` or
``forkserver`` cannot take one. Dask's dashboard stays off (bokeh is not needed), and a
``LocalCluster`` listens on loopback only.
"""

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager


@contextmanager
def local(processes=2, start_method=None):
    """A ``ProcessPoolExecutor`` of ``processes`` processes (``start_method``: ``"spawn"``,
    ``"forkserver"``, ``"fork"``, or the platform's default)."""
    context = multiprocessing.get_context(start_method)
    with ProcessPoolExecutor(processes, mp_context=context) as executor:
        yield executor


def _one_task_a_thread():
    """Dask's scheduler configured to hand each worker thread one task at a time (by default a
    one-thread worker holds a second one in reserve, and at the end of a map of long tasks one
    worker can sit idle while the other still has two). Set where the scheduler starts: for a
    ``LocalCluster`` or a ``SLURMCluster``, in this process."""
    import dask

    return dask.config.set({"distributed.scheduler.worker-saturation": 1.0})


@contextmanager
def dask_client(address=None, workers=2):
    """A ``distributed.Client``: connected to the scheduler at ``address``, or to a ``LocalCluster``
    of ``workers`` worker processes (one thread each) on 127.0.0.1, closed on the way out. For
    ``client.run`` and the like; ``dask`` gives the executor."""
    from distributed import Client, LocalCluster

    if address is not None:
        with Client(address) as client:
            yield client
        return
    with _one_task_a_thread():
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            # no dashboard (nor bokeh); the scheduler's small HTTP server (health, metrics) on
            # a free loopback port, not on 8787, which another cluster may hold
            scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
            silence_logs=logging.ERROR,
        )
    with cluster, Client(cluster) as client:
        yield client


@contextmanager
def dask(address=None, workers=2):
    """An executor on a Dask cluster: the scheduler at ``address`` (``"tcp://host:8786"``, or a
    ``dask_jobqueue.SLURMCluster``), or a ``LocalCluster`` of ``workers`` processes on 127.0.0.1.
    Tasks are submitted as impure (``pure=False``): a task that writes a file runs every time it
    is submitted, never answered from an earlier result."""
    with dask_client(address, workers) as client:
        executor = client.get_executor(pure=False)
        try:
            yield executor
        finally:
            executor.shutdown(wait=True)
