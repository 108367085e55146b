import hashlib
import shutil
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from packdata.data import load_manifest
from packdata.datasets import FolderDataset, HttpDataset, decode_image
from packdata import store as store_module
from packdata.store import NetworkStore


class RawBytes(Dataset):
    """The encoded bytes of another dataset's samples (module level, so spawn workers can unpickle it)."""

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
        assert hashlib.sha256(dataset.read_bytes(index)).hexdigest() == manifest["samples"][index]["sha256"]


def test_without_a_manifest_labels_come_from_sorted_class_folders(tiny_dataset, tmp_path):
    copy = shutil.copytree(tiny_dataset, tmp_path / "copy")
    (copy / "manifest.json").unlink()
    dataset = FolderDataset(copy)
    manifest = load_manifest(tiny_dataset)
    assert dataset.classes == sorted(manifest["classes"])
    found = {(path, dataset.classes[label]) for path, label in zip(dataset.paths, dataset.labels)}
    listed = {(s["path"], manifest["classes"][s["label"]]) for s in manifest["samples"]}
    assert found == listed


def test_an_empty_folder_fails_clearly(tmp_path):
    (tmp_path / "cats").mkdir()
    with pytest.raises(ValueError, match="no samples"):
        FolderDataset(tmp_path)


@pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities of TorchVision are deprecated")
def test_both_decoders_give_uint8_chw_images_that_agree(tiny_dataset):
    by_pil, by_torchvision = FolderDataset(tiny_dataset), FolderDataset(tiny_dataset, decoder="torchvision")
    for index in (0, 7, 59):
        pil_image, torchvision_image = by_pil[index][0], by_torchvision[index][0]
        assert pil_image.dtype == torchvision_image.dtype == torch.uint8
        assert pil_image.shape == torchvision_image.shape == (3, 64, 64)
        assert (pil_image.float() - torchvision_image.float()).abs().mean() < 2  # libjpeg builds may round differently


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
    loader = DataLoader(RawBytes(http), batch_size=16, num_workers=2, multiprocessing_context=context)
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
    monkeypatch.setattr(store_module._Handler, "timeout", 0.1)  # the store hangs up on idle clients after 0.1 s
    with NetworkStore(tiny_dataset, latency=0) as store:
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
