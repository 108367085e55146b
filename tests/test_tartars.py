"""A tar of tars, ImageNet-style: written from a dataset folder, converted into shuffled shards by
streaming (locally, in a pool, through a real store on loopback), bad input named or counted."""

import io
import tarfile
from concurrent.futures import ProcessPoolExecutor

import pytest

from packdata.imagefolder import load_manifest
from packdata.netstore import NetworkStore
from packdata.shardread import iter_shard_samples
from packdata.tario import TarFormatError
from packdata.tartars import inner_tars, make_tar_of_tars, tar_of_tars_to_shards, wnid_of


@pytest.fixture(scope="module")
def outer(tiny_dataset, tmp_path_factory):
    return make_tar_of_tars(tiny_dataset, tmp_path_factory.mktemp("tars") / "train.tar")


def tar_bytes(members):
    """A tar, written by ``tarfile``, of ``(name, bytes)`` members (bytes None: a folder)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(data)
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return buffer.getvalue()


def converted(result):
    """``{key: label}`` of every sample written; a key twice fails."""
    found = {}
    for sample in iter_shard_samples([str(info.path) for info in result.shards]):
        assert sample["__key__"] not in found
        found[sample["__key__"]] = int(sample["cls"])
    return found


def test_the_archive_has_imagenet_s_layout_and_the_images_bytes(tiny_dataset, outer):
    manifest = load_manifest(tiny_dataset)
    with tarfile.open(outer) as tar:
        names = tar.getnames()
        with tarfile.open(fileobj=tar.extractfile(names[0])) as first:
            members = first.getnames()
            data = first.extractfile(members[0]).read()
    assert names == [f"{wnid_of(label)}.tar" for label in range(len(manifest["classes"]))]
    entries = sorted((e for e in manifest["samples"] if e["label"] == 0), key=lambda e: e["key"])
    assert members == [f"n01440764_{int(e['key'])}.JPEG" for e in entries]
    assert data == (tiny_dataset / entries[0]["path"]).read_bytes()


def test_conversion_writes_every_image_once_with_its_class(tiny_dataset, outer, tmp_path):
    result = tar_of_tars_to_shards(outer, tmp_path, buckets=3, maxcount=16)
    expected = {
        f"{wnid_of(e['label'])}_{int(e['key'])}": e["label"]
        for e in load_manifest(tiny_dataset)["samples"]
    }
    assert converted(result) == expected and not result.skipped


def test_a_pool_and_a_store_give_the_same_shards_as_a_local_run(outer, tmp_path):
    local = tar_of_tars_to_shards(outer, tmp_path / "local", buckets=3, seed=5)
    with ProcessPoolExecutor(2) as pool:
        pooled = tar_of_tars_to_shards(outer, tmp_path / "pool", buckets=3, seed=5, executor=pool)
    with NetworkStore(outer.parent, latency=0) as store:
        remote = tar_of_tars_to_shards(
            store.url_for(outer.name), tmp_path / "store", buckets=3, seed=5
        )
        gets = store.requests
    shards = [[p.path.read_bytes() for p in r.shards] for r in (local, pooled, remote)]
    assert shards[0] == shards[1] == shards[2]
    assert gets < 30  # headers and one Range GET per inner tar, not a request per image


def test_other_members_are_skipped_and_counted(tmp_path):
    inner = tar_bytes(
        [
            ("n01440764_1.JPEG", b"jpeg"),
            ("notes.txt", b"x"),
            ("sub", None),
            ("n01440764_2.jpg", b"j"),
        ]
    )
    outer = tmp_path / "train.tar"
    outer.write_bytes(tar_bytes([("README", b"hi"), ("n01440764.tar", inner)]))
    result = tar_of_tars_to_shards(outer, tmp_path / "out", buckets=2)
    assert converted(result) == {"n01440764_1": 0, "n01440764_2": 0}
    assert result.skipped == {
        "outer member not a <wnid>.tar": 1,
        "not a JPEG": 1,
        "not a regular file": 1,
    }


def test_an_image_of_another_class_is_named_with_its_inner_tar(tmp_path):
    inner = tar_bytes([("n01440764_1.JPEG", b"a"), ("n09999999_2.JPEG", b"b")])
    outer = tmp_path / "train.tar"
    outer.write_bytes(tar_bytes([("n01440764.tar", inner)]))
    with pytest.raises(TarFormatError, match=r"inner tar n01440764\.tar, member 'n09999999_2"):
        tar_of_tars_to_shards(outer, tmp_path / "out", buckets=2)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda tar: tar[:1536] + b"XXXX" + tar[1540:], "bad header checksum at offset 1536"),
        (lambda tar: tar[:1000], "is truncated: member 'n01440764_1.JPEG' at offset 0"),
    ],
)
def test_a_corrupt_inner_tar_is_named_not_cut_short(tmp_path, damage, message):
    inner = tar_bytes([("n01440764_1.JPEG", b"a" * 600), ("n01440764_2.JPEG", b"b")])
    outer = tmp_path / "train.tar"
    outer.write_bytes(tar_bytes([("n01440764.tar", damage(inner))]))
    with pytest.raises(TarFormatError, match=rf"train\.tar: inner tar n01440764\.tar.*{message}"):
        tar_of_tars_to_shards(outer, tmp_path / "out", buckets=2)


def test_an_outer_tar_without_class_tars_is_refused(tmp_path, tiny_dataset):
    outer = tmp_path / "photos.tar"
    outer.write_bytes(tar_bytes([("a.jpg", b"x")]))
    with pytest.raises(TarFormatError, match="holds no <wnid>.tar"):
        inner_tars(outer)
    twice = tmp_path / "twice.tar"
    twice.write_bytes(tar_bytes([("n01440764.tar", b""), ("x/n01440764.tar", b"")]))
    with pytest.raises(TarFormatError, match="n01440764.tar more than once"):
        inner_tars(twice)
