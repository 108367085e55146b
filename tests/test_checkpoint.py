"""A job under a real ``torchrun`` saves every rank's loader state (``checkpoint.every_rank``) and
resumes from it (``checkpoint.resume_loader``), with the same ranks and workers or with others:
every sample of the epoch once."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from packdata import shardread, shardwrite
from packdata.checkpoint import every_rank, resume_loader
from packdata.multinode import finish
from packdata.streaming import ShardDataset

JOB = Path(__file__).with_name("ranks_job.py")


@pytest.fixture(scope="module")
def shards(tiny_dataset, tmp_path_factory):
    written = shardwrite.write_shards(
        tiny_dataset, tmp_path_factory.mktemp("shards"), maxcount=7, progress=False
    )
    return [str(info.path) for info in written]  # 60 samples in 9 shards


def run_job(folder, ranks, num_workers, stop, shards):
    """The job's run under ``torchrun`` with ``ranks`` ranks; what each rank reported."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc_per_node={ranks}", str(JOB), str(folder), str(num_workers), str(stop)]
    with subprocess.Popen(
        [*command, *shards], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as torchrun:
        out, err, hung = finish(torchrun, timeout=120)
    assert not hung and torchrun.returncode == 0, out + err
    reports = [json.loads((folder / f"rank-{rank}.json").read_text()) for rank in range(ranks)]
    for rank in range(ranks):
        (folder / f"rank-{rank}.json").unlink()
    return reports


@pytest.mark.parametrize(
    ("ranks", "num_workers", "how"), [(2, 2, "same layout"), (3, 1, "rest of the epoch")]
)
def test_a_job_stopped_with_2_ranks_resumes_every_sample_once(
    shards, tmp_path, ranks, num_workers, how
):
    first = run_job(tmp_path, 2, 2, 3, shards)  # 3 steps of 4 samples on each rank
    then = run_job(tmp_path, ranks, num_workers, 0, shards)
    assert [report["how"] for report in then] == [how] * ranks
    before = [key for report in first for key in report["keys"]]
    after = [key for report in then for key in report["keys"]]
    assert len(before) == 2 * 3 * 4
    everything = [sample["__key__"] for sample in shardread.iter_shard_samples(shards)]
    assert Counter(before + after) == Counter(everything)


@pytest.mark.parametrize(("before", "after"), [(1, 0), (0, 1)])
def test_a_single_process_job_resumes_between_no_worker_and_one(shards, before, after):
    """A loader without workers saves another kind of state than one with one worker: the resume
    goes through the rest of the epoch."""

    def loader_of(dataset, workers):
        return StatefulDataLoader(dataset, batch_size=4, num_workers=workers)

    options = {"keys": ("__key__", "cls"), "decode": False, "rank": 0, "world_size": 1}
    first = loader_of(ShardDataset(shards, **options), before)
    batches = iter(first)
    taken = [key for _ in range(3) for key in next(batches)[0]]
    saved = every_rank(first)
    del batches
    dataset = ShardDataset(shards, **options)
    then = loader_of(dataset, after)
    assert resume_loader(saved, dataset, then) == "rest of the epoch"
    rest = [key for keys, _ in then for key in keys]
    everything = [sample["__key__"] for sample in shardread.iter_shard_samples(shards)]
    assert Counter(taken + rest) == Counter(everything)
