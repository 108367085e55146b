"""A real one-node Slurm cluster on loopback (packdata.localslurm) runs the course's job script,
scripts/slurm/train.sbatch: sbatch, srun staging once per node, torchrun's ranks with equal steps.

Skipped, with the daemon and its log's last lines, when Slurm is not installed or cannot start here;
with PACKDATA_REQUIRE_SLURM=1 (as in .ci/run) those are failures instead.
"""

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from packdata import localslurm, shardwrite, synthetic
from packdata.course import slurm_checks

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm" / "train.sbatch"
REQUIRED = os.environ.get("PACKDATA_REQUIRE_SLURM") == "1"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The cluster, started in a folder of its own for this module, stopped after it."""
    folder = tmp_path_factory.mktemp("slurm")
    try:
        with localslurm.cluster(folder) as cluster:
            yield cluster
    except localslurm.SlurmError as error:
        if REQUIRED:
            raise
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """The small synthetic set (500 images) as ten shards of 50: nine to train on, one to test."""
    written = shardwrite.write_shards(
        synthetic.make_dataset(size="small", progress=False),
        tmp_path_factory.mktemp("shards"),
        maxcount=50,
        progress=False,
    )
    return [str(info.path) for info in written]


def test_a_missing_slurm_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(localslurm, "missing_programs", lambda: ["munged", "slurmctld"])
    with pytest.raises(localslurm.SlurmMissing, match="munged, slurmctld.*apt-get install"):
        localslurm.LocalSlurm(tmp_path).start()


def test_a_daemon_that_cannot_start_is_named_with_its_log(slurm, tmp_path):
    # a second cluster beside the running one, whose controller port is taken: slurmctld fails
    other = localslurm.LocalSlurm(tmp_path / "other")
    taken = re.search(r"SlurmctldPort=\d+", slurm.conf.read_text())[0]
    render = other.render

    def render_on_a_taken_port():
        render()
        other.conf.write_text(re.sub(r"SlurmctldPort=\d+", taken, other.conf.read_text()))

    other.render = render_on_a_taken_port
    with pytest.raises(
        localslurm.SlurmError, match=r"slurmctld could not start (?s:.*)Address already in use"
    ):
        other.start(timeout=15)
    assert not other.running()  # its munged was stopped again


@pytest.fixture
def scratch():
    """The job's ``TMPDIR``, on a short path: multiprocessing puts its sockets there, and a
    DataLoader worker that hands a batch over fails with "AF_UNIX path too long" past 107 bytes
    (pytest's own temporary folders, under pytest-xdist, come close)."""
    folder = Path(tempfile.mkdtemp(prefix="slurm-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_job_script_trains_on_every_rank_with_equal_steps(slurm, shards, scratch, tmp_path):
    reports = tmp_path / "reports"
    env = slurm.environment(
        SHARDS=str(Path(shards[0]).parent / "train-{000000..000008}.tar"),
        TEST=shards[9],
        TRAIN_ARGS=f"--epochs 2 --batch-size 16 --buffer 50 --report {reports}",
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        TMPDIR=str(scratch),
    )
    started = time.perf_counter()
    job = slurm.submit(SCRIPT, f"--output={tmp_path}/%j.out", env=env, cwd=ROOT)
    # numbered from a random start, so that another cluster on this host numbers other jobs
    assert job >= int(re.search(r"^FirstJobId=(\d+)$", slurm.conf.read_text(), re.M)[1])
    state = slurm.wait(job, timeout=240)
    wall = time.perf_counter() - started
    log = (tmp_path / f"{job}.out").read_text()
    assert state == "COMPLETED", log
    print(f"job {job}: {wall:.1f} s from sbatch to its end")

    # staged once on the node, then its scratch emptied
    assert len(re.findall(r"9 shards .* in .*/packdata-" + str(job), log)) == 1, log
    assert not (scratch / f"packdata-{job}").exists()
    # every rank's lines, each epoch the same number of steps on both ranks
    steps = {}  # {epoch: {rank: steps}}
    for rank, epoch, count in re.findall(r"^0: rank (\d): epoch (\d): (\d+) steps", log, re.M):
        steps.setdefault(epoch, {})[rank] = int(count)
    assert {epoch: set(ranks) for epoch, ranks in steps.items()} == {
        "1": {"0", "1"},
        "2": {"0", "1"},
    }
    assert all(len(set(ranks.values())) == 1 for ranks in steps.values()), log
    assert re.search(r"^0: rank 0: test accuracy", log, re.MULTILINE), log
    # and the ranks trained on different samples
    keys = [json.loads((reports / f"rank-{rank}.json").read_text())["keys"] for rank in (0, 1)]
    for epoch in range(2):
        assert keys[0][epoch] and not set(keys[0][epoch]) & set(keys[1][epoch])


MAKE_DATASET = """
import os, warnings
from packdata.streaming import ShardDataset
warnings.simplefilter("always")
data = ShardDataset(os.environ["SHARDS"].split())
print(f"made: rank {data.rank} of {data.world_size}", flush=True)
"""

SRUN_TASKS = """#!/bin/bash
echo "batch script:"
python -c "$MAKE" 2>&1
echo "two tasks, no rank:"
srun --quiet --ntasks=2 --label python -c "$MAKE" 2>&1
echo "two tasks, their ranks from Slurm:"
srun --quiet --ntasks=2 --label bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS \\
    python -c "$MAKE" 2>&1'
"""


def test_tasks_of_one_srun_step_without_a_rank_are_warned(slurm, shards, scratch, tmp_path):
    (tmp_path / "tasks.sh").write_text(SRUN_TASKS)
    env = slurm.environment(
        MAKE=MAKE_DATASET,
        SHARDS=" ".join(shards[:2]),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        TMPDIR=str(scratch),
    )
    options = [f"--output={tmp_path}/%j.out", "--ntasks=2"]
    job = slurm.submit(tmp_path / "tasks.sh", *options, env=env, cwd=ROOT)
    state = slurm.wait(job, timeout=120)
    log = (tmp_path / f"{job}.out").read_text()
    assert state == "COMPLETED", log
    batch, bare, ranked = re.split(r"^two tasks.*$", log.split("batch script:")[1], flags=re.M)
    assert "made: rank 0 of 1" in batch and "Slurm step" not in batch, log
    warned = re.findall(r"^(\d): .*task (\d) of 2 of a Slurm step, and no rank is set", bare, re.M)
    assert sorted(warned) == [("0", "0"), ("1", "1")], log
    assert bare.count("made: rank 0 of 1") == 2, log
    assert "Slurm step" not in ranked and sorted(re.findall(r"made: rank (\d) of 2", ranked)) == [
        "0",
        "1",
    ], log


def right(slurm):
    """Exercise 1's answer: Slurm's strings as they are, ready for os.environ."""
    return {
        "RANK": slurm["SLURM_PROCID"],
        "WORLD_SIZE": slurm["SLURM_NTASKS"],
        "LOCAL_RANK": slurm["SLURM_LOCALID"],
        "LOCAL_WORLD_SIZE": str(slurm_checks.tasks_on_node(slurm)),
        "GROUP_RANK": slurm["SLURM_NODEID"],
    }


@pytest.mark.parametrize(
    "counts, node, expected",
    [("3(x2)", 1, 3), ("3,2", 1, 2), ("3(x2),2", 2, 2), ("4,2(x3)", 3, 2), ("8", 0, 8)],
)
def test_a_nodes_task_count_is_read_from_the_compressed_list(counts, node, expected):
    task = {"SLURM_TASKS_PER_NODE": counts, "SLURM_NODEID": str(node)}
    assert slurm_checks.tasks_on_node(task) == expected


def test_the_uneven_job_has_no_ntasks_per_node_and_numbers_its_tasks_node_by_node():
    tasks = slurm_checks.slurm_tasks((3, 2))
    assert [t["SLURM_PROCID"] for t in tasks] == ["0", "1", "2", "3", "4"]
    assert [t["SLURM_LOCALID"] for t in tasks] == ["0", "1", "2", "0", "1"]
    assert {t["SLURM_TASKS_PER_NODE"] for t in tasks} == {"3,2"}
    assert not any("SLURM_NTASKS_PER_NODE" in t for t in tasks)


def test_the_exercise_check_names_the_usual_mistakes():
    slurm_checks.check_torch_env(right)
    mistakes = {
        ("RANK", "SLURM_NODEID"): "tasks of one node would all get the same rank",
        ("RANK", "SLURM_LOCALID"): "two nodes would both have a rank 0",
        ("WORLD_SIZE", "SLURM_NNODES"): "counts ranks, not nodes",
        ("LOCAL_RANK", "SLURM_PROCID"): "restarts at 0 on every node",
    }
    for (name, used), why in mistakes.items():
        with pytest.raises(slurm_checks.CheckFailed, match=f"{name}: .*{why}"):
            slurm_checks.check_torch_env(
                lambda slurm, name=name, used=used: {**right(slurm), name: slurm[used]}
            )
    # the plain count passes the even job and is missing from the uneven one
    with pytest.raises(slurm_checks.CheckFailed, match="sets only with --ntasks-per-node; .*'3,2'"):
        slurm_checks.check_torch_env(
            lambda slurm: {**right(slurm), "LOCAL_WORLD_SIZE": slurm["SLURM_NTASKS_PER_NODE"]}
        )
    # the node's GPUs are its ranks only when srun starts a task per GPU
    with pytest.raises(slurm_checks.CheckFailed, match="LOCAL_WORLD_SIZE: that counts the node's"):
        slurm_checks.check_torch_env(
            lambda slurm: {**right(slurm), "LOCAL_WORLD_SIZE": slurm["SLURM_GPUS_ON_NODE"]}
        )
    with pytest.raises(slurm_checks.CheckFailed, match="read 'SLURM_GPUS_PER_NODE', which Slurm"):
        slurm_checks.check_torch_env(
            lambda slurm: {**right(slurm), "X": slurm["SLURM_GPUS_PER_NODE"]}
        )
    with pytest.raises(slurm_checks.CheckFailed, match="other than its slurm argument"):
        slurm_checks.check_torch_env(
            lambda slurm: {**right(slurm), "RANK": os.environ["SLURM_PROCID"]}
        )
    with pytest.raises(slurm_checks.CheckFailed, match="return a dict"):
        slurm_checks.check_torch_env(lambda slurm: tuple(right(slurm).values()))


def test_srun_s_step_counts_are_a_right_answer_too():
    def from_step(slurm):
        counts = {**slurm, "SLURM_TASKS_PER_NODE": slurm["SLURM_STEP_TASKS_PER_NODE"]}
        return {
            **right(slurm),
            "WORLD_SIZE": slurm["SLURM_STEP_NUM_TASKS"],
            "LOCAL_WORLD_SIZE": str(slurm_checks.tasks_on_node(counts)),
        }

    slurm_checks.check_torch_env(from_step)


def test_a_confusion_is_named_only_when_the_value_comes_from_that_variable():
    # tasks // nodes is 3 in the even job, and 2 on both nodes of the uneven one, as
    # SLURM_NNODES is: the learner read it, but did not take the value from it
    def divided(slurm):
        per_node = int(slurm["SLURM_NTASKS"]) // int(slurm["SLURM_NNODES"])
        return {**right(slurm), "LOCAL_WORLD_SIZE": str(per_node)}

    with pytest.raises(slurm_checks.CheckFailed, match="got 2. Slurm put the tasks .*unevenly"):
        slurm_checks.check_torch_env(divided)
    # the first entry of '3,2' is 3 on every node, as SLURM_GPUS_ON_NODE is: never read
    with pytest.raises(slurm_checks.CheckFailed, match="should be 2, got 3. Slurm put"):
        slurm_checks.check_torch_env(
            lambda slurm: {**right(slurm), "LOCAL_WORLD_SIZE": slurm["SLURM_TASKS_PER_NODE"][0]}
        )


def test_an_entry_taken_from_a_count_for_several_nodes_is_explained():
    def unexpanded(slurm):
        entries = slurm["SLURM_TASKS_PER_NODE"].split(",")
        return {**right(slurm), "LOCAL_WORLD_SIZE": entries[int(slurm["SLURM_NODEID"])]}

    with pytest.raises(slurm_checks.CheckFailed, match=r"IndexError .*Expand it \('3\(x2\)'"):
        slurm_checks.check_torch_env(unexpanded)


@pytest.mark.parametrize("convert", [str, int], ids=["returned", "converted by the learner"])
def test_a_slurm_variable_that_is_no_number_is_explained_either_way(convert):
    # the hint comes whether the learner's own int() raises or the check's, on the strings returned
    with pytest.raises(slurm_checks.CheckFailed, match="host name \\('gpu07'\\), not its number"):
        slurm_checks.check_torch_env(
            lambda slurm: {**right(slurm), "GROUP_RANK": convert(slurm["SLURMD_NODENAME"])}
        )
    with pytest.raises(slurm_checks.CheckFailed, match="SLURM_TASKS_PER_NODE is '3\\(x2\\)'"):
        slurm_checks.check_torch_env(
            lambda slurm: {
                **right(slurm),
                "LOCAL_WORLD_SIZE": convert(slurm["SLURM_TASKS_PER_NODE"]),
            }
        )


def test_numbers_for_os_environ_are_named():
    # right values, as ints: os.environ.update(torch_env(os.environ)) would raise TypeError
    with pytest.raises(slurm_checks.CheckFailed, match="RANK is 0, not a string: .*not int"):
        slurm_checks.check_torch_env(lambda slurm: {k: int(v) for k, v in right(slurm).items()})


def test_the_install_advice_names_every_missing_program_in_lines_that_fit_a_slide():
    advice = localslurm.how_to_install(list(localslurm.DAEMONS + localslurm.CLIENTS))
    assert all(name in advice for name in localslurm.DAEMONS + localslurm.CLIENTS)
    assert "apt-get install slurm-wlm munge" in advice and "train.sbatch" not in advice
    assert max(map(len, advice.splitlines())) <= 88


def test_a_login_node_is_told_to_submit_to_its_cluster():
    # Slurm's commands without its daemons: a cluster's login node, where installing is no answer
    advice = localslurm.how_to_install(list(localslurm.DAEMONS))
    assert all(name in advice for name in localslurm.DAEMONS)
    assert "login node" in advice and "scripts/slurm/train.sbatch" in advice
    assert max(map(len, advice.splitlines())) <= 88 and len(advice.splitlines()) <= 4
