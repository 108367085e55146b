"""The job ``tests/test_checkpoint.py`` runs under ``torchrun``: each rank streams its part of the
shards through a ``StatefulDataLoader``, resumed from the checkpoint in the folder when there is
one. After ``stop`` steps (0: the epoch's end) every rank's loader state is gathered, rank 0 saves
them all, and each rank writes the keys it read and how it resumed.

    torchrun --nproc_per_node=2 tests/ranks_job.py FOLDER NUM_WORKERS STOP SHARD...
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from packdata.checkpoint import every_rank, resume_loader
from packdata.streaming import ShardDataset


def main(folder, num_workers, stop, shards):
    dist.init_process_group("gloo")
    data = ShardDataset(shards, keys=("__key__", "cls"), decode=False, seed=0, buffer_size=8)
    loader = StatefulDataLoader(data, batch_size=4, num_workers=num_workers)
    path = folder / "checkpoint.pt"
    how = "start"
    if path.exists():
        how = resume_loader(torch.load(path, weights_only=False), data, loader)
    keys = []
    for step, (batch, _) in enumerate(loader, 1):
        keys += list(batch)
        if step == stop:
            break
    saved = every_rank(loader)
    if dist.get_rank() == 0:
        torch.save(saved, path)
    report = {"how": how, "keys": keys}
    (folder / f"rank-{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    folder, num_workers, stop, *shards = sys.argv[1:]
    main(Path(folder), int(num_workers), int(stop), shards)
