import hashlib
import io
import json
import tarfile
import zipfile

import numpy as np
import pytest
import webdataset
from PIL import Image

from packdata import layout, samples
from packdata.datasets import IndexedTarDataset, ZipDataset
from packdata.imagefolder import load_manifest, manifest_digest
from packdata.packing import FIXED_ZIP_TIME, TAR_MANIFEST, ZIP_MANIFEST, pack_tar, pack_zip
from packdata.tario import FIXED_MTIME


def source_files(root):
    """``{key: (label, file bytes)}`` of the dataset at ``root``."""
    return {
        s["key"]: (s["label"], (root / s["path"]).read_bytes())
        for s in load_manifest(root)["samples"]
    }


def decoded(jpeg):
    return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))


def zip_members(archive):
    with zipfile.ZipFile(archive) as zip_file:
        return {info.filename: zip_file.read(info) for info in zip_file.infolist()}


def tar_members(archive):
    with tarfile.open(archive) as tar:
        return {info.name: tar.extractfile(info).read() for info in tar.getmembers()}


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_zip_round_trip_gives_every_source_file_back_bit_for_bit(tiny_dataset, tmp_path):
    archive = pack_zip(tiny_dataset, tmp_path / "train.zip", progress=False)
    members = zip_members(archive)
    sources = source_files(tiny_dataset)
    labels = {s["key"]: s["label"] for s in json.loads(members[ZIP_MANIFEST])["samples"]}
    assert {name for name in members if name != ZIP_MANIFEST} == {f"{key}.jpg" for key in sources}
    for key, (label, jpeg) in sources.items():
        assert members[f"{key}.jpg"] == jpeg and labels[key] == label


def test_zip_is_stored_uncompressed_in_key_order_with_fixed_timestamps(tiny_dataset, tmp_path):
    with zipfile.ZipFile(
        pack_zip(tiny_dataset, tmp_path / "train.zip", progress=False)
    ) as zip_file:
        infos = zip_file.infolist()
    names = [info.filename for info in infos]
    assert names == sorted(f"{key}.jpg" for key in source_files(tiny_dataset)) + [ZIP_MANIFEST]
    assert {info.compress_type for info in infos} == {zipfile.ZIP_STORED}
    assert {info.date_time for info in infos} == {FIXED_ZIP_TIME}


def test_tar_round_trip_in_webdataset_layout(tiny_dataset, tmp_path):
    archive = pack_tar(tiny_dataset, tmp_path / "train.tar", progress=False)
    members = tar_members(archive)
    sources = source_files(tiny_dataset)
    expected_order = [TAR_MANIFEST] + [
        f"{key}{suffix}" for key in sorted(sources) for suffix in (".jpg", ".cls")
    ]
    assert list(members) == expected_order
    for key, (label, jpeg) in sources.items():
        assert members[f"{key}.jpg"] == jpeg
        assert members[f"{key}.cls"] == str(label).encode("ascii")


def test_tar_headers_are_ustar_with_fixed_owner_and_time(tiny_dataset, tmp_path):
    archive = pack_tar(tiny_dataset, tmp_path / "train.tar", progress=False)
    with tarfile.open(archive) as tar:
        infos = tar.getmembers()
    assert {(i.mtime, i.uid, i.gid, i.uname, i.gname, i.mode) for i in infos} == {
        (FIXED_MTIME, 0, 0, "", "", 0o644)
    }
    blob = archive.read_bytes()
    # no pax or GNU headers
    assert {blob[i.offset + 257 : i.offset + 265] for i in infos} == {b"ustar\x0000"}


