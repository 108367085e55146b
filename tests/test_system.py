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
    monkeypatch.setattr(system, "CGROUP_LISTING", str(tmp_path / "no listing"))
    assert system.usable_cores() == 1
    monkeypatch.setattr(system, "CGROUP_ROOT", str(tmp_path / "nowhere"))
    assert system.usable_cores() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "quotas, cores",
    [
        ({"system.slice/jupyter-ada.service": "200000 100000"}, 2),  # a hub user's service
        ({"system.slice": "100000 100000", "system.slice/jupyter-ada.service": "max 100000"}, 1),
        ({}, None),
    ],
)
def test_a_quota_on_the_process_cgroup_or_one_above_it_binds(tmp_path, monkeypatch, quotas, cores):
    for folder, cpu_max in quotas.items():
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "cpu.max").write_text(cpu_max + "\n")
    listing = tmp_path / "cgroup"
    listing.write_text("1:cpu:/\n0::/system.slice/jupyter-ada.service\n")
    assert system.cgroup_folders(tmp_path, listing) == [
        tmp_path / "system.slice" / "jupyter-ada.service",
        tmp_path / "system.slice",
        tmp_path,
    ]
    monkeypatch.setattr(system, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(system, "CGROUP_LISTING", str(listing))
    affinity = len(os.sched_getaffinity(0))
    assert system.usable_cores() == (affinity if cores is None else min(affinity, cores))


def test_the_report_says_when_curl_is_missing(monkeypatch):
    monkeypatch.setattr(system.shutil, "which", lambda name: None)
    assert system.environment_report()["curl"].startswith("missing: webdataset cannot read")
