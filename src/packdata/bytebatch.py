"""A batch of encoded samples as one tensor, so that it leaves a DataLoader worker in shared
memory instead of pickled through a pipe.

    dataset = ShardDataset(urls, decode=False, batch_size=256, collate_fn=collate_bytes)
    for jpegs, labels in DataLoader(dataset, batch_size=None, num_workers=4):
        jpegs[0]                                  # the first sample's bytes
        torchcodec.decoders.decode_jpeg(jpegs.tensors(), device="cuda")  # one nvJPEG call
        int(labels[0])                            # undecoded too: b"7"

A worker hands the main process each ``bytes`` object of a batch by pickling it through a pipe:
every byte is copied into the pipe and out again, in both processes. A tensor goes by shared
memory: the worker writes it once and the main process maps it (``make bench`` measures both,
through the network store). Decoding in the workers needs none of this; it is for raw bytes that
the main process or a GPU decodes. It pays for batches of megabytes; for samples of a few KB
(``make bench``'s shapes), a shared-memory segment a batch costs more than pickling the bytes.
``WholeFiles`` is the most any of it could reach: files read whole into shared memory, nothing
parsed.
"""

import os
from itertools import accumulate

import torch
from torch.utils.data import IterableDataset, default_collate, get_worker_info


def shared_bytes(size):
    """An empty uint8 tensor of ``size`` bytes, in shared memory when this is a DataLoader worker:
    made shared before it is filled, sending it to the main process then copies nothing."""
    data = torch.empty(size, dtype=torch.uint8)
    return data.share_memory_() if get_worker_info() is not None else data


class ByteBatch:
    """Byte strings kept one after another in ``data`` (uint8), item ``i`` ending at
    ``ends[i]`` (a list: a second tensor would cost a second shared-memory segment a batch)."""

    def __init__(self, data, ends):
        self.data, self.ends = data, ends

    @classmethod
    def of(cls, items):
        """The items (``bytes``-like) copied into one tensor: in shared memory when this is a
        DataLoader worker, the one copy the batch needs to reach the main process."""
        items = [memoryview(item).cast("B") for item in items]  # lengths in bytes
        ends = list(accumulate(map(len, items)))
        data = shared_bytes(ends[-1] if ends else 0)
        view, start = memoryview(data.numpy()), 0
        for item, end in zip(items, ends):
            view[start:end] = item
            start = end
        return cls(data, ends)

    def __len__(self):
        return len(self.ends)

    def __getitem__(self, index):
        """Item ``index``'s bytes (a copy)."""
        index = range(len(self))[index]  # negative ones counted from the end; IndexError
        start = self.ends[index - 1] if index else 0
        return self.data[start : self.ends[index]].numpy().tobytes()

    def __iter__(self):
        return (self[index] for index in range(len(self)))

    def tensors(self):
        """Every item as a uint8 tensor viewing ``data`` (no copy), as ``decode_jpeg`` takes
        them."""
        return list(torch.tensor_split(self.data, self.ends[:-1])) if self.ends else []

    def pin_memory(self):
        """The batch in pinned memory (``DataLoader(pin_memory=True)`` calls this)."""
        return ByteBatch(self.data.pin_memory(), self.ends)


BYTES = (bytes, bytearray, memoryview)


def collate_bytes(samples):
    """``default_collate`` of tuples or dicts, except that a field of ``bytes`` (or
    ``bytearray``, ``memoryview``) becomes one ``ByteBatch``."""
    first = samples[0]
    if isinstance(first, dict):
        return {key: collated([sample[key] for sample in samples]) for key in first}
    if not isinstance(first, (tuple, list)):
        raise TypeError(
            f"collate_bytes collates samples of several fields (tuples, lists or dicts), not "
            f"{type(first).__name__}: for a bare bytes sample use ByteBatch.of(samples)"
        )
    return [collated(field) for field in zip(*samples)]


def collated(values):
    """One field of a batch: a ``ByteBatch`` of bytes-like values, else ``default_collate``."""
    return ByteBatch.of(values) if isinstance(values[0], BYTES) else default_collate(values)


class WholeFiles(IterableDataset):
    """``(bytes of a file, its count)`` for each of ``paths`` (``counts``: a number each, say its
    samples), every ``num_workers``-th to each worker, each file read whole into shared memory:
    one copy from the page cache and nothing parsed, the most a DataLoader's workers can hand
    over from these files on this machine."""

    def __init__(self, paths, counts):
        self.files = list(zip(paths, counts))

    def __iter__(self):
        worker = get_worker_info()
        mine = self.files[worker.id :: worker.num_workers] if worker else self.files
        for path, count in mine:
            with open(path, "rb", buffering=0) as file:
                data = shared_bytes(os.fstat(file.fileno()).st_size)
                view, done = memoryview(data.numpy()), 0
                while done < len(view) and (got := file.readinto(view[done:])):
                    done += got
            if done != len(view):
                raise OSError(f"{path}: {len(view):,} bytes expected, {done:,} read")
            yield data, count
