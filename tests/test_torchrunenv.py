"""torchrunenv.environment: a rank's variables for a block, reaching the workers started in it."""

import multiprocessing
import os

import pytest
from torch.utils.data import DataLoader, Dataset

from packdata.torchrunenv import environment


class Rank(Dataset):
    """One sample: ``$RANK`` as the process that reads it sees it."""

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return os.environ.get("RANK", "unset")


def rank_in_worker():
    return next(iter(DataLoader(Rank(), batch_size=None, num_workers=1)))


@pytest.fixture
def default_start_method(request):
    """Make ``request.param`` the default start method for the test, then restore it."""
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(request.param, force=True)
    yield request.param
    multiprocessing.set_start_method(before, force=True)


def test_sets_the_variables_for_the_block_and_restores_them(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.delenv("RANK", raising=False)
    with environment(RANK=1, WORLD_SIZE=2):
        assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("1", "2")
    assert "RANK" not in os.environ
    assert os.environ["WORLD_SIZE"] == "8"


def test_a_start_method_not_chosen_yet_is_left_unchosen():
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(None, force=True)  # as in a fresh interpreter
    try:
        with environment(RANK=1, WORLD_SIZE=2):
            pass
        assert multiprocessing.get_start_method(allow_none=True) is None
    finally:
        multiprocessing.set_start_method(before, force=True)


@pytest.mark.parametrize("default_start_method", ["forkserver", "spawn"], indirect=True)
def test_workers_started_in_the_block_see_the_variables(default_start_method, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert rank_in_worker() == "unset"  # a forkserver, if any, starts here, before the block
    with environment(RANK=1):
        assert rank_in_worker() == "1"
    assert multiprocessing.get_start_method() == default_start_method
