"""Every member type real tools write, read as tarfile reads it or refused by name.

Random archives written by Python's tarfile (a writer independent of ours), and archives written by
GNU tar in each of its formats, go through every packdata tar reader: the header walk
(``tario.iter_members``), the index (``tarindex.index_members``), the in-memory scan
(``tarscan.iter_buffer``) and the shard tools (``shardread``). Each must give the names and bytes
that ``tarfile.extractfile`` gives, or raise ``TarFormatError`` naming archive, member and offset.

What each kind of member gets:

==============================  ==============================================================
member                          every packdata reader
==============================  ==============================================================
regular file (also ``7``, v7)   its bytes
hard link, symbolic link        the bytes of the earlier file it names; a link to nothing in
                                the archive: TarFormatError naming the link and its offset
folder, fifo, device            no bytes: not a file, not a sample
sparse file (GNU, pax 0.0-1.0)  TarFormatError: "is a sparse file", naming member and offset
long names, pax and GNU         the long name; pax ``path``/``size``/``mtime`` applied
global pax header               read past
no end-of-archive blocks        read to the end, with a warning
==============================  ==============================================================
"""

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packdata.datasets import IndexedTarDataset
from packdata.shardread import iter_shard_samples
from packdata.tarindex import index_members
from packdata.tario import TarFormatError, iter_members
from packdata.tarscan import iter_buffer

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
SEGMENT = st.text(alphabet="abcxyzé0_-", min_size=1, max_size=12)


@st.composite
def archives(draw):
    """``(format name, members, global pax header)``: random files in random folders, the first a
    file, with folders, links and fifos between them. Each member is ``(kind, path, data or link
    target)``; ``write`` makes the tar of it."""
    name = draw(st.sampled_from(sorted(FORMATS)))
    limit = 3 if name == "ustar" else 12  # ustar holds 100 + 155 bytes of name, no more
    paths = draw(st.lists(st.lists(SEGMENT, min_size=1, max_size=limit), min_size=1, max_size=12))
    members, files, seen = [], [], set()
    for parts in paths:
        path = "/".join(parts)
        if any(path == f or path.startswith(f + "/") or f.startswith(path + "/") for f in seen):
            continue
        seen.add(path)
        kinds = ["file", "file", "file", "dir", "fifo", "chr", *(["hard", "sym"] if files else [])]
        kind = draw(st.sampled_from(kinds)) if members else "file"
        if kind in ("hard", "sym"):
            members.append((kind, path, draw(st.sampled_from(files))))
        else:
            members.append((kind, path, draw(st.binary(max_size=1500)) if kind == "file" else None))
            files += [path] if kind == "file" else []
    return name, members, name == "pax" and draw(st.booleans())


TYPES = {
    "dir": tarfile.DIRTYPE,
    "fifo": tarfile.FIFOTYPE,
    "chr": tarfile.CHRTYPE,
    "hard": tarfile.LNKTYPE,
}


def write(tar_format, members, global_header):
    """The bytes of the tar of ``archives()``'s members, written by tarfile."""
    buffer = io.BytesIO()
    options = {"pax_headers": {"comment": "global"}} if global_header else {}
    with tarfile.open(fileobj=buffer, mode="w", format=FORMATS[tar_format], **options) as tar:
        for kind, path, detail in members:
            info = tarfile.TarInfo(path)
            if kind == "file":
                info.size = len(detail)
                tar.addfile(info, io.BytesIO(detail))
                continue
            info.type = TYPES.get(kind, tarfile.SYMTYPE)
            if kind in ("hard", "sym"):
                info.linkname = detail if kind == "hard" else _relative(detail, path)
            tar.addfile(info)
    return buffer.getvalue()


def _relative(target, link):
    """``target`` as a symbolic link at ``link`` names it: relative to the link's folder."""
    depth = link.count("/")
    return "../" * depth + target


def as_tarfile_reads_it(data):
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        readable = [m for m in tar.getmembers() if m.isfile() or m.islnk() or m.issym()]
        return [(m.name, tar.extractfile(m).read()) for m in readable]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(archives())
