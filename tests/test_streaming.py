"""The streaming dataset: shard lists, exactly-once splitting, two-level shuffling, the fast tar
reader, webdataset interop both ways, and every bad input failing clearly (or being skipped and
counted when asked)."""

import io
import itertools
import random
import re
import tarfile
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset
from PIL import Image
from torch.utils.data import DataLoader

from packdata import imagefolder, plaingroup, streaming, tario, tarscan
from packdata.images import decode_image
from packdata.layout import ShardError, expand_shards
from packdata.netstore import NetworkStore
from packdata.presigned import withheld
from packdata.shardwrite import write_shards, write_tar
from packdata.streaming import (
    ShardDataset,
    equal_quotas,
    shuffle_buffer,
    shuffle_shards,
    split_shards,
)

KEYS = ("__key__", "cls")  # undecoded keys and labels: what exactly-once tests need, fast


@pytest.fixture(scope="module")
def shard_dir(tiny_dataset, tmp_path_factory):
    """60 samples in 7 shards: six of 9 samples, one of 6 (uneven on purpose)."""
    out = tmp_path_factory.mktemp("shards")
    write_shards(tiny_dataset, out, maxcount=9, progress=False)
    return out


@pytest.fixture(scope="module")
def urls(shard_dir):
    return sorted(str(path) for path in shard_dir.glob("train-*.tar"))


@pytest.fixture(scope="module")
def all_keys(tiny_dataset):
    return sorted(sample["key"] for sample in imagefolder.load_manifest(tiny_dataset)["samples"])


def keys_of(dataset, num_workers=1):
    """Keys every worker of this rank yields, simulated in this process."""
    return [
        item[0] for worker in range(num_workers) for item in dataset.iterate(worker, num_workers)
    ]


# --- shard lists ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, expected",
    [
        ("a.tar", ["a.tar"]),
        ("train-{000..002}.tar", ["train-000.tar", "train-001.tar", "train-002.tar"]),
        ("x{8..10}", ["x8", "x9", "x10"]),
        ("{train,val}-{0..1}.tar", ["train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"]),
        (
            "http://h:1/s-{09..11}.tar",
            ["http://h:1/s-09.tar", "http://h:1/s-10.tar", "http://h:1/s-11.tar"],
        ),
        ("{a,{b,c}}.tar", ["a.tar", "b.tar", "c.tar"]),
        ("{0..010}", [f"{n:03d}" for n in range(11)]),
        ("{10..08}", ["10", "09", "08"]),
        ("a{}.tar", ["a{}.tar"]),
    ],
)
def test_brace_patterns_expand_as_webdataset_expands_them(pattern, expected):
    assert expand_shards(pattern) == expected == list(webdataset.shardlists.expand_urls(pattern))


@pytest.mark.parametrize("shards", [["a.tar", "a.tar"], "{a,b,a}.tar", ["a-{0..2}.tar", "a-1.tar"]])
def test_a_shard_named_twice_is_refused(shards):
    with pytest.raises(ValueError, match="more than once"):
        expand_shards(shards)


@pytest.mark.parametrize("second", ["./a.tar", "b/../a.tar", "{cwd}/a.tar", "{cwd}//a.tar"])
def test_one_local_shard_spelled_two_ways_is_refused_naming_both(second, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    second = second.format(cwd=tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"one shard, as 'a.tar' and as {second!r}")):
        expand_shards(["a.tar", second])


@pytest.mark.parametrize(
    "second",
    ["http://H/%74rain.tar", "http://h/./train.tar", "http://h/train.tar?X-Amz-Signature=1"],
)
def test_one_url_spelled_two_ways_is_refused_naming_both(second):
    shown = withheld(second)  # a signature is not shown
    with pytest.raises(ValueError, match=re.escape(f"as 'http://h/train.tar' and as '{shown}'")):
        expand_shards(["http://h/train.tar", second])


def test_urls_that_differ_in_what_they_read_are_two_shards():
    names = [
        "http://h/a//b.tar",
        "http://h/a/b.tar",
        "http://h/b.tar?versionId=2",
        "http://h/b.tar",
    ]
    assert expand_shards(names) == names


def test_the_same_file_name_in_two_folders_or_servers_is_two_shards():
    names = ["a/x.tar", "b/x.tar", "http://h1/x.tar", "http://h2/x.tar"]
    assert expand_shards(names) == names


