"""Two torchrun launches on loopback, --nnodes=2 and a c10d rendezvous (packdata.multinode), train
scripts/train.py together: ranks numbered across nodes, own shards per rank, equal steps. A launch
that hangs is stopped with its ranks."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packdata import shardread, shardwrite
from packdata.multinode import gpus_per_node, last_lines, launch_nodes, stop

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train.py"


@pytest.fixture(scope="module")
def shard_paths(tiny_dataset, tmp_path_factory):
    written = shardwrite.write_shards(
        tiny_dataset, tmp_path_factory.mktemp("shards"), maxcount=6, progress=False
    )
    return [str(info.path) for info in written]  # 60 samples: ten shards of 6


def test_two_nodes_of_two_ranks_train_together(shard_paths, tmp_path):
    train, test = shard_paths[:9], shard_paths[9]
    arguments = [SCRIPT, *train, "--test", test, "--epochs", "2", "--batch-size", "4"]
    nodes = launch_nodes([*arguments, "--report", tmp_path], nodes=2, procs_per_node=2)
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(n.output for n in nodes)

    # each launch ran two of the four ranks: either 0 and 1 or 2 and 3
    ranks = [{int(r) for r in re.findall(r"^rank (\d):", n.output, re.M)} for n in nodes]
    assert sorted(map(sorted, ranks)) == [[0, 1], [2, 3]]
    assert len(nodes[0].lines("rank 0: test accuracy") + nodes[1].lines("rank 0: test")) == 1

    reports = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(4)]
    assert {report["world_size"] for report in reports} == {4}
    steps = [report["steps"] for report in reports]
    assert steps[0] == steps[1] == steps[2] == steps[3] and min(steps[0]) > 0
    shard_of = {
        key: shard
        for shard in train
        for key in (s["__key__"] for s in shardread.iter_shard_samples([shard]))
    }
    for epoch in range(2):
        keys = [report["keys"][epoch] for report in reports]
        assert len(set().union(*keys)) == sum(map(len, keys))  # no sample on two ranks
        shards = [{shard_of[key] for key in mine} for mine in keys]
        assert len(set().union(*shards)) == sum(map(len, shards))  # nor a shard


HANG = """import os, sys, time
open(os.path.join(sys.argv[1], os.environ["RANK"] + ".pid"), "w").write(str(os.getpid()))
time.sleep(600)
"""


def rank_pids(folder):
    """The process ids the ranks of HANG wrote so far."""
    return [int(text) for path in folder.glob("*.pid") if (text := path.read_text())]


def test_stopping_a_launch_stops_its_ranks(tmp_path):
    (tmp_path / "hang.py").write_text(HANG)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command = [*torchrun, "--nproc_per_node=2", tmp_path / "hang.py", tmp_path]
    launch = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for _ in range(600):  # both ranks running: at most a minute
        if len(pids := rank_pids(tmp_path)) == 2:
            break
        time.sleep(0.1)
    assert len(pids) == 2, stop(launch)[0]
    stop(launch)
    assert launch.returncode is not None
    for pid in pids:  # the ranks are gone, not orphaned (within seconds: a killed rank's exit,
        # and its reaping once torchrun is gone, can lag behind torchrun's own exit)
        assert gone(pid, seconds=10), f"rank {pid} outlived its launch"


def gone(pid, seconds):
    """True once no process ``pid`` exists, looking for at most ``seconds``."""
    for _ in range(int(seconds * 10)):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(
    "visible, nodes, procs, expected",
    [
        ("0,1,2,3", 2, 2, ["0,1", "2,3"]),
        ("4,5", 2, 1, ["4", "5"]),
        ("0,1", 2, 2, ["", ""]),  # two ranks would share a GPU: the CPU instead
        ("", 2, 1, ["", ""]),
    ],
)
def test_each_launch_sees_gpus_of_its_own_or_none(monkeypatch, visible, nodes, procs, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert gpus_per_node(nodes, procs) == expected


def test_last_lines_keep_the_end_of_a_failure_narrow_enough_for_a_slide():
    output = "starting\n\n" + "x" * 200 + "\nRuntimeError: the rendezvous timed out\n  \n"
    shown = last_lines(output, count=2, width=88)
    assert shown.splitlines()[-1] == "RuntimeError: the rendezvous timed out"
    assert "starting" not in shown and max(map(len, shown.splitlines())) <= 88
    assert shown.replace("\n  ", "").startswith("x" * 200)
