"""The dataset store service: its JSON API, its refusals, and many clients at once."""

import http.client
import json
import socket
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

from packdata import service as service_module
from packdata.service import DatasetClient, DatasetService, ServiceError, is_valid_name


@pytest.fixture
def service(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    with DatasetService(root, max_upload=10_000) as running:
        yield running


@pytest.fixture
def client(service):
    return DatasetClient(service.url)


def raw(service, method, path, body=None, headers=None):
    """``(status, headers, body)`` of one request on a fresh connection, path sent exactly as
    given."""
    parts = urllib.parse.urlsplit(service.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_create_upload_list_download_round_trip(service, client):
    assert client.datasets() == []
    client.create("shapes")
    url = client.upload("shapes", "a.bin", b"hello world")
    client.upload("shapes", "b.bin", bytes(300))
    assert url == f"{service.url}datasets/shapes/a.bin"
    assert client.datasets() == [{"name": "shapes", "files": 2, "bytes": 311}]
    assert client.files("shapes") == [
        {"name": "a.bin", "bytes": 11},
        {"name": "b.bin", "bytes": 300},
    ]
    assert client.download("shapes", "a.bin") == b"hello world"
    assert (service.root / "shapes" / "a.bin").read_bytes() == b"hello world"


def test_upload_from_a_path_and_download_to_a_path(client, tmp_path):
    source, target = tmp_path / "source.tar", tmp_path / "copy" / "target.tar"
    source.write_bytes(bytes(range(256)) * 20)
    client.create("d")
    client.upload("d", "x.tar", source)
    assert client.download("d", "x.tar", to=target) == target
    assert target.read_bytes() == source.read_bytes()


def test_answers_are_json_with_the_right_status_and_location(service):
    status, headers, body = raw(service, "POST", "/datasets", json.dumps({"name": "d"}))
    assert (status, headers["Location"], json.loads(body)) == (
        201,
        "/datasets/d",
        {"name": "d", "files": []},
    )
    status, headers, body = raw(service, "PUT", "/datasets/d/f.txt", b"abc")
    assert status == 201 and json.loads(body) == {"name": "f.txt", "bytes": 3}
    status, _, _ = raw(service, "PUT", "/datasets/d/f.txt", b"abcd")
    assert status == 200  # replaced
    status, headers, body = raw(service, "GET", "/datasets/d")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"name": "d", "files": [{"name": "f.txt", "bytes": 4}]}


@pytest.mark.parametrize(
    "header, status, wanted",
    [("bytes=2-5", 206, b"2345"), ("bytes=-3", 206, b"789"), (None, 200, b"0123456789")],
)
def test_downloads_honour_range(service, client, header, status, wanted):
    client.create("d")
    client.upload("d", "digits", b"0123456789")
    got_status, headers, body = raw(
        service, "GET", "/datasets/d/digits", headers={"Range": header} if header else {}
    )
    assert (got_status, body) == (status, wanted)
    assert headers["Accept-Ranges"] == "bytes"


def test_head_gives_the_size_only(service, client):
    client.create("d")
    client.upload("d", "f", bytes(1234))
    status, headers, body = raw(service, "HEAD", "/datasets/d/f")
    assert (status, headers["Content-Length"], body) == (200, "1234", b"")


def test_creating_an_existing_dataset_is_409(client):
    client.create("d")
    with pytest.raises(ServiceError, match="exists") as error:
        client.create("d")
    assert error.value.status == 409
    client.create("d", exist_ok=True)


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/datasets/nope"),
        ("GET", "/datasets/nope/f"),
        ("PUT", "/datasets/nope/f"),
        ("GET", "/datasets/d/missing"),
        ("GET", "/elsewhere"),
    ],
)
def test_missing_things_are_404_with_a_json_reason(service, client, method, path):
    client.create("d")
    status, headers, body = raw(service, method, path, b"x" if method == "PUT" else None)
    assert status == 404 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["error"]


