"""Reading a local shard of large members member by member: the same samples as ``tarfile`` and the
mapped path, every unusual or damaged shard left to the mapped path (which names the damage), a file
cut short while read named with its member and offset, and no file left open."""

import gzip
import io
import os
import random
import sys
import tarfile
import threading
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from packdata import memberread, streaming, tario
from packdata.layout import keys_digest
from packdata.plaingroup import plain_tuples
from packdata.shardread import mapped
from packdata.streaming import ShardDataset

KEYS = ("__key__", "jpg", "cls")
# member sizes about the window's edge: a label that just fits in the read at its header, one that
# does not, one of no bytes
LABELS = [b"", b"7", bytes(memberread.WINDOW - 512), bytes(memberread.WINDOW - 511)]


def write_tar(path, members, **options):
    """A tar of ``(name, bytes)`` members at ``path`` (``options`` go to ``tarfile.open``); returns
    the path as a string."""
    options.setdefault("format", tarfile.USTAR_FORMAT)
    with tarfile.open(path, "w", **options) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return str(path)


def photo_members(samples=12, seed=0):
    """Samples of a large ``.jpg`` (30 to 90 KB, some a whole number of blocks) and a ``.cls``."""
    rng = random.Random(seed)
    members = []
    for index in range(samples):
        size = rng.choice([30_000, 61_440, 90_001, rng.randrange(30_000, 90_000)])
        members.append((f"{index:06d}.jpg", rng.randbytes(size)))
        members.append((f"{index:06d}.cls", LABELS[index % len(LABELS)]))
    return members


def tarfile_tuples(path):
    """``(key, jpg, cls)`` of every sample, as Python's ``tarfile`` reads the members."""
    with tarfile.open(path) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]
    pairs = zip(members[::2], members[1::2])
    return [(jpg[0].split(".")[0], jpg[1], cls[1]) for jpg, cls in pairs]


@pytest.fixture
def photo_shard(tmp_path):
    return write_tar(tmp_path / "photos.tar", photo_members())


def test_large_members_are_read_one_by_one_as_tarfile_reads_them(photo_shard):
    by_member = memberread.member_tuples(photo_shard, KEYS)
    assert by_member is not None  # this shard takes the member-by-member path
    expected = tarfile_tuples(photo_shard)
    assert list(by_member) == expected == list(plain_tuples(mapped(photo_shard), photo_shard, KEYS))


def test_the_stream_reads_such_shards_member_by_member(photo_shard, monkeypatch):
    results = []

    def recorded(*args):
        results.append(memberread.member_tuples(*args))
        return results[-1]

    monkeypatch.setattr(streaming, "member_tuples", recorded)
    dataset = ShardDataset([photo_shard], shuffle=False, keys=KEYS, decode=False)
    assert list(dataset) == tarfile_tuples(photo_shard)
    assert len(results) == 1 and results[0] is not None


def test_a_resumed_epoch_reads_the_buffered_shards_again_member_by_member(tmp_path, monkeypatch):
    shards = [write_tar(tmp_path / f"s{n}.tar", photo_members(samples=6, seed=n)) for n in range(2)]
    first = ShardDataset(shards, seed=3, buffer_size=4, keys=KEYS, decode=False)
    stream = first.iterate()
    before = [next(stream) for _ in range(5)]
    state = first.state_dict()
    results = []

    def recorded(*args):
        results.append(memberread.member_tuples(*args))
        return results[-1]

    monkeypatch.setattr(streaming, "member_tuples", recorded)
    resumed = ShardDataset(shards, seed=3, buffer_size=4, keys=KEYS, decode=False)
    resumed.load_state_dict(state)
    after = list(resumed.iterate())
    assert sorted(before + after) == sorted(t for shard in shards for t in tarfile_tuples(shard))
    # the shard the buffer held samples of is read again, and the one the stream stopped in
    assert len(results) >= 2 and None not in results  # every read by member


def test_two_workers_get_every_sample_once(tmp_path):
    shards = [write_tar(tmp_path / f"s{n}.tar", photo_members(samples=5, seed=n)) for n in range(4)]
    dataset = ShardDataset(shards, keys=("__key__", "__url__"), decode=False)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    read = sorted((url, key) for key, url in loader)
    assert read == sorted((url, f"{n:06d}") for url in shards for n in range(5))


def without_end_block(data):
    data = data.rstrip(b"\0")
    return data + bytes(-len(data) % 512)


