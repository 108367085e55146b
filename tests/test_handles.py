"""Per-process handles: the naive ZIP dataset breaks with workers, the per-process one never
does."""

import gc
import hashlib
import multiprocessing
import os
import pickle
import sys
import warnings
import zipfile
from functools import partial

import pytest
from torch.utils.data import DataLoader, Dataset, get_worker_info

from packdata import audit, perprocess
from packdata.audit import audit_reads, expected_checksums
from packdata.course.feedback import CheckFailed
from packdata.course.handle_checks import check_spawn_ready
from packdata.datasets import IndexedTarDataset, WorkerSafeZipDataset, ZipDataset
from packdata.imagefolder import load_manifest
from packdata.packing import pack_tar, pack_zip
from packdata.perprocess import PerProcessHandle

CONTEXTS = ["fork", "spawn", "forkserver"]


@pytest.fixture(autouse=True)
def more_workers_than_cores_is_fine():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        yield


@pytest.fixture(scope="module")
def packed(tiny_dataset, tmp_path_factory):
    """``(zip path, tar path, checksums by index)`` of the tiny dataset."""
    folder = tmp_path_factory.mktemp("handles")
    archive = pack_zip(tiny_dataset, folder / "tiny.zip", progress=False)
    tar = pack_tar(tiny_dataset, folder / "tiny.tar", progress=False)
    return archive, tar, expected_checksums(ZipDataset(archive), load_manifest(tiny_dataset))


class Recorder:
    """A handle that appends ``"<event> <pid>"`` lines to a log file (module level, so spawn can
    pickle it)."""

    def __init__(self, log):
        self.log = log
        self.write("open")

    def write(self, event):
        with open(self.log, "a") as file:
            file.write(f"{event} {os.getpid()}\n")

    def close(self):
        self.write("close")


def events(log):
    return log.read_text().splitlines() if log.exists() else []


# --- PerProcessHandle -----------------------------------------------------------------------------


def test_opens_on_first_use_once_per_process(tmp_path):
    log = tmp_path / "log"
    handle = PerProcessHandle(partial(Recorder, log))
    assert events(log) == []
    first = handle.get()
    assert handle.get() is first
    assert events(log) == [f"open {os.getpid()}"]


def child_report(handle, parent_handle, queue):
    own = handle.get()
    queue.put((own is parent_handle, own is handle.get(), perprocess.opened_in_this_process()))


def test_a_forked_child_opens_its_own_and_leaves_the_parents_alone(tmp_path):
    log = tmp_path / "log"
    handle = PerProcessHandle(partial(Recorder, log))
    parent_handle = handle.get()
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()
    child = fork.Process(target=child_report, args=(handle, parent_handle, queue))
    child.start()
    reused_parents, same_twice, opened = queue.get(timeout=30)
    child.join()
    assert not reused_parents and same_twice and opened == 1
    assert handle.get() is parent_handle
    # closed at its exit
    assert events(log) == [f"open {os.getpid()}", f"open {child.pid}", f"close {child.pid}"]


def test_pickling_carries_the_opener_not_the_handle(tmp_path):
    with open(tmp_path / "f", "wb") as file:
        file.write(b"0123456789")
    handle = PerProcessHandle(partial(open, tmp_path / "f", "rb"))
    handle.get().read(3)
    with pytest.raises(TypeError, match="cannot pickle"):
        pickle.dumps(handle.get())
    copy = pickle.loads(pickle.dumps(handle))
    # a fresh file, at offset 0
    assert copy.get() is not handle.get() and copy.get().read(3) == b"012"


def test_close_closes_and_the_next_get_reopens(tmp_path):
    log = tmp_path / "log"
    handle = PerProcessHandle(partial(Recorder, log))
    handle.get()
    handle.close()
    handle.close()
    handle.get()
    assert events(log) == [f"{event} {os.getpid()}" for event in ("open", "close", "open")]


def test_a_handle_is_closed_when_its_holder_is_collected(tmp_path):
    log = tmp_path / "log"
    handle = PerProcessHandle(partial(Recorder, log))
    handle.get()
    del handle
    gc.collect()
    assert events(log)[-1] == f"close {os.getpid()}"


