"""A bounded fuzz of both servers on loopback: random methods, paths, headers and bodies.

Every request must get an answer with a status below 500 (a malformed one a 400 with its reason),
the server must print no traceback, and nothing outside the served root may change. Bodies are
never shorter than the Content-Length they declare: a client that stops sending part-way is the
one case where the server waits, then hangs up, by design."""

import contextlib
import http.client
import random
import socket
import time
import urllib.parse

import pytest

from packdata.netstore import NetworkStore
from packdata.service import DatasetClient, DatasetService

REQUESTS, SECONDS = 3000, 30
METHODS = ["GET", "HEAD", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "TRACE", "GE T", "PUT\t"]
NAMES = ["d", "f", "x" * 255, "x" * 256, ".hidden", "..", ".", "a b", "é", "%2e%2e", "out", "in"]
LENGTHS = ["0", "5", "-1", "²", "1e3", " 7 ", "+5", "0x10", "99999999999999999999", "", "٣"]
RANGES = ["bytes=0-1", "bytes=-5", "bytes=5-", "bytes=9-1", "bytes=0-99999999999", "items=0-1", ""]


def random_path(rng):
    parts = [rng.choice(NAMES) for _ in range(rng.randint(0, 3))]
    path = "/" + "/".join(["datasets", *parts] if rng.random() < 0.8 else parts)
    if rng.random() < 0.1:
        path += "?q=" + rng.choice(NAMES)
    if rng.random() < 0.05:
        path = "/" + "A" * rng.choice([1000, 9000])
    return urllib.parse.quote(path, safe="/?=%")


def random_request(rng):
    """The bytes of one request, and whether its body is whole (it always is, see above)."""
    body = rng.randbytes(rng.choice([0, 0, 3, 5, 100, 4000]))
    if rng.random() < 0.3:
        body = b'{"name": "' + rng.choice(NAMES).encode() + b'"}'
    headers = [("Host", "fuzz")]
    if rng.random() < 0.8:
        headers.append(("Content-Length", str(len(body))))
    if rng.random() < 0.3:
        for _ in range(rng.randint(1, 2)):
            value = rng.choice(LENGTHS)
            numeric = value.strip().isascii() and value.strip().isdigit()
            if not numeric or int(value) <= len(body):  # never declare more than is sent
                headers.append(("Content-Length", value))
    if rng.random() < 0.2:
        headers.append(("Range", rng.choice(RANGES)))
    if rng.random() < 0.1:
        headers.append(("Transfer-Encoding", rng.choice(["chunked", "gzip", "x"])))
    if rng.random() < 0.1:
        headers.append(("If-Match", rng.choice(['"1-2"', "W/x", "*", ""])))
    head = f"{rng.choice(METHODS)} {random_path(rng)} HTTP/1.1\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers) + "Connection: close\r\n\r\n"
    return head.encode("utf-8", "surrogateescape") + body


def status_of(url, request):
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        # it may answer (a 413, say) and hang up before the body is all sent
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ")[1]) if answer.startswith(b"HTTP/1.") else None


@pytest.fixture
def root_with_a_way_out(tmp_path):
    (tmp_path / "secret.txt").write_text("not to be served")
    (tmp_path / "outside").mkdir()
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"0123456789")
    (root / "d" / "out").symlink_to(tmp_path / "secret.txt")
    (root / "out").symlink_to(tmp_path / "outside")
    return tmp_path, root


def snapshot(folder, root):
    return {
        path: (path.stat().st_mtime_ns, path.stat().st_size)
        for path in folder.rglob("*")
        if not path.is_relative_to(root)
    }


@pytest.mark.parametrize("server", [DatasetService, NetworkStore])
def test_malformed_requests_get_an_answer_and_touch_nothing_outside(
    root_with_a_way_out, server, capfd
):
    folder, root = root_with_a_way_out
    before, rng, started, statuses = snapshot(folder, root), random.Random(0), time.monotonic(), []
    with server(root) as running:
        for _ in range(REQUESTS):
            if time.monotonic() - started > SECONDS:
                break
            request = random_request(rng)
            status = status_of(running.url, request)
            assert status is not None and status < 500, (status, request[:300])
            statuses.append(status)
    assert "Traceback" not in capfd.readouterr().err  # the server process's too
    assert snapshot(folder, root) == before
    assert len(statuses) >= 300 and len(set(statuses)) > 3  # it ran, and it met many cases


def test_a_255_character_name_works_end_to_end(tmp_path):
    with DatasetService(tmp_path) as running:
        client = DatasetClient(running.url)
        client.create("d")
        client.upload("d", "n" * 255, b"payload")
        assert client.download("d", "n" * 255) == b"payload"


@pytest.mark.parametrize(
    "lengths, status",
    [(["²"], 400), (["5", "6"], 400), (["5", "5"], 400), (["-1"], 400), ([], 411)],
)
def test_a_content_length_that_is_not_one_number_is_refused(tmp_path, lengths, status):
    with DatasetService(tmp_path) as running:
        DatasetClient(running.url).create("d")
        parts = urllib.parse.urlsplit(running.url)
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        connection.putrequest("PUT", "/datasets/d/f")
        for value in lengths:
            connection.putheader("Content-Length", value.encode())
        connection.endheaders(b"12345")
        response = connection.getresponse()
        assert response.status == status and b'"error"' in response.read()
        connection.close()


def test_the_service_refuses_a_link_out_of_its_root(root_with_a_way_out):
    _, root = root_with_a_way_out
    with DatasetService(root) as running:
        parts = urllib.parse.urlsplit(running.url)
        for path in ("/datasets/d/out", "/datasets/out", "/datasets/out/secret.txt"):
            connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
            connection.request("GET", path)
            assert connection.getresponse().status in (403, 404)
            connection.close()
