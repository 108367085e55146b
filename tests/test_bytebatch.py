"""Undecoded samples batched as one tensor: the same bytes as the lists they replace, every sample
once through real worker processes, and the tensor handed over in shared memory; whole files the
same way."""

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchcodec.decoders import decode_jpeg

from packdata.bytebatch import ByteBatch, WholeFiles, collate_bytes
from packdata.images import decode_image
from packdata.streaming import ShardDataset

ITEMS = [b"first", b"", b"\x00\xff" * 3, b"last item"]


def test_a_byte_batch_gives_back_each_item():
    batch = ByteBatch.of(ITEMS)
    assert len(batch) == len(ITEMS) and list(batch) == ITEMS
    assert [batch[index] for index in range(-len(ITEMS), 0)] == ITEMS
    assert [bytes(tensor.numpy()) for tensor in batch.tensors()] == ITEMS
    with pytest.raises(IndexError):
        batch[len(ITEMS)]
    with pytest.raises(IndexError):
        ByteBatch.of([])[0]
    assert ByteBatch.of([]).tensors() == []
    assert list(ByteBatch.of([bytearray(b"ab"), memoryview(np.arange(2, dtype=np.int16))])) == [
        b"ab",
        np.arange(2, dtype=np.int16).tobytes(),
    ]


def test_collate_bytes_keeps_other_fields_as_default_collate_does():
    jpegs, labels = collate_bytes([(item, index) for index, item in enumerate(ITEMS)])
    assert list(jpegs) == ITEMS and labels.tolist() == list(range(len(ITEMS)))
    named = collate_bytes([{"jpg": item, "cls": index} for index, item in enumerate(ITEMS)])
    assert list(named["jpg"]) == ITEMS and named["cls"].tolist() == list(range(len(ITEMS)))
    with pytest.raises(TypeError, match="not bytes"):
        collate_bytes(ITEMS)


def test_workers_hand_every_sample_once_in_shared_memory(tiny_shards):
    keys = ("__key__", "jpg")
    plain = ShardDataset(tiny_shards, keys=keys, decode=False, shuffle=False)
    expected = dict(iter(plain))
    packed = ShardDataset(
        tiny_shards, keys=keys, decode=False, shuffle=False, batch_size=8, collate_fn=collate_bytes
    )
    seen = {}
    for names, jpegs in DataLoader(packed, batch_size=None, num_workers=2):
        assert jpegs.data.is_shared(), "the batch should arrive in shared memory"
        for name, jpeg in zip(names, jpegs):
            assert name not in seen, f"{name} came twice"
            seen[name] = jpeg
    assert seen == expected


def test_decode_jpeg_takes_the_batch_as_it_comes(tiny_shards):
    dataset = ShardDataset(tiny_shards, decode=False, batch_size=4, collate_fn=collate_bytes)
    jpegs, _ = next(iter(dataset))
    decoded = decode_jpeg(jpegs.tensors())  # device="cuda" decodes on a GPU
    assert all(
        torch.equal(image, decode_image(jpeg, decoder="torchcodec"))
        for image, jpeg in zip(decoded, jpegs)
    )


def test_whole_files_come_once_each_with_their_count(tiny_shards):
    loader = DataLoader(
        WholeFiles(tiny_shards, range(len(tiny_shards))), batch_size=None, num_workers=2
    )
    got = {count: data for data, count in loader}
    assert sorted(got) == list(range(len(tiny_shards)))
    for count, data in got.items():
        assert data.is_shared() and data.numpy().tobytes() == Path(tiny_shards[count]).read_bytes()


def test_collate_without_batch_size_is_refused(tiny_shards):
    with pytest.raises(ValueError, match="give batch_size too"):
        ShardDataset(tiny_shards, decode=False, collate_fn=collate_bytes)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_pinning_keeps_the_items():
    batch = ByteBatch.of(ITEMS).pin_memory()
    assert batch.data.is_pinned() and list(batch) == ITEMS
