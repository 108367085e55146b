import io
import itertools
import json
import os
import tarfile
from pathlib import Path

import pytest
import webdataset

from packdata import tarindex
from packdata.datasets import IndexedTarDataset
from packdata.packing import pack_tar
from packdata.tarindex import StaleIndexError, build_index, index_members, index_path, load_index
from packdata.tario import (
    BLOCK,
    TarFormatError,
    iter_members,
    parse_header,
    pread_exactly,
    stream_members,
)
from packdata.tarscan import iter_buffer, scan_buffer

LONG_NAME = "deep/" * 30 + "sample.jpg"  # 160 characters: more than ustar's 100-byte name field
MTIME = 1_700_000_000.25  # pax keeps the fraction; ustar and GNU headers hold whole seconds
# the 2nd needs a prefix
NAMES = ["a.txt", "folder/" + "x" * 90 + ".jpg", LONG_NAME, "ünïcode.cls", "last.bin"]


class Stream(io.RawIOBase):
    """A file that can only be read front to back, like a pipe or an HTTP response."""

    def __init__(self, data):
        self.source = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, buffer):
        return self.source.readinto(buffer)


def named_members(names=NAMES):
    """Members of ``names`` (contents derived from each name, owners and times set) plus a
    symlink."""
    members = []
    for index, name in enumerate(names):
        info = tarfile.TarInfo(name)
        info.mtime, info.uid, info.uname = MTIME, 1000 + index, f"user{index}"
        members.append((info, (name * index).encode()))
    link = tarfile.TarInfo("link-to-a")
    link.type, link.linkname = tarfile.SYMTYPE, "a.txt"
    return [*members, (link, None)]


def as_tarfile_sees_it(path):
    with tarfile.open(path) as tar:
        return [
            (
                i.name,
                i.size,
                i.mode,
                i.mtime,
                i.type.decode(),
                i.linkname,
                i.uid,
                i.gid,
                i.uname,
                i.gname,
                i.offset_data,
            )
            for i in tar.getmembers()
        ]


def as_we_see_it(fileobj, name=None):
    return [
        (
            h.name,
            h.size,
            h.mode,
            h.mtime,
            h.typeflag,
            h.linkname,
            h.uid,
            h.gid,
            h.uname,
            h.gname,
            offset,
        )
        for h, offset in iter_members(fileobj, name)
    ]


@pytest.mark.parametrize(
    "tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]
)
def test_headers_agree_with_tarfile(tmp_path, tar_format, write_tar):
    # ustar: no room
    names = NAMES if tar_format != tarfile.USTAR_FORMAT else [n for n in NAMES if n != LONG_NAME]
    path = Path(write_tar(tmp_path / "t.tar", named_members(names), tar_format))
    with path.open("rb") as file:
        assert as_we_see_it(file) == as_tarfile_sees_it(path)


def test_pax_headers_override_name_and_mtime(tmp_path, write_tar):
    path = Path(write_tar(tmp_path / "t.tar", named_members(), tarfile.PAX_FORMAT))
    with path.open("rb") as file:
        headers = [header for header, _ in iter_members(file)]
    assert [h.name for h in headers if h.is_file] == NAMES
    assert headers[0].mtime == MTIME


def test_gnu_base256_numbers(tmp_path):
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("big-uid")
        info.uid = 8**8  # too large for 7 octal digits: GNU writes base-256
        tar.addfile(info)
    with path.open("rb") as file:
        assert next(iter_members(file))[0].uid == 8**8


def test_a_size_of_twelve_octal_digits_is_read_whole_as_tarfile_reads_it(tmp_path):
    info = tarfile.TarInfo("a.bin")
    info.size = 512
    header = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    header[124:136] = b"000000001000"  # 12 digits, no NUL after them: POSIX allows it
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    path = tmp_path / "t.tar"
    path.write_bytes(bytes(header) + bytes(range(256)) * 2 + bytes(1024))
    assert [(name, size) for name, _, size in scan_buffer(path.read_bytes())] == [("a.bin", 512)]
    assert [(header.name, header.size) for header, _ in read_file(path)] == [("a.bin", 512)]
    with tarfile.open(path) as tar:
        assert [(member.name, member.size) for member in tar] == [("a.bin", 512)]


def as_tarfile_reads_it(path):
    """``[(name, bytes)]`` of every member ``tarfile.extractfile`` reads: files, and links as the
    file they name."""
    with tarfile.open(path) as tar:
        readable = [i for i in tar.getmembers() if i.isfile() or i.islnk() or i.issym()]
        return [(i.name, tar.extractfile(i).read()) for i in readable]


