import http.client
import os
import threading
import time
import urllib.parse
import urllib.request

import pytest

from packdata.atomic import written_atomically
from packdata.imagefolder import load_manifest
from packdata.netstore import NetworkStore

SLACK = 1.0  # seconds a loaded CI machine may add to a request: only absurd delays fail


def get(store, path, headers=None, method="GET"):
    """``(status, headers, body)`` of one request, with ``path`` sent exactly as written."""
    parts = urllib.parse.urlsplit(store.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request(method, path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def timed_get(store, path):
    started = time.perf_counter()
    status, _, _ = get(store, path)
    assert status == 200
    return time.perf_counter() - started


@pytest.fixture
def served(tmp_path):
    """A served folder holding ``data.bin`` (0..255 repeated), next to a secret that must stay
    unreachable."""
    (tmp_path / "secret.txt").write_text("top secret")
    root = tmp_path / "served"
    (root / "sub").mkdir(parents=True)
    (root / "data.bin").write_bytes(bytes(range(256)) * 800)
    (root / "sub" / "escape").symlink_to(tmp_path)
    return root


@pytest.fixture
def store(served):
    with NetworkStore(served, latency=0) as running:
        yield running


def test_serves_files_on_loopback_and_counts_them(tiny_dataset):
    relpath = load_manifest(tiny_dataset)["samples"][0]["path"]
    with NetworkStore(tiny_dataset, latency=0) as store:
        assert store.url.startswith("http://127.0.0.1:") and store.url.endswith("/")
        status, headers, body = get(store, urllib.parse.urlsplit(store.url_for(relpath)).path)
        assert status == 200
        assert body == (tiny_dataset / relpath).read_bytes()
        assert int(headers["Content-Length"]) == len(body)
        assert (store.requests, store.bytes_served) == (1, len(body))
        store.reset_counters()
        assert (store.requests, store.bytes_served) == (0, 0)
    with pytest.raises(RuntimeError, match="not running"):
        _ = store.url


def test_head_sends_headers_only(store, served):
    status, headers, body = get(store, "/data.bin", method="HEAD")
    assert status == 200
    assert int(headers["Content-Length"]) == (served / "data.bin").stat().st_size
    assert body == b""


@pytest.mark.parametrize(
    "header, wanted",
    [
        ("bytes=0-9", slice(0, 10)),
        ("bytes=100-", slice(100, None)),
        ("bytes=-5", slice(-5, None)),
        ("bytes=10-999999999", slice(10, None)),
    ],
)
def test_range_requests_get_206_and_the_right_bytes(store, served, header, wanted):
    data = (served / "data.bin").read_bytes()
    status, headers, body = get(store, "/data.bin", {"Range": header})
    assert status == 206
    assert body == data[wanted]
    first = range(len(data))[wanted][0]
    assert headers["Content-Range"] == f"bytes {first}-{first + len(body) - 1}/{len(data)}"


def test_if_match_serves_only_the_version_asked_for(store, served):
    _, headers, data = get(store, "/data.bin")
    etag = headers["ETag"]
    for if_match in (etag, "*", f'"other", {etag}'):
        status, _, body = get(store, "/data.bin", {"If-Match": if_match, "Range": "bytes=0-9"})
        assert (status, body) == (206, data[:10])
    status, headers, body = get(store, "/data.bin", {"If-Match": '"1-1"', "Range": "bytes=0-9"})
    assert status == 412 and headers["ETag"] == etag
    assert b"/data.bin is no longer the version asked for" in body


@pytest.mark.parametrize("header", ["bytes=204800-", "bytes=999999-1000000", "bytes=-0"])
def test_unsatisfiable_ranges_get_416(store, served, header):
    status, headers, _ = get(store, "/data.bin", {"Range": header})
    assert status == 416
    assert headers["Content-Range"] == f"bytes */{(served / 'data.bin').stat().st_size}"


def test_a_malformed_range_is_ignored(store, served):
    status, _, body = get(store, "/data.bin", {"Range": "bytes=9-3"})
    assert status == 200 and body == (served / "data.bin").read_bytes()


def test_a_method_the_store_lacks_is_405_with_the_methods_it_has(store):
    status, headers, _ = get(store, "/data.bin", method="PUT")
    assert (status, headers["Allow"]) == (405, "GET, HEAD")


def test_a_file_cut_short_while_it_is_served_ends_the_connection(served):
    with NetworkStore(served, latency=0, bandwidth=200_000) as paced:
        parts = urllib.parse.urlsplit(paced.url)
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
        connection.request("GET", "/data.bin")
        response = connection.getresponse()
        os.truncate(served / "data.bin", 1000)  # while the paced body is on its way
        with pytest.raises(http.client.IncompleteRead):  # not a wait for bytes that never come
            response.read()
        connection.close()


def test_a_missing_file_gets_404_naming_the_path(store):
    status, _, body = get(store, "/sub/nothing.jpg")
    assert status == 404
    assert b"/sub/nothing.jpg" in body


@pytest.mark.parametrize(
    "path",
    [
        "/../secret.txt",
        "/sub/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E%2Fsecret.txt",
        "/sub/%2e%2e/%2e%2e/secret.txt",
        "/sub/escape/secret.txt",
    ],
)
def test_paths_outside_the_root_are_refused(store, path):
    status, _, body = get(store, path)
    assert status in (403, 404)
    assert b"top secret" not in body


def test_absolute_paths_stay_inside_the_root(store, tmp_path):
    status, _, body = get(store, "/" + str(tmp_path / "secret.txt"))
    assert status in (403, 404)
    assert b"top secret" not in body


def test_latency_is_honoured_and_adjustable_while_running(store):
    store.latency = 0.05
    assert all(0.05 <= timed_get(store, "/data.bin") < 0.05 + SLACK for _ in range(4))
    store.latency = 0.2
    assert 0.2 <= timed_get(store, "/data.bin") < 0.2 + SLACK


def test_parallel_requests_wait_concurrently(store):
    store.latency = 0.2
    elapsed = []
    threads = [
        threading.Thread(target=lambda: elapsed.append(timed_get(store, "/data.bin")))
        for _ in range(8)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = time.perf_counter() - started
    assert len(elapsed) == 8 and min(elapsed) >= 0.2
    assert total < 8 * 0.2 / 2  # serial handling would need 1.6 s
    assert store.requests == 8


def test_bandwidth_cap_paces_the_response(store, served):
    size = (served / "data.bin").stat().st_size
    store.bandwidth = size / 0.5  # half a second for the whole file
    seconds = timed_get(store, "/data.bin")
    assert 0.5 <= seconds < 0.5 + SLACK


def test_quiet_by_default(store, capfd):
    get(store, "/data.bin")
    get(store, "/missing")
    assert capfd.readouterr().err == ""


def test_refuses_to_serve_a_missing_folder(tmp_path):
    with pytest.raises(NotADirectoryError):
        NetworkStore(tmp_path / "nowhere")


def test_stopping_hangs_up_on_idle_keep_alive_clients(served):
    with NetworkStore(served, latency=0) as store:
        parts = urllib.parse.urlsplit(store.url)
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        connection.request("GET", "/data.bin")
        connection.getresponse().read()
    connection.request("GET", "/data.bin")
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        connection.getresponse()
    connection.close()


def test_a_file_replaced_while_it_is_served_arrives_whole_old_or_new(store, served):
    versions = [bytes([1]) * 200_000, bytes([2]) * 100_000]
    path = served / "changing.bin"
    path.write_bytes(versions[0])
    done = threading.Event()

    def keep_replacing():
        while not done.is_set():
            for version in versions:
                with written_atomically(path) as file:
                    file.write(version)

    replacer = threading.Thread(target=keep_replacing)
    replacer.start()
    try:
        for _ in range(300):
            status, headers, body = get(store, "/changing.bin")
            assert (
                status == 200 and body in versions and int(headers["Content-Length"]) == len(body)
            )
    finally:
        done.set()
        replacer.join()


def test_stop_waits_for_requests_in_flight_without_waiting_out_their_latency(served):
    before, answers = set(threading.enumerate()), []

    def ask():
        try:
            answers.append(get(store, "/data.bin")[0])
        except ConnectionError as error:
            answers.append(type(error))

    with NetworkStore(served, latency=60) as store:
        client = threading.Thread(target=ask)
        client.start()
        while store.requests == 0:
            time.sleep(0.01)  # the request is in, sleeping on its latency
        started = time.perf_counter()
    stopping = time.perf_counter() - started
    left_running = set(threading.enumerate()) - before - {client}
    client.join()
    assert left_running == set()  # no handler thread outlives stop()
    # the latency was cut short: a hang-up
    assert stopping < 60 and issubclass(answers[0], ConnectionError)


def test_the_store_serves_from_a_process_of_its_own_with_shared_settings(served):
    with NetworkStore(served, latency=0) as store:
        child = store._child.process
        assert child.pid != os.getpid() and child.poll() is None
        fetch = lambda: urllib.request.urlopen(store.url_for("data.bin")).read()  # noqa: E731
        size = len(fetch())
        store.latency = 0.2  # set here, obeyed there
        started = time.perf_counter()
        fetch()
        assert time.perf_counter() - started >= 0.2
        assert (store.requests, store.bytes_served) == (2, 2 * size)
        store.reset_counters()
        assert (store.requests, store.bytes_served) == (0, 0)
    assert child.poll() == 0  # stopped, and the port freed
