"""Checks of lesson 3: a dataset that opens its file handle in each process, the same done by a
``worker_init_fn``, and a dataset ready for the spawn start method; each audited through a real
``DataLoader`` with worker processes.
"""

import re

from .feedback import CheckFailed, passed, stop_workers

# what pickle says of an open file or a lock: "cannot pickle '_io.BufferedReader' object" up to
# Python 3.11, "cannot pickle 'BufferedReader' instances" from 3.12; "'_thread.RLock' object";
# and of the other handles a dataset may hold: a memory map, a socket, a per-thread store, SQLite
UNPICKLABLE_HANDLE = re.compile(
    r"cannot pickle '(_io\.|_thread\.|mmap\.|sqlite3\.)?"
    r"(Buffered\w+|TextIOWrapper|FileIO|\w*lock|mmap|socket|_local|Connection|Cursor)'",
    re.IGNORECASE,
)


CHECK_WORKERS = 3


def _audit_or_explain(dataset, manifest, what, **loader_kwargs):
    """``handles.audit_reads`` with ``CHECK_WORKERS`` workers; a loader that fails (e.g. the dataset
    does not pickle, or a worker dies) becomes ``CheckFailed`` naming ``what`` ran. The learner's
    ``NotImplementedError`` passes through, with the stub's own message when a worker raised it
    (not the worker's traceback, at whose end the hint would come)."""
    import warnings

    from ..audit import audit_reads, expected_checksums

    try:
        with warnings.catch_warnings():
            # 3 workers on purpose
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            return audit_reads(
                dataset,
                expected_checksums(dataset, manifest),
                num_workers=CHECK_WORKERS,
                **loader_kwargs,
            )
    except NotImplementedError as error:
        if not str(error).startswith("Caught NotImplementedError"):  # raised in this process
            raise
        stub_line = str(error).strip().splitlines()[-1]  # the worker's traceback ends with it
        raise NotImplementedError(stub_line.removeprefix("NotImplementedError: ")) from None
    except Exception as error:
        raise CheckFailed(f"{what} failed: {type(error).__name__}: {error}") from error


def _first_error(audit):
    index, kind = next(iter(audit.errors.items()))
    return f"e.g. sample {index}: {kind}"


class _HandleShared:
    """A one-item dataset whose item says, where it is read, whether
    ``dataset._get_file_handle()`` returns ``handle``, and whether a second call returns the same
    handle as the first."""

    def __init__(self, dataset, handle):
        self.dataset, self.handle = dataset, handle

    def __len__(self):
        return 1

    def __getitem__(self, index):
        first = self.dataset._get_file_handle()
        return first is self.handle, self.dataset._get_file_handle() is first


def _in_a_forked_worker(dataset, **loader_kwargs):
    """``dataset[0]``, read by one forked DataLoader worker; the worker is shut down before this
    returns or raises (an exception's traceback would otherwise keep it alive)."""
    from torch.utils.data import DataLoader

    loader = DataLoader(
        dataset, batch_size=None, num_workers=1, multiprocessing_context="fork", **loader_kwargs
    )
    items = iter(loader)
    try:
        return next(items)
    finally:
        stop_workers(items)


def _forked_worker_handles(dataset, handle):
    """``(inherited, kept)``: whether a DataLoader worker forked now gets ``handle``, the main
    process's open one, from ``dataset._get_file_handle()``, and whether it gets the same one
    twice."""
    try:
        return _in_a_forked_worker(_HandleShared(dataset, handle))
    except NotImplementedError:
        raise
    except Exception as error:
        raise CheckFailed(
            f"_get_file_handle() failed in a forked DataLoader worker: {type(error).__name__}: "
            f"{error}"
        ) from None