@pytest.mark.parametrize(
    "environment, said",
    [
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set and RANK is not"),
        ({"RANK": "1"}, "RANK is set and WORLD_SIZE is not"),
        ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE='two': both must be whole numbers"),
    ],
)
def test_torchrun_variables_half_set_or_no_numbers_are_named(urls, monkeypatch, environment, said):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=said):
        ShardDataset(urls)


def test_more_ranks_than_shards_is_refused(urls):
    with pytest.raises(ValueError, match=f"{len(urls)} shard.*{len(urls) + 1} ranks"):
        ShardDataset(urls, rank=0, world_size=len(urls) + 1)


def test_equalize_refuses_skipping(urls):
    with pytest.raises(ValueError, match="equalize.*errors='skip'"):
        ShardDataset(urls, equalize=True, errors="skip")


def test_a_pattern_expands_to_the_written_shards(shard_dir, urls):
    assert expand_shards(str(shard_dir / "train-{000000..000006}.tar")) == urls


@pytest.mark.parametrize(
    "shard", ["https://example.com/train-000000.tar", "s3://bucket/train-000000.tar"]
)
def test_a_url_we_cannot_read_is_refused_by_name(shard):
    with pytest.raises(
        ValueError, match=f"cannot read '{shard}': shards are local paths or http:// URLs"
    ):
        ShardDataset([shard])


@pytest.mark.parametrize("empty", [[], (), "", [""]])
def test_an_empty_shard_list_is_refused(empty):
    with pytest.raises(ValueError, match="shard list is empty"):
        ShardDataset(empty)


# --- exactly once ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", range(1, 9))
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("num_workers", [1, 2, 3, 4])
def test_split_shards_is_a_partition(shards, world_size, num_workers):
    names = [f"s{i}" for i in range(shards)]
    parts = [
        split_shards(names, r, world_size, w, num_workers)
        for r in range(world_size)
        for w in range(num_workers)
    ]
    assert sorted(name for part in parts for name in part) == names
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("num_workers", [1, 2, 3, 5])
def test_every_sample_exactly_once_per_epoch_across_ranks_and_workers(
    urls, all_keys, world_size, num_workers
):
    for epoch in range(3):
        seen = []
        for rank in range(world_size):
            dataset = ShardDataset(
                urls,
                rank=rank,
                world_size=world_size,
                seed=7,
                buffer_size=5,
                keys=KEYS,
                decode=False,
            )
            dataset.set_epoch(epoch)
            keys = keys_of(dataset, num_workers)
            assert len(keys) == len(dataset)
            seen += keys
        assert sorted(seen) == all_keys, f"epoch {epoch}: {Counter(seen).most_common(2)}"


def test_real_fork_workers_on_two_ranks_deliver_every_sample_once(urls, all_keys):
    seen = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        for rank in range(2):
            dataset = ShardDataset(
                urls, rank=rank, world_size=2, buffer_size=10, keys=KEYS, decode=False
            )
            loader = DataLoader(
                dataset, batch_size=None, num_workers=3, multiprocessing_context="fork"
            )
            seen += [key for key, _ in loader]
    assert sorted(seen) == all_keys


def test_spawn_workers_decode_and_batch(urls, all_keys):
    dataset = ShardDataset(urls, batch_size=8, keys=("jpg", "cls"))
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    batches = list(loader)
    assert sum(len(labels) for _, labels in batches) == len(all_keys)
    images, labels = batches[0]
    assert (
        images.dtype == torch.uint8
        and images.shape[1:] == (3, 64, 64)
        and labels.dtype == torch.int64
    )


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_persistent_workers_follow_set_epoch(urls, all_keys, method):
    dataset = ShardDataset(urls, seed=3, buffer_size=5, keys=KEYS, decode=False)
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=method,
    )
    epochs = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        epochs.append([key for key, _ in loader])
    for epoch, keys in enumerate(epochs):
        # the epoch again, in this process: each worker's stream, taken in turn as the loader does
        dataset.set_epoch(epoch)
        streams = [[key for key, _ in dataset.iterate(worker, 2)] for worker in range(2)]
        expected = [
            key for pair in itertools.zip_longest(*streams) for key in pair if key is not None
        ]
        assert keys == expected, f"epoch {epoch}"
        assert sorted(keys) == all_keys
    assert epochs[0] != epochs[1] != epochs[2]