def test_members_come_with_their_data_also_from_a_stream(tmp_path, write_tar):
    path = Path(write_tar(tmp_path / "t.tar", named_members(), tarfile.PAX_FORMAT))
    assert list(iter_buffer(path.read_bytes())) == as_tarfile_reads_it(path)
    assert as_we_see_it(Stream(path.read_bytes()), name="stream") == as_tarfile_sees_it(path)


@pytest.mark.parametrize("seekable", [True, False])
def test_stream_members_hands_out_each_regular_files_data_as_tarfile_reads_it(
    tmp_path, seekable, write_tar
):
    path = Path(write_tar(tmp_path / "t.tar", named_members(), tarfile.PAX_FORMAT))
    fileobj = path.open("rb") if seekable else Stream(path.read_bytes())
    with fileobj:
        found = [(h.name, data) for h, data in stream_members(fileobj, "t.tar") if h.is_file]
    with tarfile.open(path) as tar:
        expected = [(i.name, tar.extractfile(i).read()) for i in tar.getmembers() if i.isfile()]
    assert found == expected


def test_a_webdataset_shard_is_read_like_tarfile_reads_it(tmp_path):
    pattern = str(tmp_path / "shard-%06d.tar")
    with webdataset.ShardWriter(pattern, maxcount=1000, verbose=0) as writer:
        for index in range(5):
            writer.write(
                {"__key__": f"{index:06d}", "jpg": bytes([index]) * (100 + index), "cls": index % 3}
            )
    path = tmp_path / "shard-000000.tar"
    with path.open("rb") as file:
        headers = as_we_see_it(file)
    assert headers == as_tarfile_sees_it(path)
    assert [name for name, *_ in headers][:4] == [
        "000000.cls",
        "000000.jpg",
        "000001.cls",
        "000001.jpg",
    ]
    assert b" mtime=" in path.read_bytes()  # webdataset's float mtimes went into pax headers


def test_parse_header_verifies_the_checksum_and_names_archive_and_offset(tmp_path, write_tar):
    path = Path(
        write_tar(tmp_path / "t.tar", named_members(["a.txt", "b.txt"]), tarfile.USTAR_FORMAT)
    )
    second = as_tarfile_sees_it(path)[1][-1] - BLOCK
    block = bytearray(path.read_bytes()[second : second + BLOCK])
    assert parse_header(bytes(block), "t.tar", second).name == "b.txt"
    block[0] ^= 1
    with pytest.raises(TarFormatError, match=f"t.tar: bad header checksum at offset {second}"):
        parse_header(bytes(block), "t.tar", second)
    assert parse_header(bytes(BLOCK)) is None
    with pytest.raises(ValueError, match="512"):
        parse_header(b"short")


def test_garbage_is_not_a_tar(tmp_path):
    path = tmp_path / "garbage.tar"
    path.write_bytes(os.urandom(4 * BLOCK))
    with (
        path.open("rb") as file,
        pytest.raises(TarFormatError, match=f"{path}: bad header checksum at offset 0"),
    ):
        list(iter_members(file))


@pytest.mark.parametrize(
    "cut, expected",
    [
        (
            lambda offsets: offsets[2] + 3,
            r"member 'ünïcode.cls' at offset \d+ needs 26 bytes, only 3 are left",
        ),
        (
            lambda offsets: offsets[2] - BLOCK + 100,
            r"the header at offset \d+ \(after member 'folder/x+\.jpg'\) needs 512 bytes, only 100 "
            r"are left",
        ),
    ],
)
@pytest.mark.parametrize("seekable", [True, False])
def test_a_truncated_tar_names_the_archive_and_the_member(
    tmp_path, cut, expected, seekable, write_tar
):
    names = [n for n in NAMES if n != LONG_NAME]
    path = Path(write_tar(tmp_path / "t.tar", named_members(names), tarfile.USTAR_FORMAT))
    offsets = [row[-1] for row in as_tarfile_sees_it(path) if row[0] in names]
    data = path.read_bytes()[: cut(offsets)]
    path.write_bytes(data)
    fileobj = path.open("rb") if seekable else Stream(data)
    with fileobj, pytest.raises(TarFormatError, match=f"{path} is truncated: {expected}"):
        list(iter_members(fileobj, name=str(path)))