BAD_PATHS = [
    "/datasets/..",
    "/datasets/d/..",
    "/datasets/d/%2e%2e",
    "/datasets/%2e%2e/etc",
    "/datasets/d/..%2f..%2fescape",
    "/datasets/d/a%2Fb",
    "/datasets//etc",
    "/datasets/d//x",
    "/datasets/d/sub/deeper",
    "/datasets/d/x%00y",
    "/datasets/d/.hidden",
    "/datasets/d/%2Fetc%2Fpasswd",
    "/datasets/d/a%5Cb",
]


@pytest.mark.parametrize("path", BAD_PATHS)
@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_bad_names_are_refused_and_nothing_escapes_the_root(
    service, client, tmp_path, method, path
):
    client.create("d")
    (tmp_path / "secret").write_text("outside")
    status, _, body = raw(service, method, path, b"payload" if method == "PUT" else None)
    assert status == 400, body
    assert "not a valid name" in json.loads(body)["error"] or "deeper" in json.loads(body)["error"]
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert files == ["secret", "served", "served/d"]


@pytest.mark.parametrize(
    "name", ["", ".", "..", "../x", "/abs", "a/b", "a\x00b", ".hidden", "x" * 256, 42, None]
)
def test_bad_dataset_names_are_refused_at_creation(service, client, name):
    assert not is_valid_name(name)
    with pytest.raises(ServiceError) as error:
        client.create(name) if isinstance(name, str) and "/" not in name else raw_create(
            service, name
        )
    assert error.value.status == 400
    assert list(service.root.iterdir()) == []


def raw_create(service, name):
    status, _, body = raw(service, "POST", "/datasets", json.dumps({"name": name}))
    raise ServiceError(status, body.decode())


def test_a_body_that_is_not_json_is_400(service):
    status, _, body = raw(service, "POST", "/datasets", b"{not json")
    assert status == 400 and "not JSON" in json.loads(body)["error"]


@pytest.mark.parametrize("headers", [b"Transfer-Encoding: chunked\r\n", b""])
def test_an_upload_without_a_length_is_411(service, client, headers):
    client.create("d")
    parts = urllib.parse.urlsplit(service.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(b"PUT /datasets/d/f HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        assert sock.recv(100).split(b" ")[1] == b"411"
    assert client.files("d") == []


def test_an_upload_over_the_limit_is_413_and_not_stored(service, client):
    client.create("d")
    with pytest.raises(ServiceError, match="more than this server accepts") as error:
        client.upload("d", "big", bytes(service.max_upload + 1))
    assert error.value.status == 413
    status, _, _ = raw(service, "PUT", "/datasets/d/huge", headers={"Content-Length": str(10**12)})
    assert status == 413
    client.upload("d", "fits", bytes(service.max_upload))  # the same client goes on working
    assert [f["name"] for f in client.files("d")] == ["fits"]


def test_an_interrupted_upload_leaves_nothing_behind(service, client):
    client.create("d")
    client.upload("d", "f", b"old contents")
    parts = urllib.parse.urlsplit(service.url)
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.sendall(
            b"PUT /datasets/d/f HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + bytes(1000)
        )
        sock.shutdown(socket.SHUT_WR)  # the client gives up after 1,000 of 5,000 bytes
        sock.recv(1000)
    deadline = time.monotonic() + 5
    while len(list((service.root / "d").iterdir())) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [p.name for p in (service.root / "d").iterdir()] == ["f"]  # no temporary file left
    # the old file was not replaced by a partial one
    assert client.download("d", "f") == b"old contents"


def test_listings_hide_uploads_in_progress(service, client):
    client.create("d")
    (service.root / "d" / ".f.partial-abc").write_bytes(b"half")
    assert client.files("d") == []
    status, _, _ = raw(service, "GET", "/datasets/d/.f.partial-abc")
    assert status == 400


def test_listings_leave_out_links_that_lead_outside_the_store(service, client, tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret")
    client.create("d")
    (service.root / "d" / "secret.txt").symlink_to(tmp_path / "outside" / "secret.txt")
    (service.root / "out").symlink_to(tmp_path / "outside")
    assert client.files("d") == []
    assert [dataset["name"] for dataset in client.datasets()] == ["d"]
    assert raw(service, "GET", "/datasets/d/secret.txt")[0] == 403


def test_a_method_the_service_lacks_is_405_with_the_methods_it_has(service):
    status, headers, _ = raw(service, "DELETE", "/datasets")
    assert (status, headers["Allow"]) == (405, "GET, HEAD, POST, PUT")


def test_binds_to_loopback_by_default(service):
    assert urllib.parse.urlsplit(service.url).hostname == "127.0.0.1"


def test_concurrent_uploads_and_downloads(client):
    client.create("d")
    payloads = {f"file-{i:03d}.bin": bytes([i]) * (100 + 37 * i) for i in range(40)}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda item: client.upload("d", *item), payloads.items()))
        downloaded = dict(
            zip(payloads, pool.map(lambda name: client.download("d", name), payloads))
        )
        creations = list(pool.map(lambda i: try_create(client, "race"), range(8)))
    assert downloaded == payloads
    assert {f["name"]: f["bytes"] for f in client.files("d")} == {
        n: len(b) for n, b in payloads.items()
    }
    assert sorted(creations) == [201] + [409] * 7  # exactly one of eight racing creators wins


def try_create(client, name):
    try:
        client.create(name)
        return 201
    except ServiceError as error:
        return error.status


def test_every_request_waits_the_latency_in_parallel(tmp_path):
    with DatasetService(tmp_path, latency=0.2) as service:
        client = DatasetClient(service.url)
        started = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: client.datasets(), range(4)))
        elapsed = time.perf_counter() - started
    assert 0.2 <= elapsed < 0.2 * 4
    assert service.requests == 4


