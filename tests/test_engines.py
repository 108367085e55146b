"""The same map over shards on a process pool and on a real Dask cluster (a LocalCluster of two
worker processes on loopback): the same output shards, visible progress, and a worker killed with
SIGKILL mid-map survived with every sample exactly once and no partial file."""

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest

from packdata import cli, compare, enginebench, engines
from packdata.mapshards import map_shards, resize_sample, shell_sample
from packdata.shardread import iter_shard_samples
from packdata.shardwrite import write_shards

pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    """A Dask LocalCluster of 2 worker processes, 1 thread each, started once for this module."""
    with engines.dask_client(workers=2) as client:
        yield client


@pytest.fixture(scope="module")
def shards(tiny_dataset, tmp_path_factory):
    """10 shards of 6 samples each."""
    written = write_shards(
        tiny_dataset, tmp_path_factory.mktemp("shards"), maxcount=6, progress=False
    )
    return [info.path for info in written]


def keys_in(paths):
    """Every key in ``paths``, in order; a key seen twice fails the test."""
    keys = [sample["__key__"] for sample in iter_shard_samples([str(p) for p in paths])]
    assert len(keys) == len(set(keys)), "a sample is in the output twice"
    return sorted(keys)


def test_the_pool_and_dask_write_the_same_shards_and_show_progress(
    client, shards, tmp_path, capsys
):
    resize = partial(resize_sample, size=16)
    with engines.local(processes=2) as executor:
        on_pool = map_shards(resize, shards, tmp_path / "pool", executor=executor)
    assert f"mapped {len(shards)}/{len(shards)} shards" in capsys.readouterr().out
    with engines.dask(client.scheduler.address) as executor:  # the way to a real cluster
        on_dask = map_shards(resize, shards, tmp_path / "dask", executor=executor, progress=False)
    assert [samples for _, samples in on_pool] == [samples for _, samples in on_dask]
    assert keys_in(p for p, _ in on_dask) == keys_in(shards)
    for (pool_path, _), (dask_path, _) in zip(on_pool, on_dask):
        assert pool_path.read_bytes() == dask_path.read_bytes()


def test_the_executors_refuse_work_once_closed(client):
    with engines.local(processes=1) as pool, engines.dask(client.scheduler.address) as on_dask:
        assert pool.submit(abs, -2).result() == on_dask.submit(abs, -2).result() == 2
    for executor in (pool, on_dask):
        with pytest.raises(RuntimeError, match="shutdown"):
            executor.submit(abs, -2)


def wait_for(condition, timeout=30):
    """Poll ``condition()`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def hidden_files(folder):
    return list(folder.glob(".*")) if folder.exists() else []


def test_a_worker_killed_mid_map_is_survived(client, shards, tmp_path):
    out = tmp_path / "out"
    slow_copy = partial(shell_sample, command="sleep 0.05")  # each shard takes about 0.5 s
    executor = client.get_executor(pure=False)
    with ThreadPoolExecutor(1) as background:
        mapping = background.submit(
            map_shards, slow_copy, shards, out, executor=executor, progress=False
        )
        wait_for(lambda: len(hidden_files(out)) == 2)  # both workers are writing a shard
        victim = next(iter(client.scheduler_info()["workers"]))
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        written = mapping.result(timeout=120)
    assert pid not in client.run(os.getpid).values()  # the worker did die (its nanny restarts it)
    assert keys_in(p for p, _ in written) == keys_in(shards)  # every sample exactly once
    assert sorted(out.iterdir()) == sorted(p for p, _ in written)  # no partial file left
    times = [p.stat().st_mtime_ns for p, _ in written]
    assert map_shards(slow_copy, shards, out, executor=executor, progress=False) == written
    assert [p.stat().st_mtime_ns for p, _ in written] == times  # a re-run skips finished shards


def test_the_command_line_maps_on_a_dask_scheduler(client, shards, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["shards", "map", *map(str, shards[:2]), "-o", str(out)]
    assert cli.main([*argv, "-c", "rm sample.cls", "--dask", client.scheduler.address]) == 0
    assert f"{out / shards[1].name}\t6 samples" in capsys.readouterr().out
    assert {tuple(sorted(s)) for s in iter_shard_samples([str(out / shards[0].name)])} == {
        ("__key__", "__url__", "jpg")
    }


def test_the_engine_verdict_predicts_the_ratio_from_the_cpu_per_shard():
    rates = compare.Comparison({"pool": [800, 820, 810], "dask": [620, 600, 610]})
    result = enginebench.EngineComparison(
        rates,
        startup={"pool": 0.0, "dask": 0.5},
        per_task={"pool": 0.0001, "dask": 0.0035},
        cpu_per_shard={"pool": 0.235, "dask": 0.305},
        task_seconds=0.243,
    )
    last = result.verdict().splitlines()[-1]
    assert (
        last
        == "dask spends 1.30× pool's CPU per shard: with the cores full, that alone predicts 0.77×"
    )