# --- shuffling ------------------------------------------------------------------------------------


def order(urls, seed=0, epoch=0, **kwargs):
    dataset = ShardDataset(urls, seed=seed, keys=KEYS, decode=False, **kwargs)
    dataset.set_epoch(epoch)
    return keys_of(dataset, 2)


def test_the_order_is_a_function_of_seed_and_epoch(urls):
    first = order(urls, seed=1, epoch=0, buffer_size=10)
    assert order(urls, seed=1, epoch=0, buffer_size=10) == first
    assert order(urls, seed=1, epoch=1, buffer_size=10) != first
    assert order(urls, seed=2, epoch=0, buffer_size=10) != first
    assert sorted(order(urls, seed=1, epoch=1, buffer_size=10)) == sorted(first)


def test_shard_order_changes_per_epoch_and_is_shared_by_all_ranks(urls):
    ranks = [ShardDataset(urls, rank=rank, world_size=3, decode=False) for rank in range(3)]
    orders = []
    for epoch in (0, 1):
        for dataset in ranks:
            dataset.set_epoch(epoch)
        orders.append([dataset.epoch_order() for dataset in ranks])
        assert orders[-1][0] == orders[-1][1] == orders[-1][2] == shuffle_shards(urls, 0, epoch)
        assert sorted(orders[-1][0]) == urls
    assert orders[0][0] != orders[1][0]
    assert order(urls, shuffle=False) == order(urls, shuffle=False, epoch=5)


def test_the_shuffle_buffer_fills_before_it_yields():
    consumed = []

    def source():
        for item in range(100):
            consumed.append(item)
            yield item

    stream = shuffle_buffer(source(), 10, random.Random(0))
    next(stream)
    assert len(consumed) >= 10
    rest = list(stream)
    assert sorted(rest + [x for x in consumed if x not in rest]) == list(range(100))
    assert len(rest) == 99


@pytest.mark.parametrize("size, count", [(0, 5), (1, 5), (10, 3), (10, 10), (4, 50)])
def test_the_shuffle_buffer_is_a_permutation(size, count):
    out = list(shuffle_buffer(iter(range(count)), size, random.Random(size)))
    assert sorted(out) == list(range(count))
    if size <= 1:
        assert out == list(range(count))


# --- decoding, batching, equalising ---------------------------------------------------------------


def test_a_shard_is_freed_before_the_next_is_read(urls, monkeypatch):
    """Two shards alive at once would make every read pay page faults for memory the last one just
    gave back."""
    alive, alive_at_each_read = set(), []

    class Tracked(bytes):
        def __del__(self):
            alive.discard(id(self))

    def read_tracked(shard):
        alive_at_each_read.append(len(alive))
        with open(shard, "rb") as file:
            data = Tracked(file.read())
        alive.add(id(data))
        return data

    monkeypatch.setattr(streaming, "read_shard", read_tracked)
    assert sum(1 for _ in ShardDataset(urls, keys=KEYS, decode=False)) == 60
    assert alive_at_each_read == [0] * len(urls)


def test_samples_decode_to_the_source_pixels_and_labels(urls, tiny_dataset):
    manifest = {s["key"]: s for s in imagefolder.load_manifest(tiny_dataset)["samples"]}
    dataset = ShardDataset(
        urls, keys=("jpg", "cls", "__key__"), transform=lambda image: image.flip(-1)
    )
    for image, label, key in dataset:
        source = decode_image((tiny_dataset / manifest[key]["path"]).read_bytes())
        assert label == manifest[key]["label"] and torch.equal(image, source.flip(-1))


def test_equal_quotas_trim_the_largest_first():
    assert equal_quotas([5, 3, 4], 9) == [3, 3, 3]
    assert equal_quotas([5, 3, 4], 12) == [5, 3, 4]
    assert sum(equal_quotas([9, 0, 7], 10)) == 10


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_equalize_gives_every_rank_the_same_count_without_duplicates(urls, num_workers):
    for epoch in range(3):
        per_rank = []
        for rank in range(2):
            dataset = ShardDataset(
                urls, rank=rank, world_size=2, equalize=True, keys=KEYS, decode=False
            )
            dataset.set_epoch(epoch)
            per_rank.append(keys_of(dataset, num_workers))
            assert len(per_rank[-1]) == len(dataset)
        unequal = [ShardDataset(urls, rank=r, world_size=2) for r in range(2)]
        for d in unequal:
            d.set_epoch(epoch)
        assert len(per_rank[0]) == len(per_rank[1]) == min(map(len, unequal))
        assert not set(per_rank[0]) & set(per_rank[1])


