"""The data wait of a training loop, measured: a slow loader shows as waiting, a slow step as
computing."""

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from packdata import datawait
from packdata.datawait import required_rate, time_steps


class Slow(Dataset):
    """Eight samples, each ``seconds`` to load."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __len__(self):
        return 8

    def __getitem__(self, index):
        time.sleep(self.seconds)
        return index


@pytest.mark.parametrize("load, compute, share", [(0.02, 0.0, 1.0), (0.0, 0.02, 0.0)])
def test_the_wait_and_the_step_are_told_apart(load, compute, share):
    times = time_steps(DataLoader(Slow(load), batch_size=2), lambda batch: time.sleep(compute))
    assert len(times.wait) == len(times.compute) == 4
    assert times.wait_share == pytest.approx(share, abs=0.25)
    assert "4 steps: waiting" in str(times)


def test_steps_stop_where_asked():
    assert len(time_steps(DataLoader(Slow(0), batch_size=1), lambda batch: None, steps=3).wait) == 3


def test_the_rate_a_loader_must_deliver():
    assert required_rate(steps_per_s=10, batch_size=256, bytes_per_sample=110e3) == (
        2560,
        pytest.approx(281.6),
    )


def test_the_first_steps_can_be_left_out():
    times = time_steps(DataLoader(Slow(0), batch_size=1), lambda batch: None)
    assert len(times.after(3).wait) == len(times.after(3).compute) == 5


def test_copy_seconds_needs_a_gpu_and_says_so():
    with pytest.raises(ValueError, match="CUDA device, not to cpu"):
        datawait.copy_seconds("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_copy_seconds_times_each_way_on_a_gpu():
    seconds = datawait.copy_seconds("cuda", (4, 3, 8, 8), repeats=2)
    assert list(seconds) == ["pageable", "pinned", "pinned, non_blocking"]
    assert all(value > 0 for value in seconds.values())
