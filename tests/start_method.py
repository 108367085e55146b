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

``$PACKDATA_SPAWN_ONCE``, when set under ``spawn``, spawns a loader's workers (or the ceiling's
plain processes) only when they can fail in a way no spawned worker of this kernel has shown yet:
when what they are sent (a loader's dataset, ``collate_fn`` and ``worker_init_fn``) names a class
or function that no spawned worker has imported, or one defined in the notebook. Other workers
come from a forkserver, torch and torchvision preloaded, as in the first run, while the environment
is the one that server started with (its workers copy the server's environment, spawned ones this
process's: ``packdata.torchrunenv``).
"""


def start():
    """Set the start method; cap the workers when ``$PACKDATA_MOST_WORKERS`` says so."""
    import functools
    import multiprocessing
    import os

    method = os.environ.get("PACKDATA_START_METHOD", "forkserver")
    multiprocessing.set_start_method(method)
    preload = ["torch", "torchvision"]  # what a forkserver, if one starts, imports first
    multiprocessing.set_forkserver_preload(preload)
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
    if method == "spawn" and os.environ.get("PACKDATA_SPAWN_ONCE"):
        spawn_once((DataLoader, StatefulDataLoader), preload)


def spawn_once(loaders, preload):
    """Give each of ``loaders``, and the ceiling's plain processes, the forkserver (which imports
    ``preload`` first) when spawning their workers would show nothing new."""
    import functools
    import importlib
    import inspect
    import os
    import pickle
    from multiprocessing import forkserver

    from packdata.ceiling import PlainProcesses

    spawned, server = set(), {}  # names spawned workers imported; the server's environment

    class Discard:
        def write(self, data):
            pass

    class Names(pickle.Pickler):
        """A pickler that keeps only the names of the classes and functions it meets."""

        def __init__(self):
            super().__init__(Discard())
            self.names = set()

        def reducer_override(self, obj):
            if callable(obj) and hasattr(obj, "__qualname__"):
                self.names.add((getattr(obj, "__module__", None), obj.__qualname__))
            return NotImplemented

    def forkable():
        """Whether a forkserver's workers would see this process's environment."""
        if not server:
            if getattr(forkserver._forkserver, "_forkserver_pid", None) is not None:
                server["environ"] = None  # started before us, with an environment we did not see
            else:  # the server imports these first, and they set variables (torchvision sets
                for name in preload:  # TORCHINDUCTOR_CACHE_DIR): here too, before the snapshot
                    importlib.import_module(name)
        return server.setdefault("environ", dict(os.environ)) == os.environ

    def start_method(sent):
        """``"forkserver"`` when workers sent ``sent`` would import only what spawned ones did,
        else None (the default, spawn); the names count as spawned from here on."""
        names = Names()
        try:
            names.dump(sent)
        except Exception:  # the workers will fail as they start: let them, spawned
            return None
        known = names.names <= spawned and forkable()
        if not any(module == "__main__" for module, _ in names.names):
            spawned.update(names.names)
        return "forkserver" if known else None

    def marked(made):
        @functools.wraps(made)
        def init(self, *args, **kwargs):
            made(self, *args, **kwargs)
            self.default_start = self.multiprocessing_context is None

        return init

    def decided(iterate):
        @functools.wraps(iterate)
        def iter_(self):
            if getattr(self, "default_start", False) and self.num_workers:
                sent = (self.dataset, self.collate_fn, self.worker_init_fn)
                self.multiprocessing_context = start_method(sent)
            return iterate(self)

        return iter_

    def plain(made):
        signature = inspect.signature(made)

        @functools.wraps(made)
        def init(self, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs)
            if bound.arguments.get("context") is None:
                bound.arguments["context"] = start_method(bound.arguments["work"])
            made(*bound.args, **bound.kwargs)

        return init

    for loader in loaders:
        loader.__init__ = marked(loader.__init__)
        loader.__iter__ = decided(loader.__iter__)
    PlainProcesses.__init__ = plain(PlainProcesses.__init__)


start()
del start  # IPython runs this file in the notebook's namespace: leave nothing there
