"""An audit of what DataLoader workers really read: every sample's bytes checked against its
manifest.

``audit_reads`` runs a DataLoader over a dataset's raw bytes and compares every sample with its
manifest SHA-256, so errors and silently wrong bytes are both counted, sample by sample, and with
them the processes that read them and the file handles each opened (``perprocess.PerProcessHandle``
counts those).

    dataset = ZipDataset("train.zip")
    audit = audit_reads(dataset, expected_checksums(dataset, manifest), num_workers=2)
    audit.correct, audit.errors, audit.wrong
"""

import hashlib
import os
import re
import traceback
from collections import Counter
from dataclasses import dataclass, field

from torch.utils.data import DataLoader, Dataset

from .perprocess import opened_in_this_process


def expected_checksums(dataset, manifest):
    """The SHA-256 of each of ``dataset``'s samples, in index order, from a manifest (the dataset's
    or an archive's): a sample's member name ``<key>.<ext>`` is looked up by key."""
    by_key = {sample["key"]: sample["sha256"] for sample in manifest["samples"]}
    return [by_key[path.rsplit("/", 1)[-1].partition(".")[0]] for path in dataset.paths]


def error_kind(error):
    """An error's type and message up to the first name it quotes, so that equal failures group
    together: ``"BadZipFile: Bad CRC-32 for file …"``; the whole message when it starts with a
    quote (``"AttributeError: 'NoneType' object has no attribute 'read'"``)."""
    # packdata wraps reader errors to name the archive: report the reader's
    while error.__cause__ is not None:
        error = error.__cause__
    message = str(error)
    quote = re.search(r"""\s*b?['"]""", message)
    head = message[: quote.start()] if quote else ""
    return f"{type(error).__name__}: " + (head + " …" if head else message)


class _Fingerprints(Dataset):
    """Item ``i`` is ``(i, process id, handles opened there so far, SHA-256 of the bytes or "",
    error or "")``. Other attributes pass through to the wrapped dataset, so a ``worker_init_fn``
    sees the dataset it expects."""

    def __init__(self, dataset):
        self.__dict__["dataset"] = dataset

    def __getattr__(self, name):  # only called for names this wrapper lacks
        if name == "dataset":  # not set yet, e.g. while unpickling
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __setattr__(self, name, value):
        setattr(self.dataset, name, value)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        try:
            digest, error = hashlib.sha256(self.dataset.read_bytes(index)).hexdigest(), ""
        except Exception as caught:  # counted, not raised: one bad sample must not end the audit
            digest, error = "", error_kind(caught)
        return index, os.getpid(), opened_in_this_process(), digest, error


def _as_list(batch):
    return batch


@dataclass
class ReadAudit:
    """Every sample a DataLoader delivered, checked: the right bytes, an error, or silently wrong
    bytes."""

    samples: int
    correct: int = 0
    errors: dict = field(default_factory=dict)  # index -> error kind
    # indices whose bytes differ from the checksum, without any error
    wrong: list = field(default_factory=list)
    # pid -> {"samples": read there, "opened": handles opened there}
    processes: dict = field(default_factory=dict)

    @property
    def corrupted(self):
        """Samples that did not arrive intact: errors plus silently wrong bytes."""
        return len(self.errors) + len(self.wrong)

    def error_counts(self):
        """How many samples failed with each error kind."""
        return Counter(self.errors.values())

    def __str__(self):
        lines = [
            f"{self.samples:,} samples: {self.correct:,} correct, {len(self.errors):,} raised an "
            "error, "
            f"{len(self.wrong):,} silently wrong"
        ]
        lines += [f"  {count:>6,} × {kind}" for kind, count in self.error_counts().most_common()]
        return "\n".join(lines)


def audit_reads(dataset, checksums, *, num_workers=0, batch_size=8, **loader_kwargs):
    """Read every sample of ``dataset`` (its ``read_bytes``) through a ``DataLoader`` and compare
    each with ``checksums`` (SHA-256 hex per index, see ``expected_checksums``); return a
    ``ReadAudit``.

    ``loader_kwargs`` go to the ``DataLoader`` (e.g. ``multiprocessing_context="fork"``,
    ``worker_init_fn``). Per process, ``processes`` counts the samples read and the handles
    ``PerProcessHandle`` opened during the audit.
    """
    if len(checksums) != len(dataset):
        raise ValueError(f"{len(checksums)} checksums for {len(dataset)} samples")
    loader = DataLoader(
        _Fingerprints(dataset),
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=_as_list,
        **loader_kwargs,
    )
    audit = ReadAudit(samples=len(dataset))
    # workers start afresh; this process may not
    already_opened = {os.getpid(): opened_in_this_process()}
    batches = iter(loader)
    try:
        for batch in batches:
            for index, pid, opened, digest, error in batch:
                process = audit.processes.setdefault(pid, {"samples": 0, "opened": 0})
                process["samples"] += 1
                process["opened"] = max(process["opened"], opened - already_opened.get(pid, 0))
                if error:
                    audit.errors[index] = error
                elif digest != checksums[index]:
                    audit.wrong.append(index)
                else:
                    audit.correct += 1
    # e.g. a worker_init_fn raised: the loader's frames in the traceback hold
    except BaseException as error:
        # its workers, which later forks would inherit; let them go
        traceback.clear_frames(error.__traceback__)
        raise
    finally:
        del batches  # the last reference: the workers stop now
    return audit
