"""ReadAhead: reads in order, one thread ahead; errors come back to the reader; closing stops it."""

import threading
import time

import pytest

from packdata.readahead import ReadAhead, fetched_ahead


def test_each_item_is_read_once_in_order_and_ahead_of_its_use():
    started = []

    def read(item):
        started.append(item)
        return item * 10

    reads = ReadAhead(range(5), read, ahead=2)
    assert reads(0) == 0
    time.sleep(0.05)
    assert started[:3] == [0, 1, 2]  # two read ahead while item 0 is used
    assert [reads(item) for item in range(1, 5)] == [10, 20, 30, 40]
    assert started == [0, 1, 2, 3, 4]
    reads.close()


def test_an_error_is_raised_when_its_item_is_asked_for_and_the_next_ones_still_come():
    def read(item):
        if item == 1:
            raise OSError(f"shard {item} is missing")
        return item

    reads = ReadAhead([0, 1, 2], read)
    assert reads(0) == 0
    with pytest.raises(OSError, match="shard 1 is missing"):
        reads(1)
    assert reads(2) == 2


def test_asking_out_of_order_names_both_items():
    reads = ReadAhead(["a", "b"], str.upper)
    with pytest.raises(RuntimeError, match="asked for b, and the read-ahead order has a next"):
        reads("b")


def test_closing_early_cancels_what_is_queued():
    release, started = threading.Event(), []

    def read(item):
        started.append(item)
        release.wait(5)
        return item

    fetched = fetched_ahead(read, range(100), ahead=3)
    item, future = next(fetched)
    fetched.close()
    release.set()
    assert future.result() == 0
    time.sleep(0.05)
    assert started == [0]  # the queued reads of 1, 2, 3 never ran


def test_closing_early_hands_back_what_was_read_ahead_and_never_taken():
    read_last, handed_back = threading.Event(), []

    def read(item):
        if item == 2:
            read_last.set()
        return item * 10

    fetched = fetched_ahead(read, range(3), ahead=2, unused=handed_back.append)
    item, future = next(fetched)
    assert read_last.wait(5)
    fetched.close()
    deadline = time.monotonic() + 5
    while len(handed_back) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert future.result() == 0 and sorted(handed_back) == [10, 20]  # the taken one is the taker's
