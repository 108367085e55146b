"""The two-pass shuffle: every sample exactly once, the same order for the same seed whatever runs
the tasks, one bucket in memory at a time, clear errors, and the old shards kept when it fails."""

import functools
import time
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path

import numpy as np
import pytest

from packdata import engines, shufflebench
from packdata.course import twopass_checks
from packdata.course.feedback import CheckFailed
from packdata.imagefolder import load_manifest
from packdata.shardread import iter_shard_samples
from packdata.shardwrite import write_tar
from packdata.twopass import (
    ShardSource,
    bucket_of,
    folder_sources,
    shuffle_bucket,
    two_pass_shuffle,
)


def written(result):
    """``[(key, label)]`` of every sample the result's shards hold, in order."""
    paths = [str(info.path) for info in result.shards]
    return [(s["__key__"], int(s["cls"])) for s in iter_shard_samples(paths)]


@pytest.fixture(scope="module")
def expected(tiny_dataset):
    return {entry["key"]: entry["label"] for entry in load_manifest(tiny_dataset)["samples"]}


def test_every_sample_once_with_its_label_in_shards_of_at_most_maxcount(
    tiny_dataset, expected, tmp_path
):
    result = two_pass_shuffle(
        folder_sources(tiny_dataset, per_task=25), tmp_path, buckets=4, maxcount=8
    )
    samples = written(result)
    assert len(samples) == len(expected) == result.samples
    assert dict(samples) == expected
    assert all(0 < info.samples <= 8 for info in result.shards)
    assert [p.name for p in sorted(tmp_path.iterdir())] == [i.path.name for i in result.shards]
    assert [key for key, _ in samples] != sorted(expected)  # shuffled


def test_runs_share_a_work_dir_that_keeps_what_it_held(tiny_dataset, expected, tmp_path):
    scratch = tmp_path / "scratch"  # a shared scratch folder, with someone's files in it
    (scratch / "theirs").mkdir(parents=True)
    (scratch / "theirs" / "notes.txt").write_text("keep me")
    sources = folder_sources(tiny_dataset, per_task=25)
    with ThreadPoolExecutor(2) as runs:  # two jobs at once, both with the default prefix
        results = list(
            runs.map(
                lambda out: two_pass_shuffle(sources, out, buckets=2, work_dir=scratch),
                [tmp_path / "a", tmp_path / "b"],
            )
        )
    assert all(dict(written(result)) == expected for result in results)
    assert [p.name for p in scratch.iterdir()] == ["theirs"]
    assert (scratch / "theirs" / "notes.txt").read_text() == "keep me"


def test_the_same_seed_gives_the_same_order_in_process_and_in_a_pool(tiny_dataset, tmp_path):
    sources = folder_sources(tiny_dataset, per_task=20)
    here = written(two_pass_shuffle(sources, tmp_path / "a", buckets=3, maxcount=10, seed=7))
    with engines.local(processes=2) as pool:
        pooled = two_pass_shuffle(
            sources, tmp_path / "b", buckets=3, maxcount=10, seed=7, executor=pool
        )
    other_seed = written(two_pass_shuffle(sources, tmp_path / "c", buckets=3, maxcount=10, seed=8))
    assert written(pooled) == here
    assert other_seed != here and sorted(other_seed) == sorted(here)


def test_a_dask_cluster_writes_the_same_shards(tiny_dataset, tmp_path):
    pytest.importorskip("distributed")
    sources = folder_sources(tiny_dataset, per_task=20)
    here = two_pass_shuffle(sources, tmp_path / "here", buckets=3, maxcount=10)
    with engines.dask(workers=2) as cluster:
        there = two_pass_shuffle(
            sources, tmp_path / "dask", buckets=3, maxcount=10, executor=cluster
        )
    assert [i.path.read_bytes() for i in there.shards] == [i.path.read_bytes() for i in here.shards]


def test_how_the_input_is_cut_into_tasks_does_not_change_the_order(tiny_dataset, tmp_path):
    orders = [
        written(
            two_pass_shuffle(
                folder_sources(tiny_dataset, per_task), tmp_path / str(per_task), buckets=4
            )
        )
        for per_task in (7, 60)
    ]
    assert orders[0] == orders[1]


def test_a_gather_task_holds_one_bucket_not_the_dataset(tiny_dataset, tmp_path):
    result = two_pass_shuffle(folder_sources(tiny_dataset), tmp_path, buckets=6, maxcount=100)
    held = [gathered.held_samples for gathered in result.gathered]
    assert sum(held) == 60 and max(held) <= 20  # about 10 each: a bucket, never all 60
    assert len(result.shards) == len(result.gathered)  # a shard per bucket at maxcount=100


def test_traced_peaks_cover_each_bucket(tiny_dataset, tmp_path):
    peaks = shufflebench.gather_peaks(folder_sources(tiny_dataset), tmp_path, buckets=3)
    assert len(peaks) == 3
    assert all(peak >= held > 0 for held, peak in peaks)