# a photo shard's bytes -> an unusual or damaged shard's
DAMAGED = {
    "gzip-compressed": gzip.compress,
    "cut in a member": lambda data: data[:100_000],
    "cut at a header": lambda data: data[
        : 512 + int(data[124:135], 8) + -int(data[124:135], 8) % 512
    ],
    "no end block": without_end_block,
    "not a tar": lambda data: b"hello" * 1000,
    "empty": lambda data: b"",
}
ODD = ["small members", "pax records", *DAMAGED]


def odd_shard(tmp_path, case):
    """A shard of ``case`` in ``ODD``."""
    if case == "small members":
        return write_tar(tmp_path / "small.tar", [(f"{n:06d}.cls", b"1") for n in range(50)])
    if case == "pax records":
        return write_tar(
            tmp_path / "pax.tar",
            photo_members(),
            format=tarfile.PAX_FORMAT,
            pax_headers={"comment": "a pax record"},
        )
    data = Path(write_tar(tmp_path / "photos.tar", photo_members())).read_bytes()
    odd = tmp_path / f"{case}.tar"
    odd.write_bytes(DAMAGED[case](data))
    return str(odd)


@pytest.mark.parametrize("case", ODD)
def test_an_unusual_or_damaged_shard_is_left_to_the_mapped_path(tmp_path, case):
    shard = odd_shard(tmp_path, case)
    assert memberread.member_tuples(shard, ("__key__",)) is None


def test_a_bad_checksum_is_named_by_the_mapped_path(tmp_path):
    members = photo_members()
    shard = write_tar(tmp_path / "photos.tar", members)
    data = bytearray(Path(shard).read_bytes())
    second = 512 + len(members[0][1]) + -len(members[0][1]) % 512  # the second member's header
    data[second + 3] ^= 1
    Path(shard).write_bytes(bytes(data))
    assert memberread.member_tuples(shard, KEYS) is None
    with pytest.raises(tario.TarFormatError, match=f"bad header checksum at offset {second}"):
        list(ShardDataset([shard], keys=KEYS, decode=False))


def test_a_shard_cut_short_while_read_names_the_member_and_its_offset(photo_shard):
    samples = memberread.member_tuples(photo_shard, KEYS)
    next(samples)
    os.truncate(photo_shard, 200_000)
    cut = r"photos.tar is truncated: member '0000\d\d.jpg' at offset \d+: [\d,]+ of its"
    with pytest.raises(tario.TarFormatError, match=cut):
        list(samples)


def test_with_skip_a_shard_cut_short_while_read_keeps_what_came_before(photo_shard):
    expected = tarfile_tuples(photo_shard)
    dataset = ShardDataset([photo_shard], shuffle=False, keys=KEYS, decode=False, errors="skip")
    samples = iter(dataset)
    first = next(samples)
    os.truncate(photo_shard, 200_000)
    with pytest.warns(UserWarning, match=r"cut short while it was read\?\) \(\d+ whole sample"):
        read = [first, *samples]
    assert read == expected[: len(read)] and 0 < len(read) < len(expected)
    assert dataset.last_skips.damaged == 1


def test_a_member_read_in_several_reads_comes_back_whole(photo_shard, monkeypatch):
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, offset: real(fd, min(n, 5000), offset))
    assert list(memberread.member_tuples(photo_shard, KEYS)) == tarfile_tuples(photo_shard)


def test_the_file_is_closed_when_read_to_the_end_or_dropped(tmp_path, photo_shard, monkeypatch):
    opened = []

    def recorded(*args, **kwargs):
        opened.append(open(*args, **kwargs))  # noqa: SIM115 (the reader closes it)
        return opened[-1]

    monkeypatch.setattr(memberread, "open", recorded, raising=False)
    list(memberread.member_tuples(photo_shard, KEYS))
    samples = memberread.member_tuples(photo_shard, KEYS)
    next(samples)
    assert [file.closed for file in opened] == [True, False]
    del samples
    unstarted = memberread.member_tuples(photo_shard, KEYS)
    del unstarted
    assert memberread.member_tuples(odd_shard(tmp_path, "small members"), KEYS) is None
    assert len(opened) == 4 and all(file.closed for file in opened)


def walks_counted(monkeypatch):
    """A list that grows by one each time a shard's headers are walked."""
    walks, real = [], memberread.walk_headers

    def counted(*args):
        walks.append(args)
        return real(*args)

    monkeypatch.setattr(memberread, "walk_headers", counted)
    return walks