# --- over HTTP ------------------------------------------------------------------------------------


def test_urls_from_the_store_cost_one_get_per_shard(shard_dir, urls, all_keys):
    with NetworkStore(shard_dir, latency=0) as store:
        remote = [store.url_for(f"train-{i:06d}.tar") for i in range(len(urls))]
        keys = [key for key, _ in ShardDataset(remote, keys=KEYS, decode=False)]
        assert sorted(keys) == all_keys and store.requests == len(urls)


def test_a_url_that_404s_names_the_url(shard_dir, urls):
    with NetworkStore(shard_dir, latency=0) as store:
        missing = store.url_for("train-999999.tar")
        with pytest.raises(FileNotFoundError, match="train-999999.tar.*404"):
            list(
                ShardDataset(
                    [store.url_for("train-000000.tar"), missing], shuffle=False, decode=False
                )
            )


# --- webdataset, both ways ------------------------------------------------------------------------


def test_webdataset_reads_our_shards(urls, all_keys, tiny_dataset):
    labels = {s["key"]: s["label"] for s in imagefolder.load_manifest(tiny_dataset)["samples"]}
    samples = list(webdataset.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "cls"))
    assert sorted(key for key, _ in samples) == all_keys
    assert all(int(label) == labels[key] for key, label in samples)


def test_we_read_shards_written_by_webdataset(tiny_dataset, tmp_path, all_keys):
    manifest = imagefolder.load_manifest(tiny_dataset)
    with webdataset.ShardWriter(str(tmp_path / "wds-%02d.tar"), maxcount=25, verbose=0) as writer:
        for s in manifest["samples"]:
            writer.write(
                {
                    "__key__": s["key"],
                    "jpg": (tiny_dataset / s["path"]).read_bytes(),
                    "cls": s["label"],
                }
            )
    shards = sorted(str(p) for p in tmp_path.glob("wds-*.tar"))
    with tarfile.open(shards[0]) as tar:
        # the case worth testing
        assert tar.pax_headers or any(m.pax_headers for m in tar.getmembers())
    got = {key: label for image, label, key in ShardDataset(shards, keys=("jpg", "cls", "__key__"))}
    assert got == {s["key"]: s["label"] for s in manifest["samples"]}


# --- the fast reader ------------------------------------------------------------------------------


def make_tar(tar_format, names):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tar_format) as tar:
        for index, name in enumerate(names):
            payload = f"{name}:{index}".encode() * (index * 97 % 13 + 1)
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(payload), 1_700_000_000.5
            tar.addfile(info, io.BytesIO(payload))
        folder = tarfile.TarInfo("a-folder")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
    return buffer.getvalue()


LONG = "deep/" * 30 + "000001.jpg"
PREFIXED = "folder/" + "x" * 95 + ".jpg"


@pytest.mark.parametrize(
    "tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]
)
def test_scan_buffer_agrees_with_tarfile(tar_format):
    names = ["000000.jpg", "000000.cls", "ünï.cls", PREFIXED] + (
        [LONG] if tar_format != tarfile.USTAR_FORMAT else []
    )
    archive = make_tar(tar_format, names)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        expected = [
            (m.name, archive[m.offset_data : m.offset_data + m.size])
            for m in tar.getmembers()
            if m.isfile()
        ]
    assert list(tarscan.iter_buffer(archive, "t.tar")) == expected


def test_a_bad_checksum_is_caught_in_the_fast_path():
    archive = bytearray(make_tar(tarfile.USTAR_FORMAT, ["a.jpg", "b.jpg", "c.jpg"]))
    archive[1024 + 5] ^= 1  # a byte of the second header's name
    with pytest.raises(tario.TarFormatError, match="t.tar: bad header checksum at offset 1024"):
        tarscan.scan_buffer(bytes(archive), "t.tar")