def test_a_refused_upload_does_not_poison_the_next_request(client):
    client.create("d")
    with pytest.raises(ServiceError, match="not a valid name"):
        client.upload("d", "../x", b"a body the server never reads")
    with pytest.raises(ServiceError, match="no dataset"):
        client.upload("missing", "x", b"another unread body")
    # the same keep-alive client goes on
    assert client.datasets() == [{"name": "d", "files": 0, "bytes": 0}]


class _HangsUpInsteadOfAnsweringPost(service_module._ServiceHandler):
    def send_json(self, status, document, headers=None):
        if self.command != "POST":
            return super().send_json(status, document, headers)
        self.close_connection = True  # the dataset exists now, but its answer is lost on the way


class LossyService(DatasetService):
    """A service whose answers to POST never arrive: the connection drops after the work is done."""

    handler = _HangsUpInsteadOfAnsweringPost


def test_a_create_whose_answer_is_lost_is_not_sent_again(tmp_path):
    with LossyService(tmp_path, process=False) as service:  # its handler lives in this file
        client = DatasetClient(service.url)
        with pytest.raises(ConnectionError, match=f"POST {service.url}datasets failed"):
            client.create("d")
        assert service.requests == 1
        assert client.datasets() == [{"name": "d", "files": 0, "bytes": 0}]


def test_a_create_after_the_service_dropped_an_idle_connection(tmp_path, monkeypatch):
    # hang up on clients idle for 0.1 s
    monkeypatch.setattr(service_module._ServiceHandler, "timeout", 0.1)
    with DatasetService(tmp_path, process=False) as service:  # patched here: served from here
        client = DatasetClient(service.url)
        client.datasets()
        time.sleep(0.5)
        client.create("d")
        assert client.datasets() == [{"name": "d", "files": 0, "bytes": 0}]


def test_a_file_upload_after_the_service_dropped_an_idle_connection(tmp_path, monkeypatch):
    """A body read from a file cannot be sent twice, so it goes out on a fresh connection."""
    monkeypatch.setattr(service_module._ServiceHandler, "timeout", 0.1)
    source = tmp_path / "shard.tar"
    source.write_bytes(b"x" * 1000)
    (tmp_path / "served").mkdir()
    with DatasetService(tmp_path / "served", process=False) as service:
        client = DatasetClient(service.url)
        client.create("d")
        time.sleep(0.5)
        client.upload("d", "shard.tar", source)
        assert (service.root / "d" / "shard.tar").read_bytes() == source.read_bytes()