@pytest.mark.parametrize("seekable", [True, False])
def test_a_tar_without_its_end_blocks_is_read_with_a_warning(tmp_path, seekable, write_tar):
    path = Path(write_tar(tmp_path / "t.tar", named_members(["a.txt", "b.txt"])))
    data = path.read_bytes().rstrip(b"\0")
    data += bytes(-len(data) % BLOCK)  # the last member's padding stays: cut at its end
    path.write_bytes(data)
    missing = r"ends after member 'link-to-a' without its end-of-archive blocks: read to there"
    with pytest.warns(UserWarning, match=missing):
        assert list(iter_buffer(data, "t.tar")) == as_tarfile_reads_it(path)
    fileobj = path.open("rb") if seekable else Stream(data)
    with fileobj, pytest.warns(UserWarning, match=missing):
        assert [h.name for h, _ in iter_members(fileobj)] == ["a.txt", "b.txt", "link-to-a"]


def test_index_offsets_point_at_each_members_data(tmp_path, write_tar):
    path = Path(write_tar(tmp_path / "t.tar", named_members(), tarfile.PAX_FORMAT))
    index = build_index(path)
    blob = path.read_bytes()
    expected = dict(as_tarfile_reads_it(path))
    assert list(index) == list(expected)
    assert {
        name: blob[offset : offset + size] for name, (offset, size) in index.items()
    } == expected
    stored = json.loads(index_path(path).read_text())
    assert (stored["tar_size"], stored["tar_mtime_ns"]) == (
        path.stat().st_size,
        path.stat().st_mtime_ns,
    )
    assert index_path(path).name == "t.tar.idx.json"


def test_load_index_uses_a_current_index_and_rebuilds_a_stale_one(
    tmp_path, tiny_dataset, monkeypatch
):
    path = pack_tar(tiny_dataset, tmp_path / "t.tar", progress=False)
    built = build_index(path)
    monkeypatch.setattr(
        tarindex, "build_index", lambda _: pytest.fail("a current index was rebuilt")
    )
    assert load_index(path, rebuild=False) == load_index(path) == built
    monkeypatch.undo()

    pack_tar(tiny_dataset, path, payload="raw", progress=False)  # same name, new content
    with pytest.raises(StaleIndexError, match=f"the index of {path} is stale: it is of a tar of"):
        load_index(path, rebuild=False)
    rebuilt = load_index(path)
    assert rebuilt != built and rebuilt["000000.npy"][0] == built["000000.jpg"][0]
    assert load_index(path, rebuild=False) == rebuilt


def test_a_touched_tar_makes_its_index_stale(tmp_path, write_tar):
    path = Path(write_tar(tmp_path / "t.tar", named_members(["a.txt"]), tarfile.USTAR_FORMAT))
    build_index(path)
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 1))
    with pytest.raises(StaleIndexError, match="stale: the tar was modified after it was indexed"):
        load_index(path, rebuild=False)


def test_a_folder_that_refuses_the_index_file_keeps_it_in_memory(tmp_path, monkeypatch, write_tar):
    path = Path(write_tar(tmp_path / "t.tar", named_members(["a.txt"]), tarfile.USTAR_FORMAT))

    # what mkstemp meets in a read-only folder (root ignores permissions, so it is staged)
    def refused(target):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tarindex, "written_atomically", refused)
    with pytest.warns(UserWarning, match="cannot store the index of .*t.tar next to it"):
        assert load_index(path) == {"a.txt": (BLOCK, 0), "link-to-a": (BLOCK, 0)}
    assert not index_path(path).exists()


def test_a_missing_or_unreadable_index(tmp_path, write_tar):
    path = Path(write_tar(tmp_path / "t.tar", named_members(["a.txt"]), tarfile.USTAR_FORMAT))
    with pytest.raises(StaleIndexError, match="is missing"):
        load_index(path, rebuild=False)
    index_path(path).write_text("{not json")
    assert list(load_index(path)) == ["a.txt", "link-to-a"]
    stored = json.loads(index_path(path).read_text())["members"]
    assert stored == {"a.txt": [BLOCK, 0], "link-to-a": [BLOCK, 0]}


def test_a_malformed_pax_header_names_archive_and_offset(tmp_path):
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        pax = tarfile.TarInfo("pax")
        pax.type, pax.size = tarfile.XHDTYPE, 9
        tar.addfile(pax, io.BytesIO(b"3 path=x\n"))  # the record claims 3 bytes but runs to 9
        tar.addfile(tarfile.TarInfo("a.txt"))
    with (
        path.open("rb") as file,
        pytest.raises(TarFormatError, match=f"{path}: malformed pax header at offset 0"),
    ):
        list(iter_members(file))