def lookalike_archive(small):
    """A tar whose first member holds the ustar magic where a header would have it, then ``small``
    one-byte members; and its ``(name, bytes)`` pairs."""
    lookalike = bytes(257) + b"ustar\x00" + bytes(300)
    members = [("a.bin", lookalike)] + [(f"{n}.bin", b"x") for n in range(small)]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue(), members


def test_a_header_lookalike_inside_a_member_takes_the_general_path():
    archive, members = lookalike_archive(small=tarscan.WALK_SLACK + 2)  # small: the magic search
    assert tarscan.scan_plain(archive, "t.tar") is None
    assert list(tarscan.iter_buffer(archive, "t.tar")) == members


def test_walking_from_header_to_header_reads_past_a_lookalike():
    archive, members = lookalike_archive(small=1)  # few members: walked
    names, starts, sizes = tarscan.scan_plain(archive, "t.tar")
    assert names.tolist() == [b"a.bin", b"0.bin"] and sizes.tolist() == [563, 1]
    assert list(tarscan.iter_buffer(archive, "t.tar")) == members


@pytest.mark.parametrize("payload", [1, 600, 70_000])  # bytes of each member
def test_the_walk_and_the_magic_search_find_the_same_members(monkeypatch, payload):
    names = [f"{n:06d}.{e}" for n in range(4) for e in ("jpg", "cls")]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for index, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size = payload + index
            tar.addfile(info, io.BytesIO(bytes([index]) * info.size))
    archive = buffer.getvalue()
    found = {}
    for way, span, slack in (("walked", 1, 0), ("searched", 1, -1)):  # slack -1: never walks
        monkeypatch.setattr(tarscan, "WALK_SPAN", span)
        monkeypatch.setattr(tarscan, "WALK_SLACK", slack)
        found[way] = [column.tolist() for column in tarscan.scan_plain(archive, "t.tar")]
    assert found["walked"] == found["searched"]
    assert found["walked"][0] == [name.encode() for name in names]


def test_checksum_fields_in_other_spellings_are_read():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in ("a.jpg", "a.cls", "b.jpg", "b.cls"):
            info = tarfile.TarInfo(name)
            info.size = len(name)
            tar.addfile(info, io.BytesIO(name.encode()))
    archive = bytearray(buffer.getvalue())
    expected = list(tarscan.iter_buffer(bytes(archive), "t.tar"))
    for offset in (0, 1024, 2048, 3072):  # every member here fits in one block
        header = archive[offset : offset + 512]
        checksum = sum(header[:148]) + 8 * ord(" ") + sum(header[156:])
        # 7 digits and a NUL, as some tars have
        archive[offset + 148 : offset + 156] = f"{checksum:07o}\x00".encode()
    assert tarscan.scan_plain(bytes(archive), "t.tar") is not None
    assert list(tarscan.iter_buffer(bytes(archive), "t.tar")) == expected


@pytest.mark.parametrize("width", [3, 8, 12])
def test_has_duplicates_compares_whole_rows(width):
    rows = np.frombuffer(b"".join(f"{i:0{width}d}".encode() for i in (5, 17, 3)), np.uint8).reshape(
        3, width
    )
    assert not plaingroup.has_duplicates(rows)
    assert plaingroup.has_duplicates(np.concatenate([rows, rows[1:2]]))


@pytest.mark.parametrize("key_length", [6, 20])
def test_the_fast_path_leaves_a_duplicate_key_to_the_general_path(key_length):
    def archive(keys):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for key, extension in itertools.product(keys, ("jpg", "cls")):
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(key)
                tar.addfile(info, io.BytesIO(key.encode()))
        return buffer.getvalue()

    first, second = (f"{i:0{key_length}d}" for i in (1, 2))
    assert list(plaingroup.plain_tuples(archive([first, second]), "t.tar", ("__key__", "cls"))) == [
        (first, first.encode()),
        (second, second.encode()),
    ]
    repeated = archive([first, second, first])
    assert tarscan.scan_plain(repeated, "t.tar") is not None
    assert plaingroup.plain_tuples(repeated, "t.tar", ("jpg", "cls")) is None


@pytest.mark.parametrize("cut", [100, 700, 1030])
def test_a_truncated_buffer_is_caught_in_the_fast_path(cut):
    archive = make_tar(tarfile.USTAR_FORMAT, ["a.jpg", "b.jpg", "c.jpg"])
    with pytest.raises(tario.TarFormatError, match="t.tar is truncated"):
        tarscan.scan_buffer(archive[:cut], "t.tar")