def check_per_process_handle(dataset_class, archive, manifest):
    """Lesson 3: ``dataset_class(archive)._get_file_handle()`` is one ``ZipFile`` per process,
    reused within it."""
    import zipfile

    try:
        dataset = dataset_class(archive)
    except NotImplementedError:
        raise
    except Exception as error:
        raise CheckFailed(
            f"{dataset_class.__name__}(archive) failed: {type(error).__name__}: {error}. "
            "Building the dataset already reads the ZIP's manifest through "
            "self._get_file_handle().read(name), so your method runs first there: it must return "
            "a zipfile.ZipFile of self.archive, whose read(name) gives a member's bytes."
        ) from error
    handle = dataset._get_file_handle()
    if not isinstance(handle, zipfile.ZipFile):
        raise CheckFailed(
            f"_get_file_handle() returned a {type(handle).__name__}; it should return a "
            "zipfile.ZipFile of self.archive."
        )
    if dataset._get_file_handle() is not handle:
        raise CheckFailed(
            "Two calls in the same process returned two different ZipFiles: you open the archive "
            "(and read its central directory) for every sample. Keep the ZipFile in self, with "
            "the os.getpid() that opened it, and return the same one while that pid is the "
            "caller's."
        )
    inherited, kept = _forked_worker_handles(dataset, handle)
    if inherited:
        raise CheckFailed(
            "A forked worker got the main process's ZipFile back, still open: it would share the "
            "file offset with every other worker (a lock around each read would not help: each "
            "process's buffered file keeps its own idea of that offset). Whether a handle exists "
            "or is open does not tell processes apart; compare os.getpid() with the pid that "
            "opened it."
        )
    if not kept:
        raise CheckFailed(
            "In a forked worker, two calls returned two different ZipFiles: the worker opens the "
            "archive for every sample. Store the handle it opens, with os.getpid(), and return it "
            "while the pid is the same."
        )
    # from now on, any process that still reads through the main process's handle fails at once
    handle.close()
    audit = _audit_or_explain(
        dataset,
        manifest,
        f"A DataLoader with {CHECK_WORKERS} forked workers",
        multiprocessing_context="fork",
        batch_size=4,
    )
    if audit.errors:
        raise CheckFailed(
            f"{len(audit.errors)} of {audit.samples:,} samples failed in {CHECK_WORKERS} forked "
            "workers "
            f"({_first_error(audit)}). This check closed the main process's ZipFile before "
            "starting them, so a "
            "worker that reads through the handle it inherited fails instead of racing the others. "
            "Remember "
            "which process opened the handle (os.getpid()) and open a new one when the caller is "
            "another process."
        )
    if audit.wrong:
        raise CheckFailed(
            f"{len(audit.wrong)} samples came back with the wrong bytes, e.g. sample "
            f"{audit.wrong[0]}: "
            "read the member named self.paths[index] through this process's handle."
        )
    passed(
        f"one ZipFile per process: {CHECK_WORKERS} forked workers opened their own and read all "
        f"{audit.samples:,} samples right."
    )


class _StoredClosed:
    """A one-item dataset over a ``ZipDataset`` whose ``zip_file`` is closed; attributes pass
    through, so a ``worker_init_fn`` sees the dataset it expects. Its item says whether the
    ``zip_file`` it finds is another ``ZipFile`` than the one inherited, and closed too."""

    def __init__(self, dataset):
        self.__dict__.update(dataset=dataset, inherited=dataset.zip_file)

    def __getattr__(self, name):  # only called for names this wrapper lacks
        return getattr(self.dataset, name)

    def __setattr__(self, name, value):
        setattr(self.dataset, name, value)

    def __len__(self):
        return 1

    def __getitem__(self, index):
        import zipfile

        handle = getattr(self.dataset, "zip_file", None)
        stored = isinstance(handle, zipfile.ZipFile) and handle is not self.inherited
        return stored and handle.fp is None


def check_worker_init_fn(worker_init_fn, archive, manifest):
    """Lesson 3: ``worker_init_fn`` gives each forked worker's copy of a ``ZipDataset`` a
    ``ZipFile`` of its own."""
    from ..datasets import ZipDataset

    dataset = ZipDataset(archive)
    # a worker still reading through the main process's handle now fails at once
    dataset.zip_file.close()
    audit = _audit_or_explain(
        dataset,
        manifest,
        f"A DataLoader with {CHECK_WORKERS} forked workers and your worker_init_fn",
        multiprocessing_context="fork",
        batch_size=4,
        worker_init_fn=worker_init_fn,
    )
    if audit.errors and _in_a_forked_worker(_StoredClosed(dataset), worker_init_fn=worker_init_fn):
        raise CheckFailed(
            f"{len(audit.errors)} of {audit.samples:,} samples failed ({_first_error(audit)}): "
            "the ZipFile your worker_init_fn stored in the dataset is closed before the worker "
            "reads: a with block closes it at its end, as close() does. Store one left open, "
            "dataset.zip_file = zipfile.ZipFile(dataset.archive), outside any with block; its "
            "file is closed when the worker exits."
        )
    if audit.errors:
        raise CheckFailed(
            f"{len(audit.errors)} of {audit.samples:,} samples failed ({_first_error(audit)}). "
            "This check closed the "
            "main process's ZipFile before the workers started, so a worker that still reads "
            "through it fails. Does your worker_init_fn give the dataset that this worker "
            "reads from (get_worker_info() knows it) a handle of its own, stored where "
            "read_member looks for it?"
        )
    if audit.wrong:
        raise CheckFailed(
            f"{len(audit.wrong)} samples came back with the wrong bytes, e.g. sample "
            f"{audit.wrong[0]}: "
            "open the same archive, dataset.archive, in each worker."
        )
    passed(
        f"each of {CHECK_WORKERS} forked workers read through a ZipFile of its own: all "
        f"{audit.samples:,} samples "
        "right."
    )