def test_buckets_are_uniform_and_the_bucket_shuffle_a_seeded_permutation():
    counts = Counter(bucket_of(f"{i:06d}", 0, 8) for i in range(8000))
    assert sorted(counts) == list(range(8)) and max(counts.values()) < 1100
    assert bucket_of("000001", 0, 8) == bucket_of("000001", 0, 8)
    items = list(range(50))
    shuffled = shuffle_bucket(items, 0, 3)
    assert sorted(shuffled) == items and shuffled != items
    assert shuffled == shuffle_bucket(items, 0, 3) != shuffle_bucket(items, 0, 4)


def test_shards_as_input_and_a_duplicate_key_named_with_both_inputs(tmp_path):
    a = write_tar(tmp_path / "a.tar", [(f"{i:03d}", {"cls": b"1"}) for i in range(10)]).path
    b = write_tar(tmp_path / "b.tar", [(f"{i:03d}", {"cls": b"2"}) for i in range(9, 15)]).path
    with pytest.raises(ValueError, match=r"duplicate key '009': in .*a\.tar and in .*b\.tar"):
        two_pass_shuffle([ShardSource(str(a)), ShardSource(str(b))], tmp_path / "out", buckets=2)
    result = two_pass_shuffle([ShardSource(str(a))], tmp_path / "out", buckets=2)
    assert sorted(key for key, _ in written(result)) == [f"{i:03d}" for i in range(10)]


def test_a_failed_run_keeps_the_old_set_and_a_new_one_replaces_it(tiny_dataset, tmp_path):
    out = tmp_path / "out"
    old = two_pass_shuffle(folder_sources(tiny_dataset), out, buckets=2, maxcount=5)
    before = {path: path.read_bytes() for path in out.iterdir()}
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar" * 100)
    with pytest.raises(ValueError, match="bad.tar"):
        two_pass_shuffle([ShardSource(str(bad))], out, buckets=2)
    assert {path: path.read_bytes() for path in out.iterdir()} == before  # no work folder left
    new = two_pass_shuffle(folder_sources(tiny_dataset), out, buckets=2, maxcount=30)
    assert len(new.shards) < len(old.shards)
    assert sorted(out.iterdir()) == [info.path for info in new.shards]  # stale ones gone


@dataclass(frozen=True)
class SlowSource:
    """An input whose samples come slowly; number 0 fails instead."""

    number: int

    @property
    def name(self):
        return f"slow-{self.number}"

    def samples(self, skipped):
        time.sleep(0.1)
        if self.number == 0:
            raise OSError("input 0 cannot be read")
        for index in range(4):
            time.sleep(0.1)
            yield f"s{self.number}-{index}", {"cls": b"1"}


def test_a_failed_task_in_a_pool_leaves_no_work_folder_once_the_others_end(tmp_path):
    out = tmp_path / "out"
    with ThreadPoolExecutor(2) as pool, pytest.raises(OSError, match="input 0 cannot be read"):
        two_pass_shuffle([SlowSource(0), SlowSource(1)], out, buckets=2, executor=pool)
    assert list(out.iterdir()) == []  # the other task had ended before the folder went


def test_a_work_dir_on_another_file_system_is_refused_before_any_pass(tmp_path):
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system here")
    empty = write_tar(tmp_path / "empty.tar", []).path
    with pytest.raises(ValueError, match="on another file system than out_dir"):
        two_pass_shuffle([ShardSource(str(empty))], tmp_path / "out", buckets=2, work_dir=other)


def test_nothing_to_shuffle_and_bad_settings_are_errors(tmp_path):
    empty = write_tar(tmp_path / "empty.tar", []).path
    with pytest.raises(ValueError, match="no samples in 1 inputs"):
        two_pass_shuffle([ShardSource(str(empty))], tmp_path / "out", buckets=2)
    with pytest.raises(ValueError, match="buckets and maxcount must be at least 1"):
        two_pass_shuffle([ShardSource(str(empty))], tmp_path / "out", buckets=0)
    with pytest.raises(ValueError, match="no inputs: sources is empty"):
        two_pass_shuffle([], tmp_path / "out", buckets=2)
    with pytest.raises(ValueError, match="seed must be a whole number of 0 or more, got -1"):
        two_pass_shuffle([ShardSource(str(empty))], tmp_path / "out", buckets=2, seed=-1)


def test_sources_given_as_a_generator_are_all_read(tmp_path):
    a = write_tar(tmp_path / "a.tar", [(f"{i:03d}", {"cls": b"1"}) for i in range(10)]).path
    sources = (ShardSource(str(path)) for path in [a])
    result = two_pass_shuffle(sources, tmp_path / "out", buckets=2)
    assert sorted(key for key, _ in written(result)) == [f"{i:03d}" for i in range(10)]


