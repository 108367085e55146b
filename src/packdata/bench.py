"""Measure one DataLoader configuration: wall time, time to first batch, samples/s and MB/s.

Every sample of every epoch is counted; a count that differs from ``len(dataset) * epochs``
(a lying ``__len__``, an unsharded iterable dataset duplicated by workers, ``drop_last``)
raises ``SampleCountError`` instead of producing a flattering number.
"""

import html
import statistics
import time
from dataclasses import dataclass, field

from torch.utils.data import DataLoader, IterableDataset
from tqdm.auto import tqdm

from .images import decode_image

COLUMNS = (
    # heading, BenchResult attribute, format
    ("label", "label", "{}"),
    ("workers", "num_workers", "{}"),
    ("batch", "batch_size", "{}"),
    ("epochs", "epochs", "{}"),
    ("samples", "samples", "{:,}"),
    ("seconds", "seconds", "{:.2f}"),
    ("first batch s", "first_batch_s", "{:.3f}"),
    ("samples/s", "samples_per_s", "{:,.0f}"),
    ("MB/s", "mb_per_s", "{:.1f}"),
)


class SampleCountError(RuntimeError):
    """The loader delivered a different number of samples than the dataset's length promised."""


@dataclass
class BenchResult:
    """One measured configuration; the summary properties cover all epochs together."""

    label: str
    batch_size: int
    num_workers: int
    epochs: int
    samples: int
    epoch_seconds: list = field(default_factory=list)
    first_batch_seconds: list = field(default_factory=list)
    bytes_per_epoch: int | None = None

    @property
    def seconds(self):
        """Wall time of all epochs."""
        return sum(self.epoch_seconds)

    @property
    def first_batch_s(self):
        """Mean time from starting an epoch to its first batch (worker start-up shows here)."""
        return sum(self.first_batch_seconds) / len(self.first_batch_seconds)

    @property
    def samples_per_s(self):
        return self.samples / self.seconds

    @property
    def steady_samples_per_s(self):
        """Samples/s in a typical epoch after the first (the median of the others), leaving out
        filling caches, and starting the workers when they stay (``persistent_workers=True``;
        otherwise every epoch starts them again); needs ``epochs >= 2``."""
        if self.epochs < 2:
            raise ValueError(
                f"{self.label}: a steady rate needs at least 2 epochs, got {self.epochs}"
            )
        return self.samples / self.epochs / statistics.median(self.epoch_seconds[1:])

    @property
    def mb_per_s(self):
        """Encoded megabytes (10**6 bytes) per second, or None when the byte count is unknown."""
        if self.bytes_per_epoch is None:
            return None
        return self.bytes_per_epoch * self.epochs / self.seconds / 1e6

    def __repr__(self):
        return str(results_table([self]))

    def _repr_html_(self):
        return results_table([self])._repr_html_()


class ResultsTable:
    """Benchmark results side by side: plain text for ``print``, HTML for notebooks."""

    def __init__(self, results):
        self.results = list(results)

    def rows(self):
        """The table's cells as strings, heading first."""
        yield [heading for heading, _, _ in COLUMNS]
        for result in self.results:
            yield [_cell(getattr(result, name), spec) for _, name, spec in COLUMNS]

    def __str__(self):
        rows = list(self.rows())
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
        lines = (
            [row[0].ljust(widths[0])]
            + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
            for row in rows
        )  # the label left-aligned, numbers right-aligned
        return "\n".join("  ".join(line) for line in lines)

    __repr__ = __str__

    def _repr_html_(self):
        heading, *body = self.rows()
        head = "".join(f"<th>{html.escape(cell)}</th>" for cell in heading)
        lines = ("".join(f"<td>{html.escape(cell)}</td>" for cell in row) for row in body)
        rows = "".join(f"<tr>{line}</tr>" for line in lines)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _cell(value, spec):
    return "–" if value is None else spec.format(value)


def results_table(results):
    """A ``ResultsTable`` of ``results`` for side-by-side comparison."""
    return ResultsTable(results)


