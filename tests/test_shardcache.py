"""The bounded shard cache against a real store process: one download per shard however many
processes ask, a size limit kept by LRU eviction that spares shards in use, whole files only, and
hit rates per epoch, including the cache too small for the working set."""

import fcntl
import gzip
import multiprocessing
import pickle
from collections import Counter
from pathlib import Path

import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from packdata.atomic import temporary_prefix
from packdata.cachebench import compare_sources
from packdata.netstore import NetworkStore
from packdata.shardcache import (
    EVICTED,
    HIT,
    MISS,
    WAITED,
    ShardCache,
    cache_name,
    hit_rate,
)
from packdata.shardread import count_shard_samples
from packdata.shardwrite import write_shards
from packdata.streaming import ShardDataset

FORK = multiprocessing.get_context("fork")


@pytest.fixture(scope="module")
def shard_dir(tiny_dataset, tmp_path_factory):
    """10 shards of 6 samples."""
    out = tmp_path_factory.mktemp("cache-shards")
    write_shards(tiny_dataset, out, maxcount=6, progress=False)
    return out


@pytest.fixture
def store(shard_dir):
    with NetworkStore(shard_dir, latency=0) as running:
        yield running


def shard_files(shard_dir):
    return sorted(Path(shard_dir).glob("*.tar"))


def urls_of(store, shard_dir):
    return [store.url_for(path.name) for path in shard_files(shard_dir)]


def pin_once(root, max_bytes, url, start, outcomes):
    """In a child process: wait for the others, pin ``url``, report the outcome."""
    cache = ShardCache(root, max_bytes)
    start.wait()
    outcomes.put(cache.pin(url).outcome)


def test_processes_asking_for_one_shard_at_once_download_it_once(store, shard_dir, tmp_path):
    store.latency = 0.3  # every process asks while the first download is still under way
    url, source = urls_of(store, shard_dir)[0], shard_files(shard_dir)[0]
    start, outcomes = FORK.Barrier(4), FORK.Queue()
    children = [
        FORK.Process(target=pin_once, args=(tmp_path, 10**9, url, start, outcomes))
        for _ in range(4)
    ]
    for child in children:
        child.start()
    seen = Counter(outcomes.get(timeout=30) for _ in children)
    for child in children:
        child.join()
    assert store.requests == 1
    assert seen == {MISS: 1, WAITED: 3}
    (cached,) = (path for path in tmp_path.iterdir() if not path.name.startswith("."))
    assert cached.read_bytes() == source.read_bytes()


def watch(root, sources, stop, report):
    """In a child process: until ``stop``, read every shard that has appeared under its name and
    compare it with the original; report ``(whole files seen, partial files seen)``."""
    whole = partial = 0
    while not stop.is_set():
        for path in Path(root).iterdir():
            if path.name.startswith("."):
                continue
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # evicted meanwhile
                continue
            if data == sources[path.name.partition("-")[2]]:
                whole += 1
            else:
                partial += 1
    report.put((whole, partial))


def test_a_reader_only_ever_sees_whole_shards(store, shard_dir, tmp_path):
    sources = {path.name: path.read_bytes() for path in shard_files(shard_dir)}
    cache = ShardCache(tmp_path, max_bytes=3 * max(map(len, sources.values())))
    stop, report = FORK.Event(), FORK.Queue()
    watcher = FORK.Process(target=watch, args=(tmp_path, sources, stop, report))
    watcher.start()
    for _ in range(3):  # 30 downloads and the evictions between them
        for path in cache.fetched(urls_of(store, shard_dir), ahead=1):
            assert Path(path).exists()
    stop.set()
    whole, partial = report.get(timeout=30)
    watcher.join()
    assert whole > 0
    assert partial == 0
    assert not [path for path in tmp_path.iterdir() if ".partial-" in path.name]


def test_eviction_keeps_the_cache_under_its_limit(store, shard_dir, tmp_path):
    largest = max(path.stat().st_size for path in shard_files(shard_dir))
    cache = ShardCache(tmp_path, max_bytes=int(3.5 * largest))
    for path in cache.fetched(urls_of(store, shard_dir), ahead=1):
        assert cache.size() <= cache.max_bytes
        assert Path(path).exists()
    assert len(cache.entries()) <= 3
    assert Counter(event for event, _, _ in cache.events())[EVICTED] >= 7