def test_quality_of_two_pass_matches_a_full_shuffle_and_beats_chunks():
    labels = np.repeat(np.arange(10), 200)  # class by class, as a tar of tars comes
    keys = [f"{i:06d}" for i in range(len(labels))]
    buckets = [[] for _ in range(8)]
    for position, key in enumerate(keys):
        buckets[bucket_of(key, 0, 8)].append(position)
    two_pass = np.concatenate([shuffle_bucket(b, 0, i) for i, b in enumerate(buckets)])
    full = shufflebench.quality(shufflebench.full_shuffle(len(labels)), labels)
    mixed = shufflebench.quality(two_pass, labels)
    chunks = shufflebench.quality(shufflebench.chunk_shuffle(len(labels), 250), labels)
    assert abs(mixed.classes - full.classes) < 0.3 and abs(mixed.entropy - full.entropy) < 0.1
    assert chunks.classes < full.classes - 3


SALT = "salt:"  # defined here, as in a notebook's cell: a fresh process lacks it


def bucket_with_a_salt(key, seed, buckets):
    return bucket_of(SALT + key, seed, buckets)


@functools.lru_cache
def bucket_of_imported_function(key, seed, buckets):
    """Right, with a function imported from a module, a comprehension, a numpy integer, a print,
    and a decorator."""
    digest = blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    print(key, [zlib.crc32(bytes([byte])) % buckets for byte in digest[:2]])
    return np.frombuffer(digest, np.uint64)[0] % np.uint64(buckets)


def bucket_doubled_by_the_seed(key, seed, buckets):
    return zlib.crc32(key.encode()) * (seed + 1) % buckets  # seed 1: even buckets only


def bucket_without_the_seed(key, seed, buckets):
    return bucket_of(key, 0, buckets)


def bucket_renamed_by_the_seed(key, seed, buckets):
    return (bucket_of(key, 0, buckets) + seed) % buckets


def bucket_by_crc32(key, seed, buckets):
    return zlib.crc32(f"{seed}:{key}".encode()) % buckets


def bucket_by_str_hash(key, seed, buckets):
    return hash((seed, key)) % buckets


def bucket_of_eight(key, seed, buckets):
    return bucket_of(key, seed, 8)


def shuffle_reversed(samples, seed, bucket):
    return samples[::-1]


def shuffle_by_seed_plus_bucket(samples, seed, bucket):
    return [samples[i] for i in np.random.default_rng(seed + bucket).permutation(len(samples))]


def shuffle_rotated(samples, seed, bucket):
    turn = int(np.random.default_rng([seed, bucket]).integers(len(samples)))
    return samples[turn:] + samples[:turn]


def test_a_bucket_function_that_fails_in_a_fresh_process_is_named():
    with pytest.raises(CheckFailed, match="failed in a fresh Python process.*NameError.*SALT"):
        twopass_checks.check_bucket_for(bucket_with_a_salt)
    with pytest.raises(CheckFailed, match="cannot read the source.*with def"):
        twopass_checks.check_bucket_for(lambda key, seed, buckets: bucket_of(key, seed, buckets))


def test_a_bucket_function_runs_in_a_fresh_process_with_what_it_imports(capsys):
    twopass_checks.check_bucket_for(bucket_of_imported_function)
    assert capsys.readouterr().out.splitlines()[-1].startswith("✓")


def test_buckets_uneven_for_another_seed_are_named():
    with pytest.raises(CheckFailed, match="with seed 1, bucket sizes run from 0"):
        twopass_checks.check_bucket_for(bucket_doubled_by_the_seed)


def shuffle_by_numpy_permutation(samples, seed, bucket):
    return list(np.random.default_rng([seed, bucket]).permutation(samples))


def test_the_exercise_checks_pass_the_package_s_functions():
    twopass_checks.check_bucket_for(bucket_of)
    twopass_checks.check_shuffle_bucket(shuffle_bucket)


@pytest.mark.parametrize(
    ("check", "wrong", "named"),
    [
        ("check_bucket_for", bucket_without_the_seed, "same buckets"),
        ("check_bucket_for", lambda key, seed, buckets: (int(key) + seed) % buckets, "not numbers"),
        ("check_bucket_for", bucket_renamed_by_the_seed, "only renames it"),
        ("check_bucket_for", bucket_by_crc32, "zlib.crc32 is linear"),
        ("check_bucket_for", bucket_by_str_hash, "str's hash"),
        ("check_bucket_for", bucket_of_eight, r"bucket_for\(key, 0, 5\) returned [567]"),
        ("check_shuffle_bucket", shuffle_rotated, "not a rotation"),
        ("check_shuffle_bucket", shuffle_reversed, "nothing random decides it"),
        ("check_shuffle_bucket", shuffle_by_seed_plus_bucket, r"seed \+ bucket makes every pair"),
        ("check_shuffle_bucket", lambda samples, seed, bucket: samples, "in its input order"),
        ("check_shuffle_bucket", shuffle_by_numpy_permutation, r"came back as array\("),
    ],
)
def test_the_exercise_checks_name_each_mistake(check, wrong, named):
    with pytest.raises(CheckFailed, match=named):
        getattr(twopass_checks, check)(wrong)
