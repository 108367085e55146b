"""Train packdata's SmallCNN from tar shards in every process of a torchrun job, e.g. on one machine
with two:

    torchrun --standalone --nproc_per_node=2 scripts/train.py \
    "http://127.0.0.1:8080/datasets/shapes/train-{000000..000008}.tar" \
        --test http://127.0.0.1:8080/datasets/shapes/train-000009.tar --epochs 2

(with a store serving the shards there, as lesson 6 starts one; local shard paths need none).

Each rank streams its own shards (``ShardDataset`` splits the list by rank, then by DataLoader
worker), every rank runs the same number of steps (``common_steps``) so no gradient all-reduce waits
for a rank that has run out, and rank 0 reports the test accuracy. NCCL when every rank on a machine
has a GPU of its own, else gloo on CPU.
"""

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from packdata.streaming import ShardDataset
from packdata.system import pick_device
from packdata.train import SmallCNN, common_steps, evaluate, train_epoch
from packdata.watchdog import exit_with


def say(line):
    """Print ``line`` in one write, so that the ranks' lines never interleave on a shared stdout
    (with PYTHONUNBUFFERED set, ``print`` writes the text and its newline separately)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "shards", nargs="+", help="training shards: paths, http:// URLs or brace patterns"
    )
    parser.add_argument(
        "--test", nargs="+", required=True, help="shards to measure the accuracy on (rank 0)"
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    parser.add_argument(
        "--buffer", type=int, default=500, help="shuffle buffer per worker, in samples"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--classes", type=int, default=10, help="number of classes the model tells apart"
    )
    parser.add_argument(
        "--size",
        type=int,
        help="crop every image to SIZE×SIZE pixels (random crops for training, the centre for "
        "the test), as images of different sizes need; default: as they are, all of one size",
    )
    parser.add_argument(
        "--report", type=Path, help="folder for one JSON per rank: its steps and sample keys"
    )
    return parser.parse_args(argv)


def ddp_device():
    """This rank's device: its own GPU (by ``LOCAL_RANK``) when the machine has one per rank, else
    the CPU, where gloo runs (gloo handles only CPU and CUDA tensors, so never Apple's MPS; ranks
    sharing a GPU break NCCL)."""
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if pick_device().type == "cuda" and torch.cuda.device_count() >= ranks_here:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def transforms(size):
    """``(training, test)`` transforms to ``size``×``size`` pixels; None: images as they are."""
    if size is None:
        return None, None
    test = v2.Compose([v2.Resize(size, antialias=True), v2.CenterCrop(size)])
    return v2.RandomResizedCrop(size, antialias=True), test


def main(argv=None):
    args = parse_args(argv)
    device = ddp_device()
    if device.type == "cuda":
        # NCCL's collectives run on the current device: this rank's own GPU, bound to the group
        # (without device_id, every barrier warns that it guesses the device)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)  # the ranks share the cores; don't let each try to use them all
    # the same initial weights on every rank (DDP also broadcasts rank 0's)
    torch.manual_seed(args.seed)
    training, test_transform = transforms(args.size)

    # each worker batches its own samples (as a DataLoader would), and names an image of another
    # size than its batch's first
    dataset = ShardDataset(
        args.shards,
        rank=rank,
        world_size=world_size,
        seed=args.seed,
        buffer_size=args.buffer,
        keys=("jpg", "cls", "__key__"),
        transform=training,
        batch_size=args.batch_size,
        equalize=True,
    )
    model = DistributedDataParallel(SmallCNN(args.classes).to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    keys, steps_run = [], []  # per epoch: the keys of the samples trained on, the steps run

    def images_and_labels(loader):
        for images, labels, batch_keys in loader:
            keys[-1].extend(batch_keys)
            yield images, labels

    started = time.perf_counter()
    for epoch in range(args.epochs):
        dataset.set_epoch(epoch)
        keys.append([])
        # workers end with this rank, even killed outright (they are the forkserver's children)
        loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=args.workers,
            worker_init_fn=exit_with(os.getpid()),
        )
        steps = common_steps(len(dataset), args.batch_size)
        if steps == 0:
            raise SystemExit(
                f"rank {rank}: --batch-size {args.batch_size} is more than the {len(dataset)} "
                "samples a rank has an epoch: no step can run (give a smaller batch, or more data)"
            )
        loss, seen = train_epoch(model, images_and_labels(loader), optimizer, device, steps)
        steps_run.append(steps)
        say(
            f"rank {rank}: epoch {epoch + 1}: {steps} steps, {seen} of its {len(dataset)} samples "
            f"from {len(dataset.shards_for())} shards, loss {loss:.3f}"
        )
    if args.report:
        args.report.mkdir(parents=True, exist_ok=True)
        report = {"rank": rank, "world_size": world_size, "steps": steps_run, "keys": keys}
        (args.report / f"rank-{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    if rank == 0:
        test = ShardDataset(
            args.test, rank=0, world_size=1, shuffle=False, transform=test_transform, batch_size=256
        )
        accuracy = evaluate(model.module, DataLoader(test, batch_size=None), device)
        say(
            f"rank 0: test accuracy {accuracy:.1%} on {len(test)} samples after {args.epochs} "
            "epochs on "
            f"{world_size} ranks, {time.perf_counter() - started:.1f} s"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    # A rank runs threads of torch.distributed's; a DataLoader worker forked from it can hang for
    # good on a lock one of them held at that moment (it happened here, under load; Python 3.12
    # warns of it, and 3.14 no longer forks by default). forkserver workers fork from a server that
    # has no threads.
    if "forkserver" in multiprocessing.get_all_start_methods():
        multiprocessing.set_start_method("forkserver")
    main()
