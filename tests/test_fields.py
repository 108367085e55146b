"""Samples with more than an image and a label: every reader agrees on what a sample is, and each
field decodes by its extension (``fields``)."""

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from packdata.datasets import IndexedTarDataset
from packdata.fields import image_field
from packdata.layout import ShardError
from packdata.packing import pack_tar
from packdata.shardwrite import write_tar
from packdata.streaming import ShardDataset
from packdata.train import SmallCNN

KEYS = ("jpg", "cls", "json", "txt", "npy")


def npy(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.fixture
def rich_shard(tiny_dataset, tmp_path):
    """Three samples of a JPEG, a label, JSON metadata, a caption and a float feature vector."""
    jpeg = next(tiny_dataset.glob("*/*.jpg")).read_bytes()
    samples = [
        (
            f"{index:06d}",
            {
                "jpg": jpeg,
                "cls": str(index).encode(),
                "json": json.dumps({"source": "camera", "index": index}).encode(),
                "txt": f"caption {index}".encode(),
                "npy": npy(np.full(4, index / 2, dtype=np.float32)),
            },
        )
        for index in range(3)
    ]
    return str(write_tar(tmp_path / "rich.tar", samples).path), jpeg


def test_the_stream_decodes_every_field_by_its_extension(rich_shard):
    shard, _ = rich_shard
    image, label, meta, caption, feature = next(iter(ShardDataset([shard], keys=KEYS)))
    assert image.dtype == torch.uint8 and image.shape[0] == 3
    assert (label, meta, caption) == (0, {"source": "camera", "index": 0}, "caption 0")
    assert feature.dtype == np.float32 and feature.tolist() == [0.0] * 4


def test_the_map_style_reader_makes_one_sample_per_key(rich_shard):
    shard, jpeg = rich_shard
    dataset = IndexedTarDataset(shard)
    assert len(dataset) == 3
    assert dataset.paths == ["000000.jpg", "000001.jpg", "000002.jpg"]
    assert dataset.read_bytes(0) == jpeg and dataset.labels == [0, 1, 2]


def test_both_readers_agree_on_images_and_labels(rich_shard):
    shard, _ = rich_shard
    streamed = list(ShardDataset([shard], keys=("jpg", "cls"), shuffle=False))
    indexed = IndexedTarDataset(shard)
    assert len(streamed) == len(indexed)
    for (image, label), index in zip(streamed, range(len(indexed)), strict=True):
        assert torch.equal(image, indexed[index][0]) and label == indexed[index][1]


def test_the_batches_collate_features_into_tensors(rich_shard):
    shard, _ = rich_shard
    batch = next(iter(ShardDataset([shard], keys=("cls", "npy"), batch_size=3)))
    assert batch[1].shape == (3, 4) and batch[1].dtype == torch.float32


@pytest.mark.parametrize(
    "keys, image",
    [
        (("jpg", "cls"), "jpg"),
        (("cls", "png", "npy"), "png"),
        (("npy", "cls"), "npy"),  # raw pixels packed without an encoded image
        (("cls", "json"), None),
    ],
)
def test_the_image_is_the_encoded_one_else_the_raw_pixels(keys, image):
    assert image_field(keys) == image


def test_raw_pixels_are_the_image_and_a_feature_is_not(tiny_dataset, tmp_path, rich_shard):
    raw = pack_tar(tiny_dataset, tmp_path / "raw.tar", payload="raw", progress=False)
    image, _ = next(iter(ShardDataset([str(raw)], keys=("npy", "cls"))))
    assert image.dtype == torch.uint8 and image.shape[0] == 3  # decoded pixels, as CHW
    label, feature = next(iter(ShardDataset([rich_shard[0]], keys=("cls", "npy"))))
    assert isinstance(feature, np.ndarray) and feature.dtype == np.float32


def test_images_of_another_size_are_named_before_a_batch_breaks(tiny_dataset, tmp_path):
    small = next(tiny_dataset.glob("*/*.jpg")).read_bytes()
    buffer = io.BytesIO()
    Image.new("RGB", (300, 200), "red").save(buffer, format="JPEG")
    samples = [("a", {"jpg": small, "cls": b"0"}), ("b", {"jpg": buffer.getvalue(), "cls": b"1"})]
    shard = str(write_tar(tmp_path / "mixed.tar", samples).path)
    message = r"mixed\.tar: sample 'b' has an image of shape \(3, 200, 300\), sample 'a' one of"
    with pytest.raises(ShardError, match=message + r".*resize them"):
        list(ShardDataset([shard], batch_size=2, shuffle=False))
    resized = ShardDataset([shard], batch_size=2, transform=v2.Resize((32, 32)), shuffle=False)
    assert next(iter(resized))[0].shape == (2, 3, 32, 32)


@pytest.mark.parametrize("height, width", [(8, 8), (9, 13), (64, 64), (300, 451)])
def test_the_small_cnn_takes_any_size_of_image(height, width):
    model = SmallCNN(num_classes=10).eval()
    assert model(torch.zeros(2, 3, height, width, dtype=torch.uint8)).shape == (2, 10)
