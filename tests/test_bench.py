import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from packdata.bench import (
    BenchResult,
    SampleCountError,
    benchmark,
    epoch_rate,
    read_and_decode_us,
    results_table,
)
from packdata.datasets import FolderDataset


class Numbers(Dataset):
    """``n`` tiny samples and no ``sample_bytes``."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return torch.tensor([index])


class ShortStream(IterableDataset):
    """Claims ``claimed`` samples but yields ``actual``; unsharded, so every worker yields them
    all."""

    def __init__(self, claimed, actual):
        self.claimed, self.actual = claimed, actual

    def __len__(self):
        return self.claimed

    def __iter__(self):
        return iter(range(self.actual))


class Unsized(IterableDataset):
    """A stream that does not say how long it is."""

    def __iter__(self):
        return iter(range(3))


def test_counts_every_sample_of_every_epoch(tiny_dataset):
    dataset = FolderDataset(tiny_dataset)
    result = benchmark(dataset, batch_size=16, epochs=2, label="folder", progress=False)
    assert result.samples == 2 * len(dataset)
    assert len(result.epoch_seconds) == len(result.first_batch_seconds) == 2
    assert all(
        0 < first <= epoch for first, epoch in zip(result.first_batch_seconds, result.epoch_seconds)
    )
    assert result.seconds == pytest.approx(sum(result.epoch_seconds))
    assert result.samples_per_s == pytest.approx(result.samples / result.seconds)
    assert result.bytes_per_epoch == sum(dataset.sample_bytes)
    assert result.mb_per_s == pytest.approx(2 * result.bytes_per_epoch / result.seconds / 1e6)


class CountedNumbers(Numbers):
    """``Numbers`` that counts how often they are read (in the main process: use 0 workers)."""

    reads = 0

    def __getitem__(self, index):
        self.reads += 1
        return super().__getitem__(index)


def test_warmup_epochs_run_first_but_are_not_reported():
    dataset = CountedNumbers(10)
    result = benchmark(dataset, batch_size=4, epochs=2, warmup_epochs=1, progress=False)
    assert dataset.reads == 3 * len(dataset)
    assert result.samples == 2 * len(dataset) and result.epochs == 2
    assert len(result.epoch_seconds) == len(result.first_batch_seconds) == 2


def test_the_steady_rate_is_the_median_epoch_after_the_first():
    result = BenchResult(
        "r", batch_size=4, num_workers=0, epochs=4, samples=40, epoch_seconds=[9.0, 1.0, 2.0, 4.0]
    )
    assert result.steady_samples_per_s == pytest.approx(10 / 2.0)
    with pytest.raises(ValueError, match="r: a steady rate needs at least 2 epochs"):
        _ = BenchResult(
            "r", batch_size=4, num_workers=0, epochs=1, samples=10, epoch_seconds=[1.0]
        ).steady_samples_per_s


def test_warmup_epochs_are_counted_too():
    with pytest.raises(SampleCountError, match="epoch 1 delivered 90"):
        benchmark(
            ShortStream(claimed=100, actual=90), batch_size=8, warmup_epochs=1, progress=False
        )


def test_counts_with_workers_and_are_repeatable(tiny_dataset):
    dataset = FolderDataset(tiny_dataset)
    runs = [benchmark(dataset, batch_size=16, num_workers=2, progress=False) for _ in range(2)]
    assert [run.samples for run in runs] == [len(dataset)] * 2
    assert runs[0].num_workers == 2 and runs[0].batch_size == 16


def test_bytes_per_epoch_argument_and_unknown_bytes():
    assert benchmark(Numbers(10), batch_size=4, progress=False).mb_per_s is None
    result = benchmark(Numbers(10), batch_size=4, progress=False, bytes_per_epoch=5_000_000)
    assert result.mb_per_s == pytest.approx(5 / result.seconds)


def test_a_dataset_whose_length_lies_fails_loudly():
    with pytest.raises(SampleCountError, match="delivered 90 samples but len\\(dataset\\) is 100"):
        benchmark(ShortStream(claimed=100, actual=90), batch_size=8, progress=False)


def test_duplicates_from_unsharded_workers_fail_loudly():
    with pytest.raises(SampleCountError, match="delivered 40 samples"):
        benchmark(ShortStream(claimed=20, actual=20), batch_size=8, num_workers=2, progress=False)


def test_a_dataset_without_length_is_refused():
    with pytest.raises(TypeError, match="no __len__"):
        benchmark(Unsized(), progress=False)


def test_epoch_rate_times_epochs_of_the_same_loader_and_counts_them():
    loader = DataLoader(Numbers(40), batch_size=8)
    assert epoch_rate(loader) > 0 and epoch_rate(loader) > 0
    with pytest.raises(SampleCountError, match="delivered 90 samples but len\\(dataset\\) is 100"):
        epoch_rate(DataLoader(ShortStream(claimed=100, actual=90), batch_size=8))


def test_dropped_samples_fail_loudly():
    with pytest.raises(SampleCountError):
        benchmark(Numbers(10), batch_size=4, drop_last=True, progress=False)


def test_tables_show_every_result():
    results = [
        BenchResult("plain <a>", 64, 0, 1, 100, [0.5], [0.1], 10**6),
        BenchResult("two", 64, 2, 1, 100, [0.25], [0.2]),
    ]
    text = str(results_table(results))
    assert len(text.splitlines()) == 3
    assert "plain <a>" in text and "400" in text and "2.0" in text
    page = results_table(results)._repr_html_()
    assert page.count("<tr>") == 3 and "plain &lt;a&gt;" in page
    assert "plain <a>" in repr(results[0]) and "<table>" in results[0]._repr_html_()


def test_at_least_one_epoch_is_asked_for(tiny_dataset):
    with pytest.raises(ValueError, match="epochs must be at least 1"):
        benchmark(FolderDataset(tiny_dataset), epochs=0, progress=False)
    with pytest.raises(ValueError, match="warmup_epochs 0 or more, got 2 and -1"):
        benchmark(FolderDataset(tiny_dataset), epochs=2, warmup_epochs=-1, progress=False)


def test_read_and_decode_are_timed_apart_on_the_samples_asked_for(tiny_dataset):
    class Counting(FolderDataset):
        reads = 0

        def read_bytes(self, index):
            Counting.reads += 1
            return super().read_bytes(index)

    read_us, decode_us = read_and_decode_us(Counting(tiny_dataset), np.random.default_rng(0), 7)
    assert Counting.reads == 7
    assert read_us > 0 and decode_us > 0
