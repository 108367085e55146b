import os

import pytest

from packdata import disks
from packdata.disks import (
    NOT_MEASURED,
    REFERENCE_STORAGE,
    evict_from_page_cache,
    filesystem_type,
    fs_overhead,
    time_listing,
    time_stat,
    walk,
)
from packdata.imagefolder import load_manifest, verify_dataset


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux/BSD only")
def test_eviction_works_and_files_read_back_intact(tiny_dataset):
    manifest = load_manifest(tiny_dataset)
    assert evict_from_page_cache(
        [tiny_dataset / sample["path"] for sample in manifest["samples"][:5]]
    )
    assert evict_from_page_cache(tiny_dataset)  # a folder: every file under it
    assert verify_dataset(tiny_dataset) == len(manifest["samples"])


def test_eviction_declines_clearly_without_posix_fadvise(tiny_dataset, monkeypatch):
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    with pytest.warns(RuntimeWarning, match="posix_fadvise is not available"):
        assert evict_from_page_cache(tiny_dataset) is False


def test_eviction_declines_clearly_on_a_filesystem_that_ignores_it(tiny_dataset, monkeypatch):
    monkeypatch.setattr(disks, "filesystem_type", lambda path: "tmpfs")
    with pytest.warns(
        RuntimeWarning, match="on tmpfs, which keeps files only in memory: nothing was evicted"
    ):
        assert evict_from_page_cache(tiny_dataset) is False


@pytest.mark.skipif(
    not os.path.exists("/proc/self/mounts"), reason="no mount table (macOS, Windows)"
)
def test_filesystem_type_comes_from_the_closest_mount_point(tmp_path):
    assert filesystem_type("/") and filesystem_type(tmp_path)
    if os.path.ismount("/dev/shm"):
        assert filesystem_type("/dev/shm") == "tmpfs"


def test_fs_overhead_counts_add_up(tiny_dataset):
    manifest = load_manifest(tiny_dataset)
    files = [path for path in tiny_dataset.rglob("*") if path.is_file()]
    overhead = fs_overhead(tiny_dataset)
    # the images and manifest.json
    assert overhead["files"] == len(files) == len(manifest["samples"]) + 1
    assert overhead["directories"] == len(manifest["classes"])
    assert overhead["inodes"] == overhead["files"] + overhead["directories"]
    assert overhead["apparent_bytes"] == sum(path.stat().st_size for path in files)
    assert overhead["mean_file_bytes"] == pytest.approx(
        overhead["apparent_bytes"] / overhead["files"]
    )
    assert overhead["block_size"] > 0
    # Files of a few KB fill whole blocks on ext4, xfs, overlay and tmpfs; compressing filesystems
    # may differ.
    assert overhead["allocated_bytes"] >= overhead["apparent_bytes"]
    assert 0 <= overhead["waste_fraction"] < 1


def test_fs_overhead_of_an_empty_folder(tmp_path):
    overhead = fs_overhead(tmp_path)
    assert (overhead["files"], overhead["apparent_bytes"], overhead["waste_fraction"]) == (
        0,
        0,
        0.0,
    )


def test_walk_and_listing_see_every_entry(tiny_dataset):
    assert sum(1 for _ in walk(tiny_dataset)) == sum(1 for _ in tiny_dataset.rglob("*"))
    assert time_listing(tiny_dataset) > 0
    assert time_stat(tiny_dataset) > 0


def test_reference_figures_are_labelled_as_not_measured():
    assert {storage.status for storage in REFERENCE_STORAGE} == {NOT_MEASURED}
    assert NOT_MEASURED == "published typical figure, not measured here"
    for storage in REFERENCE_STORAGE:
        assert storage.latency > 0 and storage.bandwidth > 0 and storage.source and storage.typical
    object_store = next(storage for storage in REFERENCE_STORAGE if "object store" in storage.name)
    assert object_store.usd_per_1000_requests == pytest.approx(0.0004)


def test_disk_latencies_are_a_whole_random_access():
    by_name = {storage.name: storage for storage in REFERENCE_STORAGE}
    half_a_turn = 0.5 * 60 / 7200
    # seek plus rotation
    assert by_name["HDD (7,200 rpm)"].latency == pytest.approx(0.008 + half_a_turn, rel=0.05)
    # NAND flash at queue depth 1, not Optane
    assert 0.05e-3 <= by_name["NVMe SSD"].latency <= 0.1e-3
