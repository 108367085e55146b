"""A server process started by ``childserver.ChildServer`` answers its address, or is stopped with
the reason it did not."""

import sys

import pytest

from packdata.childserver import ChildServer
from packdata.s3 import S3Server

# a child that prints a line of its own first, then its address, then waits to be told to stop
TALKATIVE = (
    "import sys; print('Starting a new Thread...', flush=True); "
    "print('listening 127.0.0.1 4242', flush=True); sys.stdin.readline(); print('stopped')"
)


def test_lines_before_the_address_are_passed_over():
    child = ChildServer([sys.executable, "-c", TALKATIVE], "talkative")
    assert child.start(timeout=30) == ("127.0.0.1", 4242)
    assert child.stop()


@pytest.mark.parametrize(
    ("code", "said"),
    [
        ("import sys; sys.exit(3)", "exit status 3"),
        ("import time; time.sleep(60)", "no address within 1 s"),
    ],
    ids=["ends first", "says nothing"],
)
def test_a_child_that_gives_no_address_is_stopped_and_named(code, said):
    child = ChildServer([sys.executable, "-c", code], "quiet")
    with pytest.raises(OSError, match=f"quiet could not start: {said}"):
        child.start(timeout=1)
    assert child.process is None


def test_an_s3_server_that_failed_to_start_can_start_again(monkeypatch):
    server = S3Server(export=False)
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(OSError, match="S3Server could not start: exit status 1"):
        server.start()
    monkeypatch.undo()
    with server.start():
        assert server.endpoint_url.startswith("http://127.0.0.1:")