def test_manifest_member_describes_every_stored_payload(tiny_dataset, tmp_path):
    archive = pack_tar(tiny_dataset, tmp_path / "train.tar", payload="raw", progress=False)
    members = tar_members(archive)
    manifest = json.loads(members[TAR_MANIFEST])
    assert manifest["classes"] == load_manifest(tiny_dataset)["classes"]
    assert (manifest["payload"], manifest["suffix"], manifest["resize"]) == ("raw", ".npy", None)
    assert manifest["source_manifest_sha256"] == manifest_digest(tiny_dataset)
    for entry in manifest["samples"]:
        data = members[f"{entry['key']}.npy"]
        assert entry["bytes"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert len(manifest["samples"]) == len(source_files(tiny_dataset))


@pytest.mark.parametrize("pack, read_members", [(pack_zip, zip_members), (pack_tar, tar_members)])
def test_raw_payload_holds_the_decoded_arrays(tiny_dataset, tmp_path, pack, read_members):
    members = read_members(pack(tiny_dataset, tmp_path / "raw", payload="raw", progress=False))
    for key, (_, jpeg) in source_files(tiny_dataset).items():
        array = np.load(io.BytesIO(members[f"{key}.npy"]))
        assert array.dtype == np.uint8 and array.shape == (64, 64, 3)
        assert np.array_equal(array, decoded(jpeg))


@pytest.mark.parametrize("payload, suffix", [("jpeg", ".jpg"), ("raw", ".npy")])
def test_resize_happens_once_at_packing_time_and_is_recorded(
    tiny_dataset, tmp_path, payload, suffix
):
    members = zip_members(
        pack_zip(tiny_dataset, tmp_path / "small.zip", payload=payload, resize=32, progress=False)
    )
    manifest = json.loads(members[ZIP_MANIFEST])
    assert manifest["resize"] == {"size": 32, "filter": "bicubic"}
    for key, (_, jpeg) in list(source_files(tiny_dataset).items())[:5]:
        stored = members[key + suffix]
        image = np.load(io.BytesIO(stored)) if payload == "raw" else decoded(stored)
        assert image.shape == (32, 32, 3)
        expected = np.asarray(
            Image.fromarray(decoded(jpeg)).resize((32, 32), Image.Resampling.BICUBIC)
        )
        if payload == "raw":
            assert np.array_equal(image, expected)
        else:  # re-encoding a small noisy image as JPEG is lossy
            assert np.abs(image.astype(int) - expected).mean() < 10


@pytest.mark.parametrize("pack", [pack_zip, pack_tar])
@pytest.mark.parametrize("payload", ["jpeg", "raw"])
def test_the_same_input_gives_a_byte_identical_archive(tiny_dataset, tmp_path, pack, payload):
    first = pack(tiny_dataset, tmp_path / "first" / "a", payload=payload, progress=False)
    second = pack(tiny_dataset, tmp_path / "second" / "a", payload=payload, progress=False)
    assert sha256(first) == sha256(second)


@pytest.mark.parametrize("pack, reader", [(pack_zip, ZipDataset), (pack_tar, IndexedTarDataset)])
def test_packing_again_the_same_bytes_leaves_the_archive_and_its_readers_alone(
    tiny_dataset, tmp_path, pack, reader
):
    archive = pack(tiny_dataset, tmp_path / "a", progress=False)
    dataset, before = reader(archive), archive.stat()
    pack(tiny_dataset, archive, progress=False)  # lesson 2 run again while lesson 3 reads it
    after = archive.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert dataset.read_bytes(0)
    assert not [path.name for path in tmp_path.iterdir() if path.name.startswith(".")]  # no temp
    pack(tiny_dataset, archive, payload="raw", progress=False)  # other bytes: replaced
    assert archive.stat().st_ino != before.st_ino


def test_webdataset_reads_the_tar_with_the_same_keys_and_labels(tiny_dataset, tmp_path):
    archive = pack_tar(tiny_dataset, tmp_path / "train.tar", progress=False)
    samples = list(webdataset.WebDataset([str(archive)], shardshuffle=False))
    sources = source_files(tiny_dataset)
    assert [sample["__key__"] for sample in samples] == sorted(sources)
    for sample in samples:
        label, jpeg = sources[sample["__key__"]]
        assert sample["jpg"] == jpeg and int(sample["cls"]) == label
        assert set(sample) - {"__key__", "__url__", "__local_path__"} == {"jpg", "cls"}


@pytest.mark.parametrize("pack", [pack_zip, pack_tar])
def test_an_interrupted_run_leaves_the_old_archive_and_no_partial_file(
    tiny_dataset, tmp_path, monkeypatch, pack
):
    archive = pack(tiny_dataset, tmp_path / "archive", progress=False)
    before = sha256(archive)
    calls = []

    def failing_encode(jpeg, payload, resize):
        calls.append(1)
        if len(calls) == 10:
            raise KeyboardInterrupt
        return jpeg

    monkeypatch.setattr(samples, "encode_payload", failing_encode)
    with pytest.raises(KeyboardInterrupt):
        pack(tiny_dataset, archive, payload="raw", progress=False)
    assert sha256(archive) == before
    assert [path.name for path in tmp_path.iterdir()] == ["archive"]


@pytest.mark.parametrize("pack", [pack_zip, pack_tar])
def test_unknown_payloads_and_bad_sizes_are_refused(tiny_dataset, tmp_path, pack):
    with pytest.raises(ValueError, match="unknown payload"):
        pack(tiny_dataset, tmp_path / "a", payload="png", progress=False)
    for resize in (0, 32.0, True, "32"):
        with pytest.raises(ValueError, match="resize"):
            pack(tiny_dataset, tmp_path / "a", resize=resize, progress=False)
    assert not any(tmp_path.iterdir())


def test_split_member_follows_webdataset():
    assert layout.split_member("000001.jpg") == ("000001", "jpg")
    assert layout.split_member("a.b/000001.seg.png") == ("a.b/000001", "seg.png")
    assert layout.split_member(TAR_MANIFEST) == (TAR_MANIFEST, "")