class Opens(Dataset):
    """Two samples, each read through a ``PerProcessHandle`` of a ``Recorder``."""

    def __init__(self, log):
        self.handle = PerProcessHandle(partial(Recorder, log))

    def __len__(self):
        return 2

    def __getitem__(self, index):
        self.handle.get()
        return index


@pytest.mark.parametrize("context", CONTEXTS)
def test_every_dataloader_worker_opens_once_and_closes_at_exit(tmp_path, context):
    log = tmp_path / "log"
    dataset = Opens(log)
    dataset[0]  # the main process has its own handle, which no worker may use
    loader = DataLoader(dataset, batch_size=1, num_workers=2, multiprocessing_context=context)
    assert sorted(int(index) for batch in loader for index in batch) == [0, 1]
    del loader
    gc.collect()
    opened = [line.split()[1] for line in events(log) if line.startswith("open")]
    closed = [line.split()[1] for line in events(log) if line.startswith("close")]
    assert opened[0] == str(os.getpid()) and len(set(opened)) == len(opened) == 3
    assert sorted(closed) == sorted(opened[1:])  # every worker closed its handle as it exited


# --- the audit ------------------------------------------------------------------------------------


class Flaky(Dataset):
    """Samples ``b"0"``, ``b"1"``, …; sample 3 comes back wrong and sample 5 raises."""

    paths = [f"{index:06d}.bin" for index in range(8)]

    def __len__(self):
        return len(self.paths)

    def read_bytes(self, index):
        if index == 5:
            raise OSError("disk on fire at 'sector 7'")
        return b"wrong" if index == 3 else str(index).encode()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_audit_counts_errors_and_silently_wrong_bytes(num_workers):
    manifest = {
        "samples": [
            {"key": f"{i:06d}", "sha256": hashlib.sha256(str(i).encode()).hexdigest()}
            for i in reversed(range(8))
        ]
    }
    audit = audit_reads(
        Flaky(), expected_checksums(Flaky(), manifest), num_workers=num_workers, batch_size=3
    )
    assert (audit.samples, audit.correct, audit.wrong, audit.corrupted) == (8, 6, [3], 2)
    assert audit.errors == {5: "OSError: disk on fire at …"}
    assert sum(process["samples"] for process in audit.processes.values()) == 8
    assert len(audit.processes) == max(num_workers, 1)
    assert "8 samples: 6 correct, 1 raised an error, 1 silently wrong" in str(audit)


def test_audit_refuses_checksums_of_another_length():
    with pytest.raises(ValueError, match="7 checksums for 8 samples"):
        audit_reads(Flaky(), ["0" * 64] * 7)


def test_error_kind_reports_the_readers_error_without_the_names_it_quotes():
    wrapped = zipfile.BadZipFile("member '000001.jpg' of x.zip: Bad CRC-32 for file '000001.jpg'")
    wrapped.__cause__ = zipfile.BadZipFile("Bad CRC-32 for file '000001.jpg'")
    assert audit.error_kind(wrapped) == "BadZipFile: Bad CRC-32 for file …"
    differ = zipfile.BadZipFile("File name in directory 'a.jpg' and header b'\\x00' differ.")
    assert audit.error_kind(differ) == "BadZipFile: File name in directory …"
    assert audit.error_kind(EOFError("short read")) == "EOFError: short read"


def test_error_kind_keeps_a_message_that_starts_with_a_quote():
    error = AttributeError("'NoneType' object has no attribute 'read'")
    assert audit.error_kind(error) == "AttributeError: 'NoneType' object has no attribute 'read'"


def reopen_zip(worker_id):
    dataset = get_worker_info().dataset
    dataset.zip_file = zipfile.ZipFile(dataset.archive)


# --- the naive ZIP dataset breaks, the per-process one does not -----------------------------------


def audit_under_fork(dataset, checksums, **options):
    """An audit of one epoch read by 4 forked workers, 4 samples a batch."""
    return audit_reads(
        dataset, checksums, num_workers=4, batch_size=4, multiprocessing_context="fork", **options
    )


