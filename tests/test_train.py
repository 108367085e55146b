"""The training helpers, and scripts/train.py under torchrun: ranks split the shards and run the
same steps."""

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from packdata import shardread, shardwrite
from packdata.multinode import finish
from packdata.streaming import ShardDataset
from packdata.train import SmallCNN, common_steps, evaluate, train_epoch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train.py"


@pytest.fixture(scope="module")
def shard_paths(tiny_dataset, tmp_path_factory):
    written = shardwrite.write_shards(
        tiny_dataset, tmp_path_factory.mktemp("shards"), maxcount=11, progress=False
    )
    return [str(info.path) for info in written]  # 60 samples: five shards of 11 and one of 5


def test_the_model_takes_uint8_batches_and_scores_every_class():
    scores = SmallCNN(num_classes=10)(torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8))
    assert scores.shape == (4, 10)


def test_training_fits_a_small_set_of_shards(shard_paths):
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = DataLoader(ShardDataset(shard_paths, shuffle=False), batch_size=20)
    losses = [train_epoch(model, loader, optimizer, torch.device("cpu"))[0] for _ in range(12)]
    assert losses[-1] < losses[0] / 2
    # the training set itself: chance is 0.1
    assert evaluate(model, loader, torch.device("cpu")) > 0.3


def test_evaluating_on_no_samples_says_so():
    with pytest.raises(ValueError, match="no samples"):
        evaluate(SmallCNN(), [], torch.device("cpu"))


def test_steps_and_samples_are_counted_and_capped(shard_paths):
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(ShardDataset(shard_paths), batch_size=8)
    assert train_epoch(model, loader, optimizer, torch.device("cpu"), steps=3)[1] == 24
    assert common_steps(60, 8) == 7  # outside a distributed job: this process's whole batches


def run_torchrun(command, timeout):
    """``command``'s run, as ``subprocess.run`` gives it; when it hangs, torchrun and its ranks
    are stopped and the test fails with what the ranks printed."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as torchrun:
        out, err, hung = finish(torchrun, timeout)
    if hung:
        pytest.fail(f"torchrun hung for {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(command, torchrun.returncode, out, err)


def test_torchrun_splits_shards_per_rank_with_equal_steps(shard_paths, tmp_path):
    # five training shards: three for one rank, two for the other
    train, test = shard_paths[:5], shard_paths[5]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(SCRIPT),
        *train,
        "--test",
        test,
        "--epochs",
        "2",
        "--batch-size",
        "8",
        "--workers",
        "2",
        "--buffer",
        "10",
        "--report",
        str(tmp_path),
    ]
    run = run_torchrun(command, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "rank 0: test accuracy" in run.stdout
    reports = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    # 22 samples on the smaller rank: 2 whole batches
    assert reports[0]["steps"] == reports[1]["steps"] == [2, 2]
    keys_by_shard = {
        key: shard
        for shard in train
        for key in (s["__key__"] for s in shardread.iter_shard_samples([shard]))
    }
    for epoch in range(2):
        seen = [reports[rank]["keys"][epoch] for rank in (0, 1)]
        assert len(seen[0]) == len(seen[1]) == 2 * 8
        assert not set(seen[0]) & set(seen[1])  # no sample trained on by both ranks
        shards_of = [{keys_by_shard[key] for key in keys} for keys in seen]
        assert not shards_of[0] & shards_of[1]  # each shard read by one rank only


@pytest.fixture(scope="module")
def mixed_sizes(write_tar, tmp_path_factory):
    """Three shards of 8 photos each, half of them landscape and half portrait, labels 0 and 1."""
    folder = tmp_path_factory.mktemp("mixed")
    paths = []
    for shard in range(3):
        members = []
        for number in range(8):
            size = (40, 30) if number % 2 else (30, 40)
            encoded = io.BytesIO()
            Image.new("RGB", size, (60 * shard, 30 * number, 90)).save(encoded, "JPEG")
            key = f"s{shard}n{number}"
            members += [(f"{key}.jpg", encoded.getvalue()), (f"{key}.cls", b"%d" % (number % 2))]
        paths.append(write_tar(folder / f"mixed-{shard}.tar", members))
    return paths


def torchrun_train(shards, *options):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node=2", str(SCRIPT), *shards[:2], "--test", shards[2]]
    command += ["--epochs", "1", "--batch-size", "4", "--classes", "2", *options]
    return run_torchrun(command, timeout=120)


def test_images_of_mixed_sizes_are_named_and_cropped_with_size(mixed_sizes):
    without = torchrun_train(mixed_sizes)
    assert without.returncode != 0
    assert re.search(r"sample 's\dn\d' has an image of shape .* resize them", without.stderr)
    cropped = torchrun_train(mixed_sizes, "--size", "24")
    assert cropped.returncode == 0, cropped.stdout + cropped.stderr
    assert re.search(r"rank 0: epoch 1: 2 steps, 8 of its 8 samples", cropped.stdout)
    assert "rank 0: test accuracy" in cropped.stdout