def test_a_shard_read_again_skips_the_walk_and_reads_the_same_samples(photo_shard, monkeypatch):
    walks = walks_counted(monkeypatch)
    dataset = ShardDataset([photo_shard], shuffle=False, keys=KEYS, decode=False)
    epochs = [list(dataset) for _ in range(3)]
    assert epochs == [tarfile_tuples(photo_shard)] * 3
    assert len(walks) == 1  # the later epochs read where the shard's table says


def test_a_shard_rewritten_since_its_last_read_is_walked_again(tmp_path, monkeypatch):
    walks = walks_counted(monkeypatch)
    shard = write_tar(tmp_path / "photos.tar", photo_members(seed=1))
    list(memberread.member_tuples(shard, KEYS))
    write_tar(tmp_path / "photos.tar", photo_members(seed=2))
    assert list(memberread.member_tuples(shard, KEYS)) == tarfile_tuples(shard)
    assert len(walks) == 2


def stamp_kept(shard):
    """Give the table kept of ``shard`` the stamp of the file there now: a file rewritten within one
    tick of a coarse clock, or through a shared mapping, can keep its size, inode and times."""
    status = os.stat(shard)
    stamp = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)
    tables = memberread.TABLES.tables
    tables[shard] = tables[shard]._replace(stamp=stamp)


def rewritten(path, members):
    """``path`` written again with ``members`` under the stamp its table kept."""
    shard = write_tar(Path(path).with_suffix(".new"), members)
    os.replace(shard, path)
    stamp_kept(path)


def test_a_shard_changed_under_an_unchanged_stamp_is_named_and_forgotten(tmp_path):
    shard = write_tar(tmp_path / "photos.tar", photo_members(samples=4, seed=1))
    list(memberread.member_tuples(shard, KEYS))
    members = photo_members(samples=4, seed=1)
    members[2:4] = [("000009.jpg", members[2][1]), ("000009.cls", members[3][1])]
    rewritten(shard, members)
    samples = memberread.member_tuples(shard, KEYS)
    assert next(samples)[0] == "000000"
    changed = r"photos.tar changed since this process last read it: the header of member '000001"
    with pytest.raises(tario.TarFormatError, match=changed + r"\.jpg' at offset \d+ is not"):
        next(samples)
    assert shard not in memberread.TABLES.tables
    assert list(memberread.member_tuples(shard, KEYS)) == tarfile_tuples(shard)


def grown(members, index, by):
    """``members`` with member ``index``'s bytes ``by`` bytes longer."""
    name, data = members[index]
    return [*members[:index], (name, data + bytes(by)), *members[index + 1 :]]


