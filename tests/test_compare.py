"""compare: configurations take turns round by round, and a verdict needs rounds that do not
overlap."""

import multiprocessing

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from packdata import compare
from packdata.bench import SampleCountError


def test_runs_take_turns_after_a_warmup_and_before_runs_each_time():
    calls = []
    runs = {name: (lambda name=name: calls.append(name) or 10) for name in "ab"}
    comparison = compare.in_turn(runs, rounds=3, before=lambda: calls.append("-"))
    assert calls == ["a", "b"] + ["-", "a", "-", "b"] * 3
    assert [len(rates) for rates in comparison.rates.values()] == [3, 3]


def test_before_by_name_runs_only_before_the_runs_it_names():
    calls = []
    runs = {name: (lambda name=name: calls.append(name) or 1) for name in "ab"}
    compare.in_turn(runs, rounds=2, warmup=False, before={"b": lambda: calls.append("-")})
    assert calls == ["a", "-", "b"] * 2


def test_one_round_is_refused():
    with pytest.raises(ValueError, match="at least 2 rounds"):
        compare.in_turn({"a": lambda: 1}, rounds=1)


def test_verdict_only_when_the_rounds_do_not_overlap():
    comparison = compare.Comparison(
        {"fast": [200, 210, 190], "slow": [100, 110, 95], "close": [180, 215, 200]}
    )
    assert comparison.clearly("fast", "slow") == 1
    assert comparison.clearly("slow", "fast") == -1
    assert comparison.clearly("close", "fast") == 0
    assert comparison.verdict("fast", "slow").endswith(": faster")
    assert comparison.verdict("slow", "fast", slower="loses").endswith(": loses")
    assert comparison.verdict("close", "fast").endswith(compare.NO_CLEAR_DIFFERENCE)
    assert comparison.best() == "fast"


def test_alike_needs_overlapping_rounds_and_close_medians():
    comparison = compare.Comparison(
        {
            "a": [100, 80, 98],
            "b": [100, 100, 100],
            "c": [150, 160, 155],
            "d": [100, 125, 121],
            "e": [105, 104, 106],
        }
    )
    assert comparison.alike("a", "b", alike="same").endswith(
        "same (the rounds overlap, the medians are within 10%)"
    )
    assert comparison.alike("c", "b", unlike="costs more").endswith(": costs more")
    assert comparison.alike("d", "b").endswith("no clear verdict: the medians differ")
    assert comparison.alike("e", "b").endswith("no clear verdict: the rounds differ")


def test_ratio_is_of_the_medians_with_each_rounds_pair_as_its_spread():
    ratio = compare.Comparison({"a": [2, 4, 9], "b": [1, 1, 3]}).ratio("a", "b")
    assert (ratio.value, ratio.low, ratio.high) == (4, 2, 4)
    assert format(ratio, ".1f") == "4.0× (rounds 2.0× to 4.0×)"


class IterableNumbers(IterableDataset):
    def __init__(self, count):
        self.count = count

    def __iter__(self):
        return iter(torch.arange(self.count))


class Numbers(Dataset):
    def __init__(self, count, claimed):
        self.count, self.claimed = count, claimed

    def __len__(self):
        return self.claimed

    def __getitem__(self, index):
        if index >= self.count:
            raise IndexError(index)
        return torch.tensor(index)


def test_epochs_of_counts_every_sample_of_every_epoch():
    run = compare.epochs_of(Numbers(10, 10), batch_size=4)
    assert [run(), run()] == [10, 10]


def test_epochs_of_checks_a_stream_without_len_against_samples():
    stream = IterableNumbers(10)
    assert compare.epochs_of(stream, samples=10, batch_size=4)() == 10
    with pytest.raises(SampleCountError, match="delivered 10 samples but samples is 11"):
        compare.epochs_of(stream, samples=11, batch_size=4)()


def test_epochs_of_refuses_a_short_epoch():
    run = compare.epochs_of(Numbers(10, 12), batch_size=4, sampler=range(10))
    with pytest.raises(SampleCountError, match="delivered 10 samples but len"):
        run()


def test_in_turn_lets_the_workers_go_once_it_is_done():
    """Loaders measured in a lesson would otherwise keep their workers for the rest of it: under
    spawn or forkserver each holds a PyTorch of its own."""
    runs = {"1 worker": compare.epochs_of(Numbers(10, 10), batch_size=4, num_workers=1)}
    runs["1 worker"]()
    assert len(multiprocessing.active_children()) == 1
    compare.in_turn(runs, rounds=2, warmup=False)
    assert multiprocessing.active_children() == []
    assert runs["1 worker"]() == 10  # a later call starts new workers


def test_in_turn_lets_the_workers_go_when_a_run_fails():
    def fails():
        raise RuntimeError("a run that fails")

    runs = {"1 worker": compare.epochs_of(Numbers(10, 10), batch_size=4, num_workers=1)}
    runs["fails"] = fails
    with pytest.raises(RuntimeError, match="a run that fails"):
        compare.in_turn(runs, rounds=2)
    assert multiprocessing.active_children() == []


def test_a_long_verdict_breaks_between_its_parts_to_fit_a_slide():
    comparison = compare.Comparison({"x" * 40: [10, 11, 12], "y" * 30: [10, 11, 12]})
    verdict = comparison.verdict("x" * 40, "y" * 30)
    assert verdict.endswith(compare.NO_CLEAR_DIFFERENCE)
    assert max(map(len, verdict.splitlines())) <= 88 and verdict.count("\n") == 1
    short = compare.Comparison({"a": [1, 2, 3], "b": [1, 2, 3]}).verdict("a", "b")
    assert "\n" not in short
