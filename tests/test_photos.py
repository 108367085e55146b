"""The ImageNet-sized photos: deterministic, a few hundred pixels a side in mixed aspect ratios,
JPEGs of about ImageNet's weight, every class present."""

from collections import Counter

import numpy as np
import pytest
from PIL import Image

from packdata import cli, photos, synthetic
from packdata.imagefolder import load_manifest, verify_dataset


@pytest.fixture(scope="module")
def photo_set(tmp_path_factory):
    return photos.make_photos(tmp_path_factory.mktemp("p") / "photos", size=40, progress=False)


def test_photos_have_imagenet_like_sizes_and_weights(photo_set):
    samples = load_manifest(photo_set)["samples"]
    sides = [Image.open(photo_set / s["path"]).size for s in samples]
    assert all(300 <= side <= 500 for size in sides for side in size)
    assert len({round(w / h, 1) for w, h in sides}) > 5  # mixed aspect ratios
    kilobytes = np.array([s["bytes"] for s in samples]) / 1e3
    assert 70 < kilobytes.mean() < 150
    assert Counter(s["label"] for s in samples) == dict.fromkeys(range(10), 4)
    assert verify_dataset(photo_set) == 40


def test_the_same_seed_gives_the_same_bytes_in_any_number_of_processes(
    photo_set, tmp_path, monkeypatch
):
    monkeypatch.setattr(photos, "PHOTOS_PER_WORKER", 10)  # a pool, where the fixture had none
    monkeypatch.setattr(synthetic.os, "cpu_count", lambda: 2)
    again = photos.make_photos(tmp_path / "again", size=40, progress=False)
    digests = [[s["sha256"] for s in load_manifest(root)["samples"]] for root in (photo_set, again)]
    assert digests[0] == digests[1]


def test_the_command_makes_them(tmp_path, capsys):
    assert cli.main(["make-data", "--photos", "--size", "10", "--root", str(tmp_path / "p")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "p")
    assert len(load_manifest(tmp_path / "p")["samples"]) == 10