CHANGES = {
    # an image a few bytes longer, within its padding: no header moves
    "image within its padding": (KEYS, lambda m: grown(m, 4, (-len(m[4][1]) % 512) // 2 or 512)),
    "the last image": (KEYS, lambda m: grown(m, len(m) - 2, 1024)),
    "a sample added at the end": (KEYS, lambda m: [*m, ("000099.jpg", b"x"), ("000099.cls", b"")]),
}


@pytest.mark.parametrize("change", CHANGES)
def test_every_member_read_again_is_checked_by_its_header(tmp_path, change):
    keys, changed = CHANGES[change]
    shard = write_tar(tmp_path / "photos.tar", photo_members(samples=6, seed=1))
    list(memberread.member_tuples(shard, keys))
    rewritten(shard, changed(photo_members(samples=6, seed=1)))
    with pytest.raises(tario.TarFormatError, match="changed since this process last read it"):
        list(memberread.member_tuples(shard, keys))
    assert list(memberread.member_tuples(shard, KEYS)) == tarfile_tuples(shard)


@pytest.mark.parametrize("order", ["labels first", "large members only"])
def test_other_layouts_read_again_are_checked_too(tmp_path, order):
    members = photo_members(samples=6, seed=1)
    if order == "labels first":
        members = [m for pair in zip(members[1::2], members[::2]) for m in pair]
        keys = KEYS
    else:
        members = [
            (n.replace(".cls", ".npy"), d if n.endswith(".jpg") else bytes(5_000))
            for n, d in members
        ]
        keys = ("__key__", "jpg", "npy")
    shard = write_tar(tmp_path / "photos.tar", members)
    first = list(memberread.member_tuples(shard, keys))
    assert list(memberread.member_tuples(shard, keys)) == first  # from the table
    rewritten(shard, grown(members, 3, 700))
    with pytest.raises(tario.TarFormatError, match="changed since this process last read it"):
        list(memberread.member_tuples(shard, keys))


@pytest.mark.parametrize("keys", [("__key__",), ("__key__", "jpg"), ("cls", "__key__")])
def test_a_shard_read_in_part_is_walked_again(photo_shard, monkeypatch, keys):
    # the headers of the members left unread could not be checked
    walks = walks_counted(monkeypatch)
    list(memberread.member_tuples(photo_shard, KEYS))
    read = list(memberread.member_tuples(photo_shard, keys))
    assert len(walks) == 2
    columns = {"__key__": 0, "jpg": 1, "cls": 2}
    expected = [tuple(t[columns[key]] for key in keys) for t in tarfile_tuples(photo_shard)]
    assert read == expected


def test_threads_share_the_tables(tmp_path, monkeypatch):
    shards = [write_tar(tmp_path / f"s{n}.tar", photo_members(samples=3, seed=n)) for n in range(4)]
    expected = {shard: tarfile_tuples(shard) for shard in shards}
    tables = memberread.Tables(limit=10**9)
    monkeypatch.setattr(memberread, "TABLES", tables)
    list(memberread.member_tuples(shards[0], KEYS))
    tables.limit = 2.5 * tables.nbytes  # some kept, some let go, all the time
    read = []

    def reader(seed):
        order = random.Random(seed).choices(shards, k=500)
        read.extend(list(memberread.member_tuples(s, KEYS)) == expected[s] for s in order)

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert read == [True] * 2000
    assert tables.nbytes == sum(table.nbytes for table in tables.tables.values()) <= tables.limit


def test_a_shard_cut_short_while_read_again_names_the_member(photo_shard):
    list(memberread.member_tuples(photo_shard, KEYS))
    samples = memberread.member_tuples(photo_shard, KEYS)
    next(samples)
    os.truncate(photo_shard, 200_000)
    with pytest.raises(tario.TarFormatError, match=r"truncated: member '0000\d\d.(jpg|cls)'"):
        list(samples)


def test_a_shard_read_again_in_several_reads_comes_back_whole(photo_shard, monkeypatch):
    list(memberread.member_tuples(photo_shard, KEYS))
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, offset: real(fd, min(n, 600), offset))
    assert list(memberread.member_tuples(photo_shard, KEYS)) == tarfile_tuples(photo_shard)


def test_tables_are_kept_up_to_their_limit_the_least_recently_read_let_go(tmp_path, monkeypatch):
    shards = [write_tar(tmp_path / f"s{n}.tar", photo_members(seed=n)) for n in range(3)]
    tables = memberread.Tables(limit=0)
    monkeypatch.setattr(memberread, "TABLES", tables)
    list(memberread.member_tuples(shards[0], KEYS))
    assert tables.tables == {} and tables.nbytes == 0
    tables.limit = 10**9
    list(memberread.member_tuples(shards[0], KEYS))
    one = tables.nbytes
    assert one == tables.tables[shards[0]].nbytes
    tables.limit = 2.5 * one  # the shards have as many members, of the same names
    for shard in (shards[1], shards[0], shards[2]):
        list(memberread.member_tuples(shard, KEYS))
    assert list(tables.tables) == [shards[0], shards[2]] and tables.nbytes == 2 * one


def test_a_shard_walked_again_tells_seen_its_keys_once(tmp_path):
    shard = write_tar(tmp_path / "photos.tar", photo_members(samples=4, seed=1))
    list(memberread.member_tuples(shard, KEYS))
    renamed = [(f"1{name[1:]}", data) for name, data in photo_members(samples=4, seed=1)]
    rewritten(shard, renamed)  # the same sizes, other keys: the first header differs
    seen = []
    assert list(memberread.member_tuples(shard, KEYS, seen.append)) == tarfile_tuples(shard)
    assert seen == [keys_digest([f"1{index:05d}".encode() for index in range(4)])]


@pytest.mark.parametrize("where", ["first image", "first label"])
def test_a_change_the_stamp_missed_seen_in_the_first_sample_is_walked_again(
    tmp_path, monkeypatch, where
):
    walks = walks_counted(monkeypatch)
    shard = write_tar(tmp_path / "photos.tar", photo_members(samples=4, seed=1))
    list(memberread.member_tuples(shard, KEYS))
    members = photo_members(samples=4, seed=1)
    if where == "first image":
        members = grown(members, 0, 512)
    else:  # "7" to "70": a new size, no header moves
        members[1] = (members[1][0], members[1][1] + b"0" if members[1][1] else b"0")
    rewritten(shard, members)
    assert list(memberread.member_tuples(shard, KEYS)) == tarfile_tuples(shard)
    assert len(walks) == 2