def _classes_named_by(blob):
    """``(module, name)`` of every global a pickle would import when loaded."""
    import contextlib
    import io
    import pickle

    names = []

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            names.append((module, name))
            return super().find_class(module, name)

    # a recipe whose call fails: its names came before the call, and the recipe check says why
    with contextlib.suppress(TypeError, ValueError):
        Recorder(io.BytesIO(blob)).load()
    return names


def _unchanged(image):
    """The transform ``check_spawn_ready`` builds a dataset with (a spawned worker imports it)."""
    return image


def _check_recipe_keeps_arguments(cls, archive):
    """A ``cls`` built with arguments other than the defaults comes back from its pickle with the
    same ``archive``, ``transform`` and ``decoder``: a recipe that drops or shifts one passes the
    audit (it reads bytes only) but decodes differently in every worker."""
    import pickle

    built = cls(archive, transform=_unchanged, decoder="torchcodec")
    order = "in ZipDataset's order (archive, transform, decoder)"
    try:
        copy = pickle.loads(pickle.dumps(built))
    except (TypeError, ValueError) as error:  # e.g. the decoder where the transform goes
        raise CheckFailed(
            f"{cls.__name__}(archive, transform={_unchanged.__name__}, decoder='torchcodec') "
            f"could not be rebuilt from its pickle: {type(error).__name__}: {error}. The recipe "
            f"must give the three arguments {order}."
        ) from None
    for name in ("archive", "transform", "decoder"):
        got, expected = getattr(copy, name, None), getattr(built, name)
        if got != expected:
            raise CheckFailed(
                f"{cls.__name__}(archive, transform={_unchanged.__name__}, "
                f"decoder='torchcodec') comes back from its pickle with {name}={got!r}, not "
                f"{expected!r}: the recipe must rebuild the dataset with all three arguments, "
                f"{order}."
            )


def check_spawn_ready(dataset, manifest):
    """Lesson 3: ``dataset`` (a ``ZipDataset`` that has been read from) pickles for ``spawn``, and
    ``CHECK_WORKERS`` spawned workers read every sample right."""
    import pickle

    dataset.read_bytes(0)  # used once: its handle is open, as it is after a first look at the data
    try:
        blob = pickle.dumps(dataset)
    except NotImplementedError:
        raise
    except Exception as error:
        if UNPICKLABLE_HANDLE.search(str(error)):
            raise CheckFailed(
                f"pickle.dumps(dataset) failed: {type(error).__name__}: {error}. A spawned worker "
                "receives the "
                "dataset pickled, and an open handle (a ZipFile's file and lock, a memory map "
                "(mmap), a socket) cannot be pickled. "
                "Pickle a recipe "
                "instead: __reduce__ returns a class and the arguments to build the dataset again, "
                "e.g. the archive "
                "path."
            ) from error
        raise CheckFailed(
            f"pickle.dumps(dataset) failed: {type(error).__name__}: {error}. __reduce__ must "
            "return a tuple of two "
            "things: the class to call, then a tuple of the arguments to call it with, such as "
            "(SomeClass, (path,)) "
            "(the comma makes a one-item tuple)."
        ) from error
    from_notebook = [
        f"{module}.{name}" for module, name in _classes_named_by(blob) if module == "__main__"
    ]
    if from_notebook:
        raise CheckFailed(
            f"The pickle names {from_notebook[0]}, defined in this notebook. A spawned worker is a "
            "fresh Python: it "
            "imports what the pickle names, and it cannot import a notebook. Rebuild with a class "
            "that lives in a "
            "module, such as packdata.datasets.ZipDataset."
        )
    _check_recipe_keeps_arguments(type(dataset), dataset.archive)
    audit = _audit_or_explain(
        dataset,
        manifest,
        f"A DataLoader with {CHECK_WORKERS} spawned workers",
        multiprocessing_context="spawn",
        batch_size=64,
    )
    if audit.corrupted:
        raise CheckFailed(
            f"{audit.corrupted} of {audit.samples:,} samples did not arrive intact in the spawned "
            f"workers ({audit}); rebuild the dataset from the same archive, with the same "
            "arguments."
        )
    passed(
        f"the dataset pickles to {len(blob):,} bytes with no open file inside; {CHECK_WORKERS} "
        "spawned workers "
        f"rebuilt it and read all {audit.samples:,} samples right."
    )