def test_a_buffer_cut_before_the_end_blocks_is_read_with_a_warning():
    archive = make_tar(tarfile.USTAR_FORMAT, ["a.jpg", "b.jpg", "c.jpg"])
    cut = -(-len(archive.rstrip(b"\x00")) // 512) * 512
    with pytest.warns(UserWarning, match="t.tar ends after member 'c.jpg' without its end-of-arc"):
        assert [name for name, *_ in tarscan.scan_buffer(archive[:cut], "t.tar")] == [
            "a.jpg",
            "b.jpg",
            "c.jpg",
        ]


# --- bad input ------------------------------------------------------------------------------------


@pytest.fixture
def jpeg(tiny_dataset):
    return (
        tiny_dataset / imagefolder.load_manifest(tiny_dataset)["samples"][0]["path"]
    ).read_bytes()


@pytest.fixture
def bad_shards(tmp_path, urls, jpeg, write_tar):
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(Path(urls[0]).read_bytes()[:5000])
    return {
        "truncated": (str(truncated), tario.TarFormatError, r"truncated\.tar is truncated"),
        "missing label": (
            write_tar(
                tmp_path / "nolabel.tar", [("a.jpg", jpeg), ("a.cls", b"1"), ("b.jpg", jpeg)]
            ),
            ShardError,
            r"nolabel\.tar: sample 'b' has no '\.cls' member .*missing its label",
        ),
        "no image": (
            write_tar(
                tmp_path / "noimage.tar",
                [("a.jpg", jpeg), ("a.cls", b"1"), ("Thumbs.db", b"\0" * 8)],
            ),
            ShardError,
            r"noimage\.tar: sample 'Thumbs' has no '\.jpg' member \(it has: db\); a file that is",
        ),
        "duplicate key": (
            write_tar(
                tmp_path / "dup.tar",
                [
                    ("a.jpg", jpeg),
                    ("a.cls", b"1"),
                    ("b.jpg", jpeg),
                    ("b.cls", b"2"),
                    ("a.jpg", jpeg),
                    ("a.cls", b"1"),
                ],
            ),
            ShardError,
            r"dup\.tar: duplicate key 'a'",
        ),
        "duplicate member": (
            write_tar(tmp_path / "dupm.tar", [("a.jpg", jpeg), ("a.jpg", jpeg), ("a.cls", b"1")]),
            ShardError,
            r"dupm\.tar: duplicate member 'a\.jpg'",
        ),
        "missing file": (str(tmp_path / "nothere.tar"), FileNotFoundError, "nothere.tar"),
        "not an image": (
            write_tar(
                tmp_path / "notimage.tar",
                [("a.jpg", jpeg), ("a.cls", b"1"), ("b.jpg", b"oops"), ("b.cls", b"2")],
            ),
            ShardError,
            r"notimage\.tar: cannot decode sample 'b'",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "truncated",
        "missing label",
        "no image",
        "duplicate key",
        "duplicate member",
        "missing file",
        "not an image",
    ],
)
def test_bad_input_raises_an_error_naming_the_shard(bad_shards, case):
    shard, error, message = bad_shards[case]
    with pytest.raises(error, match=message):
        list(ShardDataset([shard], decode=case in ("not an image", "no image")))


@pytest.mark.parametrize(
    "case, shards, damaged, samples",
    [
        ("truncated", 0, 1, 0),
        ("missing label", 0, 0, 1),
        ("duplicate key", 0, 0, 1),
        ("duplicate member", 0, 0, 1),
        ("missing file", 1, 0, 0),
        ("not an image", 0, 0, 1),
    ],
)
def test_skipping_counts_what_was_left_out_and_reports_it(
    bad_shards, urls, all_keys, case, shards, damaged, samples
):
    shard = bad_shards[case][0]
    keys = ("__key__", "jpg", "cls") if case == "not an image" else ("__key__", "cls")
    dataset = ShardDataset([*urls, shard], keys=keys, decode=case == "not an image", errors="skip")
    with pytest.warns(UserWarning, match=f"skipped {shards} shard.* and {samples} sample"):
        keys = [item[0] for item in dataset]
    assert sorted(set(keys) - {"a", "b"}) == all_keys
    skips = dataset.last_skips
    assert (skips.shards, skips.damaged, skips.samples) == (shards, damaged, samples)


def test_a_damaged_shard_gives_the_samples_before_the_damage(urls):
    """With errors="skip", a shard cut short delivers its whole samples and reports the offset."""
    whole = [key for key, _ in ShardDataset(urls[:1], keys=("__key__", "cls"), decode=False)]
    data = Path(urls[0]).read_bytes()
    for cut in (len(data) // 3, len(data) // 2, len(data) - 2000):
        damaged = Path(urls[0]).with_name(f"cut-{cut}.tar")
        damaged.write_bytes(data[:cut])
        dataset = ShardDataset([str(damaged)], keys=("__key__", "cls"), decode=False, errors="skip")
        with pytest.warns(UserWarning, match=r"is truncated: .* at offset \d+"):
            keys = [key for key, _ in dataset]
        assert keys == whole[: len(keys)] and 0 < len(keys) < len(whole)
        skips = dataset.last_skips
        assert f"({len(keys)} whole sample(s) of it were read before)" in skips.reasons[-1]


@pytest.mark.parametrize("data", [b"not a tar" * 1000, b""], ids=["not a tar", "empty"])
def test_a_file_that_is_no_tar_is_an_unreadable_shard_not_a_damaged_one(tmp_path, data):
    path = tmp_path / "odd.tar"
    path.write_bytes(data)
    dataset = ShardDataset([str(path)], keys=("__key__", "cls"), decode=False, errors="skip")
    with pytest.warns(UserWarning, match=r"skipped 1 shard\(s\) and 0 sample"):
        assert list(dataset) == []
    assert (dataset.last_skips.shards, dataset.last_skips.damaged) == (1, 0)
    with pytest.raises(tario.TarFormatError, match="odd.tar"):
        list(ShardDataset([str(path)], keys=("__key__", "cls"), decode=False))


def test_a_corrupt_header_mid_shard_keeps_the_samples_before_it(urls):
    whole = [key for key, _ in ShardDataset(urls[:1], keys=("__key__", "cls"), decode=False)]
    data = bytearray(Path(urls[0]).read_bytes())
    offset = tarscan.scan_buffer(bytes(data))[2][1]  # the second sample's first member
    data[offset - 512] ^= 0xFF  # its header
    corrupt = Path(urls[0]).with_name("corrupt-header.tar")
    corrupt.write_bytes(bytes(data))
    dataset = ShardDataset([str(corrupt)], keys=("__key__", "cls"), decode=False, errors="skip")
    with pytest.warns(UserWarning, match=f"bad header checksum at offset {offset - 512}"):
        assert [key for key, _ in dataset] == whole[:1]
    with pytest.raises(tario.TarFormatError, match=f"bad header checksum at offset {offset - 512}"):
        list(ShardDataset([str(corrupt)], keys=("__key__", "cls"), decode=False))


def test_len_and_list_count_an_unreadable_shard_as_empty_when_skipping(bad_shards, urls, all_keys):
    dataset = ShardDataset(
        [*urls, bad_shards["missing file"][0]], keys=("__key__", "cls"), decode=False, errors="skip"
    )
    assert len(dataset) == len(all_keys)
    with pytest.warns(UserWarning, match="skipped 1 shard"):
        assert sorted(key for key, _ in list(dataset)) == all_keys  # list() asks for len() first


def test_the_transform_applies_to_the_image_wherever_it_is_in_the_keys(urls):
    label, image = next(
        iter(ShardDataset(urls, keys=("cls", "jpg"), transform=lambda image: "transformed"))
    )
    assert isinstance(label, int) and image == "transformed"


@pytest.mark.parametrize("options", [{"keys": ("__key__", "cls")}, {"decode": False}])
def test_a_transform_without_a_decoded_image_is_refused(urls, options):
    with pytest.raises(ValueError, match="transform applies to a decoded image"):
        ShardDataset(urls, transform=lambda image: image, **options)


def test_bad_arguments_are_refused(urls):
    with pytest.raises(ValueError, match="rank"):
        ShardDataset(urls, rank=2, world_size=2)
    with pytest.raises(ValueError, match="errors"):
        ShardDataset(urls, errors="ignore")
    with pytest.raises(ValueError, match="sizes"):
        ShardDataset(urls, sizes=[1])
    with pytest.raises(ValueError, match=r"keys='cls' is one string.*\('cls',\)"):
        ShardDataset(urls, keys="cls")
    with pytest.raises(ValueError, match="batch_size must be 0 or more, got -1"):
        ShardDataset(urls, batch_size=-1)
    for name, value in (("buffer_size", 2.5), ("buffer_size", None), ("read_ahead", None)):
        with pytest.raises(TypeError, match=f"{name} must be a whole number, got {value}"):
            ShardDataset(urls, **{name: value})


def zeroed_shard(tmp_path, size):
    """A shard of 6 samples whose members are ``size`` bytes, sample 3's first header zeroed."""
    samples = [(f"k{i}", {"bin": bytes([i + 1]) * size, "cls": b"1"}) for i in range(6)]
    path = write_tar(tmp_path / f"zeroed-{size}.tar", samples).path
    with tarfile.open(path) as tar:
        header = [member.offset for member in tar][6]
    data = bytearray(path.read_bytes())
    data[header : header + 512] = bytes(512)
    path.write_bytes(bytes(data))
    return path, header


@pytest.mark.parametrize("size", [10, 100_000])  # mapped, and read member by member
def test_a_header_overwritten_with_zeros_is_damage_not_the_end(tmp_path, size):
    path, offset = zeroed_shard(tmp_path, size)
    said = f"{path}: a zero block at offset {offset}, then data"
    with pytest.raises(tario.TarFormatError, match=re.escape(said)):
        list(ShardDataset([str(path)], keys=("__key__",), decode=False))
    skipping = ShardDataset([str(path)], keys=("__key__",), decode=False, errors="skip")
    with pytest.warns(UserWarning, match="the rest of 1 damaged shard"):
        assert [key for (key,) in skipping] == ["k0", "k1", "k2"]
    with pytest.raises(tario.TarFormatError, match=re.escape(said)):
        list(tario.stream_members(io.BytesIO(path.read_bytes()), str(path)))


def test_a_tar_that_ends_in_one_zero_block_or_many_reads_whole(tmp_path):
    whole = write_tar(tmp_path / "a.tar", [("k", {"cls": b"1"})]).path.read_bytes()
    for name, data in [("one", whole[:-512]), ("padded", whole + bytes(10240))]:
        (tmp_path / f"{name}.tar").write_bytes(data)
        found = ShardDataset([str(tmp_path / f"{name}.tar")], keys=("__key__",), decode=False)
        assert [key for (key,) in found] == ["k"]


def test_the_skip_warning_comes_every_epoch(urls, tmp_path):
    dataset = ShardDataset(
        [*urls[:1], str(tmp_path / "missing.tar")], keys=("__key__",), decode=False, errors="skip"
    )
    for epoch in range(2):
        dataset.set_epoch(epoch)
        with pytest.warns(UserWarning, match="skipped 1 shard"):
            list(dataset)


@pytest.mark.parametrize("extension", ["png", "npy"])
def test_an_image_too_large_for_pil_or_an_empty_array_is_a_counted_skip(tmp_path, extension):
    huge = io.BytesIO()
    Image.new("1", (20_000, 20_000)).save(huge, format="PNG")  # 2 KB, 400 million pixels
    data = {"png": huge.getvalue(), "npy": b""}[extension]
    shard = write_tar(tmp_path / "a.tar", [("a", {extension: data, "cls": b"1"})]).path
    dataset = ShardDataset([str(shard)], keys=(extension, "cls"), errors="skip")
    with pytest.warns(UserWarning, match="cannot decode sample 'a'"):
        assert list(dataset) == []
    assert dataset.last_skips.samples == 1


def test_escaped_question_marks_and_hashes_in_a_url_path_are_other_shards():
    escaped = ["http://h/a%3Fx=1.tar", "http://h/a?x=1.tar", "http://h/a%23b.tar"]
    assert expand_shards(escaped) == escaped


def test_a_rank_given_leaves_the_environment_alone(urls, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv("RANK", raising=False)
    dataset = ShardDataset(urls, rank=1, world_size=2)
    assert (dataset.rank, dataset.world_size) == (1, 2)
