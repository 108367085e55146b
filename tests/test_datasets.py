import hashlib
import io
import json
import os
import pickle
import re
import shutil
import tarfile
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader, Dataset

from packdata import netstore as store_module
from packdata.audit import audit_reads, expected_checksums
from packdata.datasets import (
    FolderDataset,
    HttpDataset,
    IndexedTarDataset,
    SharedHandleTarDataset,
    WorkerSafeZipDataset,
    ZipDataset,
)
from packdata.httpclient import FileChangedError, HttpRangeFile
from packdata.imagefolder import load_manifest
from packdata.images import DECODERS, ORIENTATION, decode_image
from packdata.netstore import NetworkStore
from packdata.packing import TAR_MANIFEST, ZIP_MANIFEST, pack_tar, pack_zip
from packdata.tarindex import build_index, index_path
from packdata.tario import END_OF_TAR, TarFormatError, tar_member


class RawBytes(Dataset):
    """The encoded bytes of another dataset's samples (module level, so spawn workers can unpickle
    it)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset.read_bytes(index)


@pytest.fixture
def store(tiny_dataset):
    with NetworkStore(tiny_dataset, latency=0) as running:
        yield running


def test_length_labels_and_sizes_follow_the_manifest(tiny_dataset):
    manifest = load_manifest(tiny_dataset)
    dataset = FolderDataset(tiny_dataset)
    assert len(dataset) == len(manifest["samples"])
    assert dataset.classes == manifest["classes"]
    assert [dataset[i][1] for i in range(len(dataset))] == [s["label"] for s in manifest["samples"]]
    assert dataset.sample_bytes == [s["bytes"] for s in manifest["samples"]]


def test_read_bytes_returns_the_file(tiny_dataset):
    manifest = load_manifest(tiny_dataset)
    dataset = FolderDataset(tiny_dataset)
    for index in (0, len(dataset) - 1):
        assert (
            hashlib.sha256(dataset.read_bytes(index)).hexdigest()
            == manifest["samples"][index]["sha256"]
        )


def test_without_a_manifest_labels_come_from_sorted_class_folders(tiny_dataset, tmp_path):
    copy = shutil.copytree(tiny_dataset, tmp_path / "copy")
    (copy / "manifest.json").unlink()
    dataset = FolderDataset(copy)
    manifest = load_manifest(tiny_dataset)
    assert dataset.classes == sorted(manifest["classes"])
    found = {(path, dataset.classes[label]) for path, label in zip(dataset.paths, dataset.labels)}
    listed = {(s["path"], manifest["classes"][s["label"]]) for s in manifest["samples"]}
    assert found == listed


def test_png_files_in_a_folder_are_samples_too(tiny_dataset, tmp_path):
    copy = shutil.copytree(tiny_dataset, tmp_path / "copy")
    (copy / "manifest.json").unlink()
    first = sorted(copy.glob("*/*.jpg"))[0]
    Image.open(first).save(first.with_suffix(".png"))
    first.unlink()
    dataset = FolderDataset(copy)
    assert len(dataset) == len(load_manifest(tiny_dataset)["samples"])
    assert first.with_suffix(".png").relative_to(copy).as_posix() in dataset.paths


def test_an_empty_folder_fails_clearly(tmp_path):
    (tmp_path / "cats").mkdir()
    with pytest.raises(ValueError, match="no samples"):
        FolderDataset(tmp_path)


def test_both_decoders_give_uint8_chw_images_that_agree(tiny_dataset):
    by_pil = FolderDataset(tiny_dataset)
    by_torchcodec = FolderDataset(tiny_dataset, decoder="torchcodec")
    for index in (0, 7, 59):
        pil_image, torchcodec_image = by_pil[index][0], by_torchcodec[index][0]
        assert pil_image.dtype == torchcodec_image.dtype == torch.uint8
        assert pil_image.shape == torchcodec_image.shape == (3, 64, 64)
        # libjpeg builds may round differently
        assert (pil_image.float() - torchcodec_image.float()).abs().mean() < 2


def test_both_decoders_turn_a_photo_upright_by_its_exif_orientation():
    exif = Image.Exif()
    exif[ORIENTATION] = 6  # the camera was turned: the picture is stored sideways
    buffer = io.BytesIO()
    Image.new("RGB", (40, 20), "blue").save(buffer, format="JPEG", exif=exif)
    for decoder in DECODERS:
        assert decode_image(buffer.getvalue(), decoder).shape == (3, 40, 20), decoder


def test_both_decoders_give_an_animations_first_frame():
    frames = [Image.new("RGB", (8, 6), colour) for colour in ("red", "blue")]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    for decoder in DECODERS:
        image = decode_image(buffer.getvalue(), decoder)
        assert image.shape == (3, 6, 8), decoder
        assert image[0].float().mean() > 200 and image[2].float().mean() < 50, decoder  # red


def test_torchvisions_deprecated_decoder_is_refused_naming_its_successor():
    with pytest.raises(ValueError, match="since torchvision 0.29; use decoder='torchcodec'"):
        decode_image(b"", decoder="torchvision")


def test_unknown_decoder_is_refused(tiny_dataset):
    with pytest.raises(ValueError, match="unknown decoder"):
        FolderDataset(tiny_dataset, decoder="cv2")
    with pytest.raises(ValueError, match="unknown decoder"):
        decode_image(b"", decoder="cv2")


def test_transform_is_applied_to_the_image(tiny_dataset):
    dataset = FolderDataset(tiny_dataset, transform=lambda image: image.float() / 255)
    image, _ = dataset[0]
    assert image.dtype == torch.float32
    assert 0 <= image.min() <= image.max() <= 1


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_folder_dataset_in_dataloader_workers(tiny_dataset, context):
    dataset = FolderDataset(tiny_dataset)
    loader = DataLoader(dataset, batch_size=16, num_workers=2, multiprocessing_context=context)
    batches = list(loader)
    assert torch.cat([labels for _, labels in batches]).tolist() == dataset.labels
    assert batches[0][0].shape == (16, 3, 64, 64)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_http_dataset_in_dataloader_workers_returns_identical_bytes(tiny_dataset, store, context):
    folder = FolderDataset(tiny_dataset)
    http = HttpDataset(store.url, load_manifest(tiny_dataset))
    http.read_bytes(0)  # a connection open in the parent must not leak into the workers
    loader = DataLoader(
        RawBytes(http), batch_size=16, num_workers=2, multiprocessing_context=context
    )
    fetched = [data for batch in loader for data in batch]
    assert fetched == [folder.read_bytes(i) for i in range(len(folder))]


def test_http_dataset_decodes_like_the_folder(tiny_dataset, store):
    folder, http = FolderDataset(tiny_dataset), HttpDataset(store.url, load_manifest(tiny_dataset))
    assert len(http) == len(folder)
    image, label = http[5]
    assert torch.equal(image, folder[5][0]) and label == folder[5][1]
    assert http.url_for(5) == store.url_for(folder.paths[5])


def test_http_dataset_names_the_url_and_status_of_a_missing_file(tiny_dataset, store):
    manifest = load_manifest(tiny_dataset)
    manifest = {**manifest, "samples": [{**manifest["samples"][0], "path": "circle/missing.jpg"}]}
    dataset = HttpDataset(store.url, manifest)
    with pytest.raises(FileNotFoundError) as error:
        dataset[0]
    assert store.url_for("circle/missing.jpg") in str(error.value)
    assert "404" in str(error.value)


def test_http_dataset_reconnects_when_the_store_drops_an_idle_connection(tiny_dataset, monkeypatch):
    # the store hangs up on idle clients after 0.1 s
    monkeypatch.setattr(store_module._Handler, "timeout", 0.1)
    with NetworkStore(tiny_dataset, latency=0, process=False) as store:  # patched: served here
        dataset = HttpDataset(store.url, load_manifest(tiny_dataset))
        dataset.read_bytes(0)
        time.sleep(0.5)
        assert dataset.read_bytes(1) == FolderDataset(tiny_dataset).read_bytes(1)


def test_http_dataset_reports_a_stopped_store(tiny_dataset):
    with NetworkStore(tiny_dataset, latency=0) as store:
        dataset = HttpDataset(store.url, load_manifest(tiny_dataset))
        dataset.read_bytes(0)
    with pytest.raises(ConnectionError, match=dataset.url_for(1)):
        dataset.read_bytes(1)


def test_a_timeout_names_the_url(tiny_dataset):
    with NetworkStore(tiny_dataset, latency=60) as store:
        dataset = HttpDataset(store.url, load_manifest(tiny_dataset), timeout=0.2)
        with pytest.raises(TimeoutError, match=re.escape(dataset.url_for(0))):
            dataset.read_bytes(0)


# --- archives: ZIP and indexed tar, on disk and over HTTP Range requests --------------------------

ARCHIVE_DATASETS = {"zip": (pack_zip, ZipDataset), "tar": (pack_tar, IndexedTarDataset)}


@pytest.fixture(scope="module")
def archives(tiny_dataset, tmp_path_factory):
    """A folder of the tiny dataset packed four ways: ``jpeg.zip``, ``jpeg.tar``, ``raw.zip``,
    ``raw.tar``."""
    folder = tmp_path_factory.mktemp("archives")
    for kind, (pack, _) in ARCHIVE_DATASETS.items():
        for payload in ("jpeg", "raw"):
            pack(tiny_dataset, folder / f"{payload}.{kind}", payload=payload, progress=False)
    return folder


@pytest.fixture
def archive_store(archives):
    with NetworkStore(archives, latency=0) as running:
        yield running


def rewritten(source, target, changes):
    """A copy of a ZIP or tar archive with members replaced (``name: bytes``) or left out (``name:
    None``)."""
    if source.suffix == ".zip":
        with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
            for name in old.namelist():
                data = changes.get(name, old.read(name))
                if data is not None:
                    new.writestr(name, data)
        return target
    with tarfile.open(source) as old, tarfile.open(target, "w") as new:
        for info in old.getmembers():
            data = changes.get(info.name, old.extractfile(info).read())
            if data is not None:
                info.size = len(data)
                new.addfile(info, io.BytesIO(data))
    return target


def without_sample(manifest_bytes, key):
    manifest = json.loads(manifest_bytes)
    manifest["samples"] = [sample for sample in manifest["samples"] if sample["key"] != key]
    return json.dumps(manifest).encode()


def manifest_member(archive):
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zip_file:
            return zip_file.read(ZIP_MANIFEST)
    with tarfile.open(archive) as tar:
        return tar.extractfile(TAR_MANIFEST).read()


@pytest.mark.parametrize("kind", ARCHIVE_DATASETS)
@pytest.mark.parametrize("payload", ["jpeg", "raw"])
def test_archive_datasets_give_the_folder_samples(tiny_dataset, archives, kind, payload):
    folder, dataset = (
        FolderDataset(tiny_dataset),
        ARCHIVE_DATASETS[kind][1](archives / f"{payload}.{kind}"),
    )
    assert (
        len(dataset) == len(folder)
        and dataset.classes == folder.classes
        and dataset.labels == folder.labels
    )
    for index in range(len(folder)):
        image, label = dataset[index]
        assert torch.equal(image, folder[index][0]) and label == folder[index][1]
        if payload == "jpeg":
            assert dataset.read_bytes(index) == folder.read_bytes(index)


def test_a_tar_read_through_one_shared_handle_is_right_without_workers(archives):
    shared, indexed = (
        kind(archives / "jpeg.tar") for kind in (SharedHandleTarDataset, IndexedTarDataset)
    )
    backwards = range(len(indexed) - 1, -1, -1)  # seeks both ways
    assert [shared.read_bytes(i) for i in backwards] == [indexed.read_bytes(i) for i in backwards]


def test_a_tar_read_through_one_shared_handle_goes_silently_wrong_in_forked_workers(
    tiny_dataset, archives
):
    # lesson 3's point: the workers share the file's offset, and a tar has no data checksum
    tar = archives / "jpeg.tar"
    checksums = expected_checksums(IndexedTarDataset(tar), load_manifest(tiny_dataset))
    for _ in range(20):  # a race: epochs until it shows
        audit = audit_reads(
            SharedHandleTarDataset(tar), checksums, num_workers=4, multiprocessing_context="fork"
        )
        if audit.wrong:
            break
    assert audit.wrong and not audit.errors


def test_decode_image_asks_for_bytes_when_given_a_path(tiny_dataset):
    path = next(Path(tiny_dataset).rglob("*.jpg"))
    with pytest.raises(TypeError, match="an image file's bytes, not a PosixPath"):
        decode_image(path)
    assert decode_image(path.read_bytes()).dtype == torch.uint8


def test_decode_image_reads_npy_arrays_and_refuses_other_shapes():
    array = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    buffer = io.BytesIO()
    np.save(buffer, array)
    assert torch.equal(decode_image(buffer.getvalue()), torch.from_numpy(array).permute(2, 0, 1))
    buffer = io.BytesIO()
    np.save(buffer, array.astype(np.float32))
    with pytest.raises(ValueError, match="expected a uint8 array"):
        decode_image(buffer.getvalue())


def test_http_range_file_reads_and_seeks_like_a_local_file(archives, archive_store):
    local = (archives / "jpeg.tar").read_bytes()
    remote = HttpRangeFile(archive_store.url_for("jpeg.tar"), read_ahead=1000)
    assert archive_store.requests == 1 and remote.size == len(local)  # one HEAD
    assert remote.readable() and remote.seekable()
    assert remote.read(10) == local[:10] and remote.tell() == 10
    assert remote.read(990) == local[10:1000]
    assert archive_store.requests == 2  # the second read came from the read-ahead buffer
    assert (
        remote.seek(-5, 2) == len(local) - 5
        and remote.read() == local[-5:]
        and remote.read() == b""
    )
    assert remote.seek(3000) == 3000 and remote.read(5000) == local[3000:8000]
    assert remote.seek(-100, 1) == 7900 and remote.read(200) == local[7900:8100]
    assert archive_store.requests == 5
    with pytest.raises(ValueError):
        remote.seek(-1)
    connection = remote.client.connection()
    assert connection.sock is not None  # kept alive between the reads
    remote.close()
    assert connection.sock is None  # closed with the file: no server thread waits on it
    with pytest.raises(ValueError, match="which is closed"):
        remote.read(1)


@pytest.mark.parametrize("kind", ARCHIVE_DATASETS)
def test_archive_datasets_over_http_give_the_local_samples(archives, archive_store, kind):
    local = ARCHIVE_DATASETS[kind][1](archives / f"jpeg.{kind}")
    remote = ARCHIVE_DATASETS[kind][1](archive_store.url_for(f"jpeg.{kind}"))
    assert remote.classes == local.classes and remote.labels == local.labels
    assert [remote.read_bytes(i) for i in range(len(remote))] == [
        local.read_bytes(i) for i in range(len(local))
    ]
    assert torch.equal(remote[7][0], local[7][0])


def test_indexed_tar_over_http_costs_one_request_per_sample(archives, archive_store):
    IndexedTarDataset(archives / "raw.tar")  # writes raw.tar.idx.json, which the store then serves
    dataset = IndexedTarDataset(archive_store.url_for("raw.tar"))
    archive_store.reset_counters()
    for index in reversed(range(len(dataset))):
        dataset[index]
        assert archive_store.requests == len(dataset) - index


def test_indexed_tar_over_http_scans_the_headers_without_a_current_index(archives, tmp_path):
    (tmp_path / "t.tar").write_bytes((archives / "jpeg.tar").read_bytes())
    local = IndexedTarDataset(archives / "jpeg.tar")
    with NetworkStore(tmp_path, latency=0) as store:
        # no t.tar.idx.json at all
        assert IndexedTarDataset(store.url_for("t.tar")).members == local.members
        stale = json.loads(index_path(archives / "jpeg.tar").read_text())
        index_path(tmp_path / "t.tar").write_text(
            json.dumps({**stale, "tar_size": 1, "members": {}})
        )
        assert IndexedTarDataset(store.url_for("t.tar")).members == local.members


def test_indexed_tar_over_http_distrusts_the_index_of_a_tar_rewritten_at_the_same_size(
    archives, tmp_path
):
    tar = tmp_path / "t.tar"
    with tarfile.open(archives / "jpeg.tar") as source:
        members = [(info.name, source.extractfile(info).read()) for info in source.getmembers()]
    tar.write_bytes(b"".join(tar_member(*member) for member in members) + END_OF_TAR)
    indexed = build_index(tar)
    with NetworkStore(tmp_path, latency=0) as store:
        assert IndexedTarDataset(store.url_for("t.tar")).members == indexed
        written = tar.stat().st_mtime_ns
        tar.write_bytes(b"".join(tar_member(*member) for member in reversed(members)) + END_OF_TAR)
        # rewritten a moment later: same size, members elsewhere
        os.utime(tar, ns=(written + 1, written + 1))
        remote, local = IndexedTarDataset(store.url_for("t.tar")), IndexedTarDataset(tar)
        assert remote.members == local.members != indexed
        assert [remote.read_bytes(i) for i in range(len(remote))] == [
            local.read_bytes(i) for i in range(len(local))
        ]


def test_a_tar_replaced_after_the_dataset_was_built_is_refused_not_misread(archives, tmp_path):
    jpeg, raw = (archives / "jpeg.tar").read_bytes(), (archives / "raw.tar").read_bytes()
    tar = tmp_path / "t.tar"
    tar.write_bytes(jpeg)
    with NetworkStore(tmp_path, latency=0) as store:
        remote, local = IndexedTarDataset(store.url_for("t.tar")), IndexedTarDataset(tar)
        # as a DataLoader worker started after the change would: it opens the tar afresh
        local._tar.close()
        written = tar.stat().st_mtime_ns
        tar.write_bytes(raw)
        os.utime(tar, ns=(written + 1, written + 1))
        with pytest.raises(FileChangedError, match=r"t\.tar changed after it was opened"):
            remote.read_bytes(0)
        with pytest.raises(FileChangedError, match=r"t\.tar changed after it was indexed"):
            local.read_bytes(0)
        fresh = IndexedTarDataset(store.url_for("t.tar"))
        assert fresh.read_bytes(0) == IndexedTarDataset(tar).read_bytes(0)
        # a weak ETag can never match If-Match, so it is not sent (else: 412); the answer's ETag
        # is still compared with it, weakly
        fresh.etag = f"W/{fresh.etag}"
        assert fresh.read_bytes(0) == IndexedTarDataset(tar).read_bytes(0)
        fresh.etag = 'W/"another"'
        with pytest.raises(FileChangedError, match=r'version W/"another", the server sent'):
            fresh.read_bytes(0)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_indexed_tar_dataset_in_dataloader_workers(archives, context):
    dataset = IndexedTarDataset(archives / "jpeg.tar")
    dataset.read_bytes(0)  # a descriptor opened in the parent must not be what the workers use
    loader = DataLoader(
        RawBytes(dataset), batch_size=16, num_workers=2, multiprocessing_context=context
    )
    assert [data for batch in loader for data in batch] == [
        dataset.read_bytes(i) for i in range(len(dataset))
    ]


def test_indexed_tar_reads_a_webdataset_shard_with_labels_from_cls_members(tiny_dataset, tmp_path):
    folder = FolderDataset(tiny_dataset)
    with webdataset.TarWriter(str(tmp_path / "shard.tar")) as writer:
        for index in range(len(folder)):
            writer.write(
                {
                    "__key__": f"{index:06d}",
                    "jpg": folder.read_bytes(index),
                    "cls": folder.labels[index],
                }
            )
    dataset = IndexedTarDataset(tmp_path / "shard.tar")
    assert dataset.classes is None and dataset.labels == folder.labels
    assert torch.equal(dataset[9][0], folder[9][0])


def test_a_stale_tar_index_is_rebuilt(tiny_dataset, tmp_path):
    path = pack_tar(tiny_dataset, tmp_path / "t.tar", progress=False)
    assert IndexedTarDataset(path).paths[0] == "000000.jpg"
    # the index next to it now describes another tar
    pack_tar(tiny_dataset, path, payload="raw", progress=False)
    dataset = IndexedTarDataset(path)
    assert dataset.paths[0] == "000000.npy" and dataset[0][0].shape == (3, 64, 64)


@pytest.mark.parametrize("kind", ARCHIVE_DATASETS)
def test_garbage_and_truncated_archives_name_the_archive(archives, tmp_path, kind):
    garbage, truncated = tmp_path / f"garbage.{kind}", tmp_path / f"truncated.{kind}"
    garbage.write_bytes(bytes(range(256)) * 40)
    source = (archives / f"jpeg.{kind}").read_bytes()
    truncated.write_bytes(source[: len(source) // 2 + 700])
    errors = {"zip": zipfile.BadZipFile, "tar": TarFormatError}
    with pytest.raises(errors[kind], match=str(garbage)):
        ARCHIVE_DATASETS[kind][1](garbage)
    with pytest.raises(errors[kind], match=str(truncated)) as error:
        ARCHIVE_DATASETS[kind][1](truncated)
    if kind == "tar":
        assert "is truncated: member '" in str(error.value)


def test_a_bad_crc_names_the_zip_and_the_member(tiny_dataset, archives, tmp_path):
    blob = bytearray((archives / "jpeg.zip").read_bytes())
    jpeg = FolderDataset(tiny_dataset).read_bytes(3)
    blob[blob.index(jpeg) + 100] ^= 0xFF
    (tmp_path / "bad.zip").write_bytes(bytes(blob))
    dataset = ZipDataset(tmp_path / "bad.zip")
    dataset[2]
    with pytest.raises(
        zipfile.BadZipFile, match=f"member '000003.jpg' of {tmp_path / 'bad.zip'}: Bad CRC-32"
    ):
        dataset[3]


def test_bytes_read_in_the_wrong_place_give_a_short_error(archives, tmp_path):
    source = archives / "jpeg.zip"
    name = ZipDataset(source).paths[0]
    header = zipfile.ZipFile(source).getinfo(name).header_offset
    blob = bytearray(source.read_bytes())
    blob[header + 26 : header + 28] = (60_000).to_bytes(2, "little")  # a name of 60,000 bytes
    (tmp_path / "shifted.zip").write_bytes(bytes(blob))
    with pytest.raises(zipfile.BadZipFile, match="and header b'") as error:
        ZipDataset(tmp_path / "shifted.zip").read_member(name)
    assert str(error.value).startswith(f"member '{name}' of ")
    assert len(str(error.value)) < 500


@pytest.mark.parametrize("kind", ARCHIVE_DATASETS)
def test_a_sample_missing_from_the_manifest_has_no_label(archives, tmp_path, kind):
    source = archives / f"jpeg.{kind}"
    manifest_name = ZIP_MANIFEST if kind == "zip" else TAR_MANIFEST
    changes = {manifest_name: without_sample(manifest_member(source), "000005")}
    path = rewritten(source, tmp_path / f"t.{kind}", changes)
    with pytest.raises(LookupError, match=f"member '000005.jpg' of {path} has no label"):
        ARCHIVE_DATASETS[kind][1](path)


@pytest.mark.parametrize("kind", ARCHIVE_DATASETS)
def test_a_sample_of_the_manifest_without_its_image_is_named(archives, tmp_path, kind):
    path = rewritten(archives / f"jpeg.{kind}", tmp_path / f"t.{kind}", {"000005.jpg": None})
    with pytest.raises(LookupError, match=f"{path}: 1 sample.* the first key '000005'"):
        ARCHIVE_DATASETS[kind][1](path)


def test_a_shard_sample_without_a_cls_member_has_no_label(archives, tmp_path):
    path = rewritten(
        archives / "jpeg.tar", tmp_path / "t.tar", {TAR_MANIFEST: None, "000004.cls": None}
    )
    with pytest.raises(
        LookupError, match=f"member '000004.jpg' of {path} has no label: .* a .cls member"
    ):
        IndexedTarDataset(path)


@pytest.mark.parametrize("kind", ARCHIVE_DATASETS)
def test_a_member_that_is_not_an_image_names_the_archive_and_member(archives, tmp_path, kind):
    path = rewritten(
        archives / f"jpeg.{kind}", tmp_path / f"t.{kind}", {"000002.jpg": b"not an image at all"}
    )
    dataset = ARCHIVE_DATASETS[kind][1](path)
    with pytest.raises(
        ValueError, match=f"cannot decode member '000002.jpg' of {path} as an image"
    ) as error:
        dataset[2]
    assert isinstance(error.value.__cause__, UnidentifiedImageError)


def test_a_zip_replaced_after_the_dataset_was_built_is_refused_by_a_new_worker(archives, tmp_path):
    zip_path = tmp_path / "t.zip"
    shutil.copy(archives / "jpeg.zip", zip_path)
    dataset = WorkerSafeZipDataset(zip_path)
    worker = pickle.loads(pickle.dumps(dataset))  # as a spawned worker gets it: no handle yet
    os.replace(shutil.copy(archives / "raw.zip", tmp_path / "new.zip"), zip_path)  # re-packed
    with pytest.raises(FileChangedError, match=r"t\.zip changed after it was indexed"):
        worker.read_bytes(0)


def test_a_tar_written_over_in_place_is_refused_through_an_open_handle(archives, tmp_path):
    tar = tmp_path / "t.tar"
    shutil.copy(archives / "raw.tar", tar)
    dataset = IndexedTarDataset(tar)
    dataset.read_bytes(0)  # its handle is open now, as in a persistent worker
    shutil.copyfile(archives / "raw.tar", tar)  # same inode and size, as cp does; a new mtime
    os.utime(tar, ns=(time.time_ns(), time.time_ns() + 10**9))
    with pytest.raises(FileChangedError, match=r"t\.tar changed after it was indexed"):
        dataset.read_bytes(1)


def test_a_relative_path_names_the_same_file_after_a_chdir(archives, tiny_dataset, monkeypatch):
    monkeypatch.chdir(archives)
    made = {
        "zip": WorkerSafeZipDataset("jpeg.zip"),
        "tar": IndexedTarDataset("jpeg.tar"),
        "folder": FolderDataset(os.path.relpath(tiny_dataset)),
    }
    expected = {kind: dataset.read_bytes(0) for kind, dataset in made.items()}
    monkeypatch.chdir(tiny_dataset)  # the same names, relative to here, are other files or none
    for kind, dataset in made.items():
        again = pickle.loads(pickle.dumps(dataset))  # a worker opens its own
        assert again.read_bytes(0) == expected[kind], kind


def test_a_zip_holding_one_name_twice_is_refused_naming_both(archives, tmp_path):
    zip_path = tmp_path / "twice.zip"
    shutil.copy(archives / "jpeg.zip", zip_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name as it writes it
        with zipfile.ZipFile(zip_path, "a") as archive:
            archive.writestr("000000.jpg", b"another")
    with pytest.raises(zipfile.BadZipFile, match=r"duplicate member '000000\.jpg', at offsets 0 "):
        ZipDataset(zip_path)


@pytest.mark.parametrize(
    "members", [[], None, {"000000.jpg": [1536]}, {"000000.jpg": None}, {"000000.jpg": [-1, 5]}]
)
def test_an_index_file_whose_members_are_damaged_is_rebuilt(tiny_dataset, tmp_path, members):
    tar = pack_tar(tiny_dataset, tmp_path / "t.tar", progress=False)
    expected = IndexedTarDataset(tar).read_bytes(0)
    stored = json.loads(index_path(tar).read_text())
    stored["members"] = members
    index_path(tar).write_text(json.dumps(stored))
    assert IndexedTarDataset(tar).read_bytes(0) == expected