def write_pax_tar(path, records, names=("a.jpg", "b.jpg")):
    """A pax tar of ``names`` (3 bytes each) whose first member's pax header holds ``records``."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for index, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = 3, records if index == 0 else {}
            tar.addfile(info, io.BytesIO(b"abc"))
    return path


def read_file(path):
    with path.open("rb") as file:
        # a walk going round in circles stops at 10 members
        return list(itertools.islice(iter_members(file), 10))


READERS = {
    "buffer": lambda path: scan_buffer(path.read_bytes(), str(path)),
    "file": read_file,
    "stream": lambda path: list(
        itertools.islice(iter_members(Stream(path.read_bytes()), str(path)), 10)
    ),
}


@pytest.mark.parametrize(
    "size, reader",
    [
        (-512, "buffer"),
        (-512, "file"),
        (-512, "stream"),
        # -1536, "buffer": a hang if broken
        (-1536, "file"),
        (-1536, "stream"),
    ],
)
def test_a_negative_size_is_refused_not_walked_backwards(tmp_path, size, reader):
    # the pax header at 0, a.jpg's header at 1024
    path = write_pax_tar(tmp_path / "t.tar", {"size": str(size)})
    with pytest.raises(
        TarFormatError,
        match=rf"{path}: member 'a.jpg' at offset 1024 has a negative size \({size}\)",
    ):
        READERS[reader](path)


@pytest.mark.parametrize(
    "records, expected",
    [
        (
            {"size": "abc"},
            r"bad pax record size='abc' in the header at offset 0: invalid literal for int",
        ),
        (
            {"mtime": "soon"},
            r"bad pax record mtime='soon' in the header at offset 0: could not convert",
        ),
    ],
)
@pytest.mark.parametrize("reader", READERS)
def test_a_bad_pax_value_names_archive_and_offset(tmp_path, records, expected, reader):
    path = write_pax_tar(tmp_path / "t.tar", records)
    with pytest.raises(TarFormatError, match=f"{path}: {expected}"):
        READERS[reader](path)


def test_a_pax_key_that_is_not_utf8_names_archive_and_offset(tmp_path):
    path = tmp_path / "t.tar"
    record = b" \xffkey=value\n"
    record = str(len(record) + 2).encode() + record  # the length counts its own two digits
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        pax = tarfile.TarInfo("pax")
        pax.type, pax.size = tarfile.XHDTYPE, len(record)
        tar.addfile(pax, io.BytesIO(record))
        tar.addfile(tarfile.TarInfo("a.txt"))
    for reader in READERS.values():
        with pytest.raises(
            TarFormatError, match=f"{path}: malformed pax header at offset 0: 'utf-8' codec"
        ):
            reader(path)


def test_indexing_refuses_a_member_name_seen_twice(tmp_path, write_tar):
    names = ["a.jpg", "a.cls", "b.jpg", "b.cls", "a.jpg", "a.cls"]
    path = Path(write_tar(tmp_path / "t.tar", [(name, b"1") for name in names]))
    with pytest.raises(
        TarFormatError, match=f"{path}: duplicate member 'a.jpg', at offsets 0 and 4096"
    ):
        build_index(path)
    with pytest.raises(TarFormatError, match="duplicate member 'a.jpg'"), path.open("rb") as file:
        index_members(file)
    with pytest.raises(TarFormatError, match="duplicate member 'a.jpg'"):
        IndexedTarDataset(path)


def test_a_label_that_is_not_a_number_names_the_archive_and_member(tmp_path, write_tar):
    path = write_tar(tmp_path / "t.tar", [("a.jpg", b"not decoded yet"), ("a.cls", b"cat")])
    with pytest.raises(
        ValueError, match=f"member 'a.cls' of {path} holds b'cat', not an integer label"
    ):
        IndexedTarDataset(path)


@pytest.mark.parametrize("reader", READERS)
def test_a_size_past_any_end_is_a_truncated_tar_even_from_a_stream(tmp_path, reader):
    # a stream reads up to its end, then says so
    path = write_pax_tar(tmp_path / "t.tar", {"size": str(10**30)})
    expected = f"{path} is truncated: member 'a.jpg' at offset 1024 needs {10**30} bytes"
    with pytest.raises(TarFormatError, match=expected):
        READERS[reader](path)


def test_pread_exactly_reads_in_several_preads_and_names_a_cut_member(tmp_path, monkeypatch):
    path = tmp_path / "t.tar"
    path.write_bytes(bytes(range(256)) * 40)
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, offset: real(fd, min(n, 1000), offset))
    with open(path, "rb") as file:
        whole = pread_exactly(file.fileno(), 9000, 512, path, "member 'a.jpg'", "why")
        assert whole == path.read_bytes()[512:9512]
        with pytest.raises(
            TarFormatError,
            match=r"t.tar is truncated: member 'a.jpg' at offset "
            r"512: 9,728 of its 10,000 bytes \(why\)",
        ):
            pread_exactly(file.fileno(), 10_000, 512, path, "member 'a.jpg'", "why")