def test_the_naive_zip_dataset_fails_or_corrupts_under_fork(packed):
    archive, _, checksums = packed
    # a race: about one read in twenty goes wrong here; bounded, so never flaky
    for _ in range(100):
        audit = audit_under_fork(ZipDataset(archive), checksums)
        # all read the parent's handle
        assert all(process["opened"] == 0 for process in audit.processes.values())
        if audit.corrupted:
            break
    assert audit.corrupted, "100 epochs under fork without a single bad read"


@pytest.mark.filterwarnings("ignore:Got pickle error when attempting to start a worker Process")
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_the_naive_zip_dataset_cannot_be_pickled_for_spawn(packed, context):
    loader = DataLoader(ZipDataset(packed[0]), num_workers=1, multiprocessing_context=context)
    # "'_io.BufferedReader' object" up to Python 3.11, "'BufferedReader' instances" from 3.12
    with pytest.raises(TypeError, match=r"cannot pickle '(_io\.)?BufferedReader'"):
        iter(loader)


def test_a_worker_init_fn_that_reopens_fixes_the_naive_zip_under_fork(packed):
    archive, _, checksums = packed
    for _ in range(5):
        audit = audit_under_fork(ZipDataset(archive), checksums, worker_init_fn=reopen_zip)
        assert audit.correct == audit.samples


@pytest.mark.parametrize(
    "kind, context", [*(("zip", c) for c in CONTEXTS), ("tar", "fork"), ("tar", "forkserver")]
)
# tar + spawn: test_datasets
def test_per_process_datasets_are_right_under_every_start_method(packed, kind, context):
    archive, tar, checksums = packed
    dataset = WorkerSafeZipDataset(archive) if kind == "zip" else IndexedTarDataset(tar)
    # the main process's own handle is open: workers must not inherit or pickle it
    dataset.read_bytes(0)
    epochs = 5 if context == "fork" else 1
    for _ in range(epochs):
        audit = audit_reads(
            dataset, checksums, num_workers=3, batch_size=4, multiprocessing_context=context
        )
        assert audit.correct == audit.samples, str(audit)
        assert len(audit.processes) == 3 and all(p["opened"] == 1 for p in audit.processes.values())


def test_the_per_process_zip_dataset_reads_like_the_naive_one_in_the_main_process(packed):
    archive, _, checksums = packed
    naive, safe = ZipDataset(archive), WorkerSafeZipDataset(archive)
    assert isinstance(safe, ZipDataset)
    assert (safe.classes, safe.paths, safe.labels) == (naive.classes, naive.paths, naive.labels)
    assert safe.zip_file is safe.zip_file
    # __init__ opened the ZIP to read the manifest
    audit = audit_reads(WorkerSafeZipDataset(archive), checksums)
    assert audit.correct == audit.samples and list(audit.processes.values()) == [
        {"samples": 60, "opened": 0}
    ]
    copy = pickle.loads(pickle.dumps(safe))
    assert copy.zip_file is not safe.zip_file and copy.read_bytes(7) == naive.read_bytes(7)


def test_a_pickled_tar_dataset_carries_no_descriptor(packed):
    dataset = IndexedTarDataset(packed[1])
    descriptor = dataset._tar.get().fileno()
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy._tar.get().fileno() != descriptor and copy.read_bytes(3) == dataset.read_bytes(3)


class FromMain(ZipDataset):
    def __reduce__(self):
        return FromMain, (self.archive,)


def test_the_spawn_check_names_a_class_that_a_spawned_worker_cannot_import(packed, monkeypatch):
    monkeypatch.setattr(FromMain, "__module__", "__main__")
    # as if defined in a notebook
    monkeypatch.setattr(sys.modules["__main__"], "FromMain", FromMain, raising=False)
    with pytest.raises(
        CheckFailed, match="The pickle names __main__.FromMain, defined in this notebook"
    ):
        check_spawn_ready(FromMain(packed[0]), {"samples": []})