def test_a_shard_in_use_is_never_evicted(store, shard_dir, tmp_path):
    largest = max(path.stat().st_size for path in shard_files(shard_dir))
    cache = ShardCache(tmp_path, max_bytes=2 * largest)
    first, *others = urls_of(store, shard_dir)
    held = cache.pin(first)
    for _ in cache.fetched(others, ahead=0):
        pass
    assert held.path.exists()  # the oldest, but pinned
    held.release()
    for _ in cache.fetched(others[:2], ahead=0):
        pass
    assert not held.path.exists()


def test_a_pin_that_fails_to_note_itself_lets_its_lock_go(store, shard_dir, tmp_path):
    cache = ShardCache(tmp_path, max_bytes=10**9)
    cache.journal.mkdir()  # the journal cannot be written
    url = urls_of(store, shard_dir)[0]
    with pytest.raises(IsADirectoryError):
        cache.pin(url)
    # an eviction takes the pin lock alone: it must get it now
    with open(tmp_path / ".locks" / f"{cache_name(url)}.pin", "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_missing_shard_raises_naming_it_and_leaves_nothing(store, tmp_path):
    cache = ShardCache(tmp_path, max_bytes=10**6)
    with pytest.raises(FileNotFoundError, match="nope-000000.tar"):
        list(cache.fetched([store.url_for("nope-000000.tar")]))
    assert cache.entries() == []
    assert not [path for path in tmp_path.iterdir() if ".partial-" in path.name]


def wait_for(event):
    """In a forked child: live until ``event`` is set."""
    event.wait(30)


def test_a_forked_worker_does_not_keep_a_lock_its_parent_has_let_go(store, shard_dir, tmp_path):
    largest = max(path.stat().st_size for path in shard_files(shard_dir))
    cache = ShardCache(tmp_path, max_bytes=2 * largest)
    first, *others = urls_of(store, shard_dir)
    held = cache.pin(first)  # as a shard fetched ahead while a DataLoader forks its workers
    done = FORK.Event()
    child = FORK.Process(target=wait_for, args=(done,))
    child.start()
    try:
        held.release()
        for _ in cache.fetched(others[:2], ahead=0):
            pass
        assert not held.path.exists()  # evicted: the child's copy of the lock file held nothing
    finally:
        done.set()
        child.join()


def test_files_of_others_in_the_folder_are_neither_counted_nor_evicted(store, shard_dir, tmp_path):
    mine = tmp_path / "checkpoint-epoch3.pt"
    mine.write_bytes(b"weights" * 1000)
    largest = max(path.stat().st_size for path in shard_files(shard_dir))
    cache = ShardCache(tmp_path, max_bytes=2 * largest)
    assert cache.size() == 0
    for _ in cache.fetched(urls_of(store, shard_dir), ahead=0):
        pass
    assert mine.read_bytes() == b"weights" * 1000
    assert all(name != mine.name for _, _, name in cache.entries())


def test_a_long_file_name_and_one_with_a_space_go_through_the_cache(store, shard_dir, tmp_path):
    source = shard_files(shard_dir)[0]
    names = ["x" * 240 + ".tar", "my shard.tar"]
    for name in names:
        (shard_dir / name).write_bytes(source.read_bytes())
    cache = ShardCache(tmp_path, max_bytes=10**9)
    try:
        for name in names:
            url = store.url_for(name).replace("%20", " ")  # a URL as a user may write it
            assert bytes(cache.read(url)) == source.read_bytes()
    finally:
        for name in names:
            (shard_dir / name).unlink()
    assert [(event, size) for event, _, size in cache.events()] == [
        (MISS, source.stat().st_size)
    ] * 2
    assert cache.events()[1][1].endswith("-my shard.tar")


def test_a_shard_cut_short_is_not_kept_and_is_fetched_again_once_whole(store, shard_dir, tmp_path):
    source = shard_files(shard_dir)[0]
    whole = source.read_bytes()
    cut = shard_dir / "cut-000000.tar"
    cut.write_bytes(whole[: len(whole) // 1024 * 512])  # headers and members, no end
    cache = ShardCache(tmp_path, max_bytes=10**9)
    url = store.url_for(cut.name)
    try:
        with pytest.raises(ValueError, match=f"{url}: .* without the blocks that end a tar"):
            cache.read(url)
        assert cache.entries() == []
        cut.write_bytes(whole)
        assert bytes(cache.read(url)) == whole
    finally:
        cut.unlink()


def test_what_a_killed_download_left_goes_when_the_shard_is_downloaded_again(
    store, shard_dir, tmp_path
):
    cache = ShardCache(tmp_path, max_bytes=10**9)
    url = urls_of(store, shard_dir)[0]
    leftover = tmp_path / f"{temporary_prefix(cache_name(url))}k1ll3d"  # as mkstemp names it
    leftover.write_bytes(b"the first 4 MB of a download")
    pin = cache.pin(url)
    pin.release()
    assert pin.outcome == MISS and not leftover.exists()


def test_an_error_in_a_cached_shard_names_its_url(store, shard_dir, tmp_path):
    packed = gzip.compress(shard_files(shard_dir)[0].read_bytes())
    (shard_dir / "damaged-000000.tar.gz").write_bytes(packed[: len(packed) // 2])
    cache = ShardCache(tmp_path, max_bytes=10**9)
    url = store.url_for("damaged-000000.tar.gz")
    try:
        with pytest.raises(ValueError, match=f"{url}: damaged gzip stream"):
            cache.read(url)
        with pytest.raises(ValueError, match=f"{url}: damaged gzip stream"):
            cache.reads([url])(url)
    finally:
        (shard_dir / "damaged-000000.tar.gz").unlink()


def epoch_events(cache, read_epoch):
    """Run ``read_epoch()`` and return the cache's events during it."""
    mark = len(cache.events())
    read_epoch()
    return cache.events(mark)


def cached_dataset(store, shard_dir, cache, **options):
    """A ``ShardDataset`` of the shards' keys, read from ``store`` through ``cache``."""
    files = shard_files(shard_dir)
    return ShardDataset(
        urls_of(store, shard_dir),
        cache=cache,
        keys=("__key__",),
        decode=False,
        sizes=[count_shard_samples(path) for path in files],
        **options,
    )


def test_a_cache_holding_the_working_set_hits_every_shard_from_the_second_epoch(
    store, shard_dir, tmp_path
):
    working_set = sum(path.stat().st_size for path in shard_files(shard_dir))
    cache = ShardCache(tmp_path, max_bytes=2 * working_set)
    dataset = cached_dataset(store, shard_dir, cache)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    rates, requests = [], []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        keys = []
        events = epoch_events(cache, lambda: keys.extend(key for (key,) in loader))  # noqa: B023
        assert sorted(keys) == sorted(set(keys)) and len(keys) == len(dataset) == 60
        rates.append(hit_rate(events))
        requests.append(store.requests)
    assert rates == [0.0, 1.0]
    assert requests == [10, 10]  # the second epoch asked the store for nothing


def test_the_cache_travels_to_spawned_workers_as_its_folder_and_settings(
    store, shard_dir, tmp_path
):
    cache = ShardCache(tmp_path, max_bytes=10**9, ahead=1)
    copy = pickle.loads(pickle.dumps(cache))
    assert (copy.root, copy.max_bytes, copy.ahead) == (cache.root, cache.max_bytes, 1)
    dataset = cached_dataset(store, shard_dir, cache, world_size=2, rank=1)
    spawned = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    keys = [key for (key,) in spawned]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == len(dataset) == 30
    assert Counter(event for event, _, _ in cache.events()) == {MISS: 5}


def test_counting_the_samples_fills_the_cache_the_workers_then_read(store, shard_dir, tmp_path):
    cache = ShardCache(tmp_path, max_bytes=10**9)
    dataset = ShardDataset(urls_of(store, shard_dir), cache=cache, keys=("__key__",), decode=False)
    assert len(dataset) == 60  # counted: one GET per shard, through the cache
    keys = [key for (key,) in DataLoader(dataset, batch_size=None, num_workers=2)]
    assert len(keys) == len(set(keys)) == 60
    assert store.requests == 10
    assert hit_rate(cache.events()) == 0.5  # 10 downloads to count, 10 hits to read


def test_a_resumed_epoch_through_the_cache_delivers_the_rest_exactly_once(
    store, shard_dir, tmp_path
):
    cache = ShardCache(
        tmp_path, max_bytes=3 * max(p.stat().st_size for p in shard_files(shard_dir))
    )
    options = {"buffer_size": 8, "seed": 5}
    first = StatefulDataLoader(
        cached_dataset(store, shard_dir, cache, **options), batch_size=4, num_workers=2
    )
    batches = iter(first)
    before = [key for _ in range(5) for key in next(batches)[0]]
    state = first.state_dict()
    again = StatefulDataLoader(
        cached_dataset(store, shard_dir, cache, **options), batch_size=4, num_workers=2
    )
    again.load_state_dict(state)
    after = [key for batch in again for key in batch[0]]
    delivered = before + after
    assert len(delivered) == len(set(delivered)) == 60
    whole = StatefulDataLoader(
        cached_dataset(store, shard_dir, cache, **options), batch_size=4, num_workers=2
    )
    assert delivered == [key for batch in whole for key in batch[0]]  # the same order, continued


def test_a_shard_the_store_lacks_is_skipped_and_counted_through_the_cache(
    store, shard_dir, tmp_path
):
    urls = urls_of(store, shard_dir)
    urls[3] = store.url_for("nope-000000.tar")
    dataset = ShardDataset(
        urls,
        cache=ShardCache(tmp_path, max_bytes=10**9),
        keys=("__key__",),
        decode=False,
        errors="skip",
        sizes=[6] * 10,
        shuffle=False,
    )
    with pytest.warns(UserWarning, match=r"skipped 1 shard\(s\).*nope-000000.tar"):
        keys = [key for (key,) in dataset]
    assert len(keys) == len(set(keys)) == 54


def cyclic_epochs(cache, urls, orders):
    """``[(hits, lookups)]`` of one epoch per order in ``orders``, reading ``urls`` through
    ``cache`` one shard at a time."""
    counts = []
    for order in orders:
        events = epoch_events(cache, lambda: list(cache.fetched(order(urls), ahead=0)))  # noqa: B023
        kinds = Counter(event for event, _, _ in events)
        counts.append((kinds[HIT], kinds[HIT] + kinds[MISS] + kinds[WAITED]))
    return counts


def test_lru_over_the_same_order_misses_every_shard_when_the_cache_is_too_small(
    store, shard_dir, tmp_path
):
    largest = max(path.stat().st_size for path in shard_files(shard_dir))
    cache = ShardCache(tmp_path, max_bytes=5 * largest)  # about half the shards
    same = cyclic_epochs(cache, urls_of(store, shard_dir), [list] * 3)
    # each shard is asked for again just after it became the least recently used: evicted
    assert same == [(0, 10)] * 3
    assert store.requests == 30


def test_reading_back_the_other_way_hits_what_the_cache_still_holds(store, shard_dir, tmp_path):
    largest = max(path.stat().st_size for path in shard_files(shard_dir))
    cache = ShardCache(tmp_path, max_bytes=5 * largest)
    urls = urls_of(store, shard_dir)
    cyclic_epochs(cache, urls, [list])
    kept = len(cache.entries())
    backwards = cyclic_epochs(cache, urls, [lambda order: order[::-1]])
    assert kept >= 5
    assert backwards == [(kept, 10)]


def test_compare_sources_counts_what_each_source_asks_of_the_store(shard_dir):
    result = compare_sources(shard_dir, latency=0, bandwidth=None, rounds=1, batch_size=6)

    def per_epoch(source, figure):
        return [result.median(source, figure, epoch) for epoch in range(2)]

    assert per_epoch("stream", "gets") == [10, 10]
    assert per_epoch("stage", "gets") == [10, 0]
    assert per_epoch("cache 2× data", "gets") == [10, 0]
    assert per_epoch("cache 2× data", "hit_rate") == [0.0, 1.0]
    assert per_epoch("stream", "hit_rate") == [None, None]
    assert "cache 0.5× data" in str(result)