def test_every_reader_agrees_with_tarfile(archive):
    data = write(*archive)
    expected = as_tarfile_reads_it(data)
    assert list(iter_buffer(data, "random.tar")) == expected
    index = index_members(io.BytesIO(data), "random.tar")
    assert [(name, data[start : start + size]) for name, (start, size) in index.items()] == expected
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = [m.name for m in tar.getmembers()]
    assert [h.name.rstrip("/") for h, _ in iter_members(io.BytesIO(data), "random.tar")] == names


def test_a_link_to_nothing_in_the_archive_is_named(tmp_path, write_tar):
    link = tarfile.TarInfo("images/b.jpg")
    link.type, link.linkname = tarfile.SYMTYPE, "missing.jpg"
    path = write_tar(tmp_path / "t.tar", [("images/a.jpg", b"jpeg"), (link, None)])
    message = r"t\.tar: member 'images/b\.jpg' at offset 1024 links to 'missing\.jpg', which is no"
    with pytest.raises(TarFormatError, match=message):
        list(iter_buffer(Path(path).read_bytes(), path))
    with pytest.raises(TarFormatError, match=message), open(path, "rb") as file:
        index_members(file)


# --- archives written by GNU tar ------------------------------------------------------------------

needs_gnu_tar = pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar is not installed")


def gnu_tar(folder, archive, *options):
    subprocess.run(["tar", *options, "-cf", str(archive), "-C", str(folder), "."], check=True)
    return archive


@pytest.fixture
def files_and_links(tmp_path):
    """A folder with two images, a hard link and a symbolic link to the first, and a sub-folder."""
    folder = tmp_path / "src"
    (folder / "sub").mkdir(parents=True)
    (folder / "000001.jpg").write_bytes(b"first image")
    (folder / "000001.cls").write_bytes(b"3")
    (folder / "000002.jpg").write_bytes(b"second image")
    (folder / "000002.cls").write_bytes(b"4")
    (folder / "000003.jpg").hardlink_to(folder / "000001.jpg")
    (folder / "000003.cls").write_bytes(b"3")
    (folder / "000004.jpg").symlink_to("000001.jpg")
    (folder / "000004.cls").write_bytes(b"3")
    return folder


@needs_gnu_tar
@pytest.mark.parametrize("tar_format", ["gnu", "oldgnu", "ustar", "pax", "v7"])
def test_gnu_tar_links_are_read_as_tarfile_reads_them(files_and_links, tmp_path, tar_format):
    path = gnu_tar(files_and_links, tmp_path / "t.tar", f"--format={tar_format}", "--sort=name")
    data = path.read_bytes()
    assert list(iter_buffer(data, str(path))) == as_tarfile_reads_it(data)
    samples = {s["__key__"]: s["jpg"] for s in iter_shard_samples([str(path)]) if "jpg" in s}
    assert samples["./000003"] == samples["./000004"] == b"first image"
    indexed = IndexedTarDataset(path)  # every image is a sample: none vanishes behind a link
    assert [indexed.read_bytes(i) for i in range(len(indexed))] == [
        b"first image",
        b"second image",
        b"first image",
        b"first image",
    ]


@needs_gnu_tar
@pytest.mark.parametrize(
    "options",
    [
        ["--format=gnu"],
        ["--format=oldgnu"],
        ["--format=pax", "--sparse-version=0.0"],
        ["--format=pax", "--sparse-version=0.1"],
        ["--format=pax", "--sparse-version=1.0"],
    ],
    ids=["gnu", "oldgnu", "pax-0.0", "pax-0.1", "pax-1.0"],
)
def test_a_sparse_member_is_refused_by_every_reader(tmp_path, options):
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"image")
    with open(folder / "holes.bin", "wb") as file:  # mostly hole: tar --sparse stores it sparse
        file.seek(1 << 20)
        file.write(b"end")
    path = gnu_tar(folder, tmp_path / "t.tar", "--sparse", "--sort=name", *options)
    message = r"member '\./holes\.bin' at offset \d+ is a sparse file, which packdata does not read"
    with pytest.raises(TarFormatError, match=message):
        list(iter_buffer(path.read_bytes(), str(path)))
    with pytest.raises(TarFormatError, match=message), path.open("rb") as file:
        index_members(file)
    with pytest.raises(TarFormatError, match=message):
        list(iter_shard_samples([str(path)]))