def count_samples(batch):
    """How many samples a collated batch holds: the length of its first field (or of the batch
    itself)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    elif isinstance(batch, (list, tuple)):
        batch = batch[0]
    return len(batch)


def epoch_rate(loader):
    """Samples/s of one epoch of ``loader``, every sample counted against ``len(loader.dataset)``.
    Several calls on one loader with ``persistent_workers=True`` time the same workers."""
    started = time.perf_counter()
    seen = sum(count_samples(batch) for batch in loader)
    seconds = time.perf_counter() - started
    if seen != len(loader.dataset):
        raise SampleCountError(
            f"an epoch delivered {seen} samples but len(dataset) is {len(loader.dataset)}"
        )
    return seen / seconds


def run_epoch(loader, bar):
    """One pass over ``loader``: ``(samples seen, seconds to first batch, seconds for the
    epoch)``."""
    started = time.perf_counter()
    seen, first_batch_s = 0, None
    for batch in loader:
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - started
        samples = count_samples(batch)
        seen += samples
        bar.update(samples)
    epoch_s = time.perf_counter() - started
    return seen, (epoch_s if first_batch_s is None else first_batch_s), epoch_s


def benchmark(
    dataset,
    *,
    batch_size=64,
    num_workers=0,
    epochs=1,
    warmup_epochs=0,
    shuffle=True,
    label=None,
    progress=True,
    bytes_per_epoch=None,
    **loader_kwargs,
):
    """Run ``epochs`` full passes of a ``DataLoader`` over ``dataset`` and return a ``BenchResult``.

    ``warmup_epochs`` untimed passes come first, on the same loader: caches fill, connections open,
    and with ``persistent_workers=True`` the workers are already running when the timed epochs
    start. Their samples are counted too, but not reported. ``loader_kwargs`` go to the
    ``DataLoader`` (e.g. ``multiprocessing_context="spawn"``, ``prefetch_factor``); workers are
    started afresh each epoch unless ``persistent_workers=True`` is passed. ``shuffle`` applies to
    map-style datasets; an iterable dataset shuffles itself. The byte count for MB/s comes from
    ``bytes_per_epoch`` or else from ``dataset.sample_bytes`` when the dataset has it.
    """
    if epochs < 1 or warmup_epochs < 0:
        raise ValueError(
            f"epochs must be at least 1 and warmup_epochs 0 or more, got {epochs} and "
            f"{warmup_epochs}"
        )
    try:
        expected = len(dataset)
    except TypeError:
        raise TypeError(
            f"{type(dataset).__name__} has no __len__: the benchmark needs it to check every sample"
            " arrived"
        ) from None
    if bytes_per_epoch is None and hasattr(dataset, "sample_bytes"):
        bytes_per_epoch = sum(dataset.sample_bytes)
    label = label or f"{type(dataset).__name__}, {num_workers} workers"
    shuffle = shuffle and not isinstance(dataset, IterableDataset)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=num_workers,
        **{"persistent_workers": False, **loader_kwargs},
    )
    result = BenchResult(
        label, batch_size, num_workers, epochs, samples=0, bytes_per_epoch=bytes_per_epoch
    )
    total = expected * (warmup_epochs + epochs)
    with tqdm(total=total, desc=label, unit="img", disable=not progress, leave=False) as bar:
        for epoch in range(warmup_epochs + epochs):
            seen, first_batch_s, epoch_s = run_epoch(loader, bar)
            if seen != expected:
                raise SampleCountError(
                    f"{label}: epoch {epoch + 1} delivered {seen} samples but len(dataset) is "
                    f"{expected}; "
                    "check __len__, drop_last, the sampler, or how an iterable dataset splits work "
                    "between workers"
                )
            if epoch < warmup_epochs:
                continue
            result.samples += seen
            result.first_batch_seconds.append(first_batch_s)
            result.epoch_seconds.append(epoch_s)
    return result


def read_and_decode_us(dataset, rng, count=300):
    """Microseconds per sample to read ``count`` random samples' bytes (``dataset.read_bytes``)
    and, apart from that, to decode them: ``(read_us, decode_us)``. The cache is as it finds it."""
    picked = rng.permutation(len(dataset))[:count].tolist()
    started = time.perf_counter()
    payloads = [dataset.read_bytes(index) for index in picked]
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    for payload in payloads:
        decode_image(payload)
    decode_s = time.perf_counter() - started
    return read_s / len(picked) * 1e6, decode_s / len(picked) * 1e6
