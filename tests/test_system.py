"""The machine facts a loader depends on: how many cores this process may really use."""

import os

import pytest

from packdata import system


@pytest.mark.parametrize(
    "cpu_max, cores",
    [("max 100000\n", None), ("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000\n", 1)],
)
def test_a_cgroup_v2_quota_counts_in_whole_cores(tmp_path, cpu_max, cores):
    (tmp_path / "cpu.max").write_text(cpu_max)
    assert system.cgroup_cpu_quota(tmp_path) == cores


@pytest.mark.parametrize("quota, cores", [("-1", None), ("300000", 3)])
def test_a_cgroup_v1_quota_counts_in_whole_cores(tmp_path, quota, cores):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(quota + "\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert system.cgroup_cpu_quota(tmp_path) == cores


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert system.cgroup_cpu_quota(tmp_path) is None


def test_usable_cores_is_capped_by_the_quota(tmp_path, monkeypatch):
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    monkeypatch.setattr(system, "CGROUP_ROOT", str(tmp_path))
    assert system.usable_cores() == 1
    monkeypatch.setattr(system, "CGROUP_ROOT", str(tmp_path / "nowhere"))
    assert system.usable_cores() == len(os.sched_getaffinity(0))
