"""make bench-gpu: the last hop, from the loader to a GPU, measured where there is one.

    python benchmarks/gpu.py            # on a machine with a CUDA GPU
    python benchmarks/gpu.py --cpu      # loops 2 and 3 on the CPU with a small CNN: checks that
                                        # the script runs (the numbers mean nothing)

Elsewhere it says that there is nothing to measure and stops. Three measurements, each taken in
turns (one call of each setting, round after round), so that a slow spell hits every side:

1. **The copy:** a batch of 256 ImageNet crops (3×224×224, uint8) copied to the GPU from pageable
   memory, from pinned memory, and from pinned memory with ``non_blocking=True``.
2. **A loop the GPU sets the pace of:** ResNet-50 training steps (bf16 autocast) on batches that
   the DataLoader's workers only stack (ready-made crops in memory), with ``pin_memory`` off, on,
   and on with ``non_blocking`` copies. Pinning can pay only here, where the loader keeps up.
3. **A loop the loader sets the pace of:** the same steps on 4,000 photos (``packdata.photos``,
   ImageNet-sized JPEGs: about 400 MB in ``data/photos-4000``, made on first use, so that every
   worker still fills its batches) read from shards, decoded and cropped to 224×224 by 2 workers up
   to all cores but two: the share of each step's time spent waiting for data, and what the GPU's
   own rate asks of the loader.
"""

import argparse
import math
import tempfile

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, TensorDataset

from packdata import compare, datawait, imagefolder, photos, shardwrite
from packdata.cachebench import CROP
from packdata.streaming import ShardDataset
from packdata.system import usable_cores
from packdata.train import SmallCNN

BATCH = (256, 3, 224, 224)


def make_step(model, device, non_blocking):
    """One training step of ``model`` on a ``(uint8 images, labels)`` batch, queued on ``device``
    (no ``.item()``, so nothing waits for the GPU but the copy itself, where it must)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(batch):
        images, labels = (t.to(device, non_blocking=non_blocking) for t in batch)
        images = images.to(memory_format=torch.channels_last).float().div_(255)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def epochs_of_steps(loader, step, device):
    """A ``run`` for ``compare.in_turn``: one epoch of ``loader``, a step per batch, and the
    samples it trained on once the device has finished them."""

    def run():
        samples = 0
        for batch in loader:
            step(batch)
            samples += len(batch[1])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return samples

    return run


def the_copy(device):
    print(f"1. A batch {tuple(BATCH)} of uint8 to {torch.cuda.get_device_name(device)}")
    rounds = [datawait.copy_seconds(device, BATCH) for _ in range(3)]
    for name in rounds[0]:
        seconds = sorted(r[name] for r in rounds)
        gb_s = [math.prod(BATCH) / s / 1e9 for s in seconds]
        print(
            f"{name:>22}: {seconds[1] * 1e3:6.2f} ms ({gb_s[1]:5.1f} GB/s; rounds "
            f"{min(gb_s):.1f} to {max(gb_s):.1f})"
        )


def gpu_paced(model, device, batch, steps, workers):
    print(f"\n2. Training steps on ready-made crops, batches of {batch}, {workers} workers")
    crops = TensorDataset(
        torch.randint(0, 256, (batch * steps, *BATCH[1:]), dtype=torch.uint8),
        torch.randint(0, 10, (batch * steps,)),
    )
    settings = {
        "pageable": (False, False),
        "pinned": (True, False),
        "pinned, non_blocking": (True, True),
    }
    runs = {
        name: epochs_of_steps(
            DataLoader(
                crops,
                batch_size=batch,
                num_workers=workers,
                pin_memory=pin,
                persistent_workers=True,
                prefetch_factor=4,
            ),
            make_step(model, device, non_blocking),
            device,
        )
        for name, (pin, non_blocking) in settings.items()
    }
    paced = compare.in_turn(runs, rounds=3)
    print(paced)
    print(paced.verdict("pinned", "pageable"))
    print(paced.verdict("pinned, non_blocking", "pageable"))
    return paced.median("pinned, non_blocking")


def loader_paced(model, device, photo_root, batch, worker_counts, gpu_rate, cores):
    print("\n3. The same steps on photos from shards, decoded and cropped by the workers")
    sizes = [sample["bytes"] for sample in imagefolder.load_manifest(photo_root)["samples"]]
    with tempfile.TemporaryDirectory() as scratch:
        shards = shardwrite.write_shards(
            photo_root, scratch, maxcount=25, processes=cores, progress=False
        )
        urls = [info.path for info in shards]
        step = make_step(model, device, non_blocking=True)
        for workers in worker_counts:
            loader = DataLoader(
                ShardDataset(urls, transform=CROP, batch_size=batch),
                batch_size=None,
                num_workers=workers,
                pin_memory=True,
                persistent_workers=True,
            )
            datawait.time_steps(loader, step, device=device)  # an epoch to start the workers
            epochs = (batches for _ in range(3) for batches in loader)
            times = datawait.time_steps(epochs, step, device=device)
            rate = 3 * len(sizes) / times.seconds  # each photo once an epoch
            print(f"{workers:>2} workers: {rate:6,.0f} samples/s, {times}")
    mean_kb = sum(sizes) / len(sizes) / 1e3
    print(
        f"the steps alone run {gpu_rate:,.0f} samples/s (loop 2): at {mean_kb:.0f} KB a JPEG, "
        f"the loader must read {gpu_rate * mean_kb / 1e3:,.0f} MB/s and decode that many"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="run loops 2 and 3 on the CPU with a small CNN, to check that they run (the numbers "
        "mean nothing)",
    )
    args = parser.parse_args(argv)
    if not (torch.cuda.is_available() or args.cpu):
        print(
            "no CUDA GPU here: pinned memory only speeds up copies to one, so there is nothing"
            " to measure (see lesson 6 for the loader's own side)"
        )
        return
    device = torch.device("cpu" if args.cpu else "cuda")
    cores = usable_cores()
    net = SmallCNN if args.cpu else torchvision.models.resnet50
    model = net(num_classes=10).to(device, memory_format=torch.channels_last)
    if not args.cpu:
        the_copy(device)
    batch = 4 if args.cpu else BATCH[0]
    gpu_rate = gpu_paced(model, device, batch, steps=2 if args.cpu else 20, workers=min(4, cores))
    counts = [2] if args.cpu else sorted({n for n in (2, 4, 8, cores - 2) if 1 <= n < cores})
    photo_root = photos.make_photos(size="small" if args.cpu else 4_000, progress=False)
    loader_paced(model, device, photo_root, batch // 2, counts, gpu_rate, cores)


if __name__ == "__main__":
    main()
