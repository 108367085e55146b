"""The HTTP client against servers that answer wrongly: a real server on loopback that sends what
each test scripts, byte for byte. A part of another place or of another version is refused, and so
is a redirect where the dataset service's answer was expected."""

import os
import signal
import socket
import threading
import warnings

import pytest

from packdata.httpclient import FileChangedError, HttpClient
from packdata.netstore import NetworkStore
from packdata.service import DatasetClient, ServiceError


class Scripted:
    """A server on 127.0.0.1 that answers each request with the next of ``answers`` (raw bytes)."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/"
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        with self.listener:
            while self.answers:
                connection, _ = self.listener.accept()
                with connection:
                    request = b""
                    while b"\r\n\r\n" not in request:
                        request += connection.recv(65536)
                    connection.sendall(self.answers.pop(0))


def answer(status, headers, body=b""):
    lines = [f"HTTP/1.1 {status}", *[f"{k}: {v}" for k, v in headers.items()]]
    lines.append(f"Content-Length: {len(body)}\r\nConnection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_a_part_of_another_place_is_refused_naming_url_and_offset():
    part = answer("206 Partial Content", {"Content-Range": "bytes 0-9/1024"}, bytes(10))
    server = Scripted([part])
    with pytest.raises(OSError, match=r"a\.tar: asked for bytes from offset 100, .*bytes 0-9/1024"):
        HttpClient(server.url).get_range("a.tar", 100, 10)


def test_a_part_labelled_with_another_version_is_refused():
    # a proxy that ignores If-Match still says which version it sends
    headers = {"Content-Range": "bytes 100-109/1024", "ETag": '"v2"'}
    server = Scripted([answer("206 Partial Content", headers, b"B" * 10)])
    with pytest.raises(FileChangedError, match='it was version "v1", the server sent "v2"'):
        HttpClient(server.url).get_range("a.tar", 100, 10, etag='"v1"')


def test_the_service_client_refuses_a_redirect_instead_of_storing_its_page():
    moved = answer("302 Found", {"Location": "http://elsewhere/a.tar"}, b"<html>moved</html>")
    server = Scripted([moved])
    with pytest.raises(ServiceError, match="HTTP 302: .*redirected to http://elsewhere/a.tar"):
        DatasetClient(server.url).download("d", "a.tar")


def test_stopping_a_store_whose_process_was_killed_says_so(tmp_path):
    store = NetworkStore(tmp_path, latency=0).start()
    child = store._child.process
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.stop()
    assert [str(w.message) for w in caught] == [
        "the NetworkStore process had ended already (exit status -9)"
    ]
