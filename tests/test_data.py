"""The synthetic dataset and the exporters: deterministic, ImageFolder-compatible, safe on bad
input."""

import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.datasets import FakeData, ImageFolder

from packdata import export, imagefolder, synthetic


def named(path):
    """A pattern for ``pytest.raises(match=...)`` that finds ``path`` in the message."""
    return re.escape(str(path))


def files_under(root):
    """Every file below ``root`` as {relative path: bytes}."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def image_bytes(root):
    """Like ``files_under``, without the manifest."""
    return {path: content for path, content in files_under(root).items() if path != "manifest.json"}


# --- determinism ----------------------------------------------------------------------------------


def test_same_seed_gives_identical_bytes(tiny_dataset, tmp_path):
    again = synthetic.make_dataset(tmp_path / "again", size=60, progress=False)
    assert imagefolder.manifest_digest(again) == imagefolder.manifest_digest(tiny_dataset)
    assert files_under(again) == files_under(tiny_dataset)


def test_worker_processes_do_not_change_the_bytes(tiny_dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(synthetic, "IMAGES_PER_WORKER", 20)
    monkeypatch.setattr(synthetic.os, "cpu_count", lambda: 2)
    parallel = synthetic.make_dataset(tmp_path / "parallel", size=60, progress=False)
    assert files_under(parallel) == files_under(tiny_dataset)


def test_another_seed_gives_other_images(tiny_dataset, tmp_path):
    other = synthetic.make_dataset(tmp_path / "other", size=60, seed=1, progress=False)
    assert imagefolder.manifest_digest(other) != imagefolder.manifest_digest(tiny_dataset)
    assert not set(image_bytes(other).values()) & set(image_bytes(tiny_dataset).values())


# --- layout and manifest --------------------------------------------------------------------------


def test_image_folder_reads_the_same_classes_and_labels_as_the_manifest(tiny_dataset):
    manifest = imagefolder.load_manifest(tiny_dataset)
    folder = ImageFolder(tiny_dataset)
    assert folder.classes == manifest["classes"] == list(synthetic.CLASSES)
    listed = [
        (str(tiny_dataset / sample["path"]), sample["label"]) for sample in manifest["samples"]
    ]
    assert folder.samples == listed
    image, _ = folder[0]
    assert (image.mode, image.size) == ("RGB", (64, 64))


def test_manifest_matches_the_files(tiny_dataset):
    manifest = imagefolder.load_manifest(tiny_dataset)
    samples = manifest["samples"]
    assert (manifest["seed"], manifest["size"], manifest["image_size"]) == (0, 60, 64)
    assert [sample["key"] for sample in samples] == [f"{index:06d}" for index in range(60)]
    assert sorted(sample["path"] for sample in samples) == sorted(image_bytes(tiny_dataset))
    for sample in samples:
        class_name, file_name = sample["path"].split("/")
        assert (class_name, file_name) == (
            synthetic.CLASSES[sample["label"]],
            sample["key"] + ".jpg",
        )
        assert (tiny_dataset / sample["path"]).stat().st_size == sample["bytes"]
        assert 500 < sample["bytes"] < 8_000
    assert Counter(sample["label"] for sample in samples) == dict.fromkeys(range(10), 6)
    assert imagefolder.verify_dataset(tiny_dataset) == 60


def test_manifest_text_is_stable(tiny_dataset):
    text = (tiny_dataset / "manifest.json").read_text()
    assert text == json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"


def test_uneven_sizes_are_balanced_and_sorted_by_class(tmp_path):
    root = synthetic.make_dataset(tmp_path / "odd", size="13", progress=False)
    labels = [sample["label"] for sample in imagefolder.load_manifest(root)["samples"]]
    assert labels == sorted(labels)
    assert Counter(labels) == {0: 2, 1: 2, 2: 2, **dict.fromkeys(range(3, 10), 1)}
    assert len(ImageFolder(root)) == 13


def test_second_call_returns_without_rewriting(tmp_path):
    root = synthetic.make_dataset(tmp_path / "ds", size=20, progress=False)
    before = (root / "manifest.json").stat()
    assert synthetic.make_dataset(root, size=20, progress=False) == root
    after = (root / "manifest.json").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_force_or_other_parameters_rebuild(tmp_path):
    root = synthetic.make_dataset(tmp_path / "ds", size=20, progress=False)
    inode = (root / "manifest.json").stat().st_ino
    synthetic.make_dataset(root, size=20, force=True, progress=False)
    assert (root / "manifest.json").stat().st_ino != inode
    synthetic.make_dataset(root, size=20, seed=3, progress=False)
    assert imagefolder.load_manifest(root)["seed"] == 3
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ds"]


def test_environment_variables_choose_size_and_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PACKDATA_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("PACKDATA_SIZE", "small")
    assert (synthetic.default_size(), imagefolder.data_dir()) == ("small", tmp_path)
    assert synthetic.default_root() == tmp_path / "synthetic-small"
    monkeypatch.setenv("PACKDATA_SIZE", "12")
    root = synthetic.make_dataset(progress=False)
    assert root == tmp_path / "synthetic-12"
    assert len(imagefolder.load_manifest(root)["samples"]) == 12


def test_defaults_without_environment_variables(monkeypatch):
    monkeypatch.delenv("PACKDATA_DATA_DIR", raising=False)
    monkeypatch.delenv("PACKDATA_SIZE", raising=False)
    repository_data = Path(imagefolder.__file__).resolve().parents[2] / "data"
    expected = repository_data if repository_data.is_dir() else Path.home() / ".cache" / "packdata"
    assert (synthetic.default_size(), imagefolder.data_dir()) == ("workshop", expected)
    assert synthetic.default_root("small") == expected / "synthetic-small"


def test_a_repository_data_folder_others_own_sends_each_user_home(monkeypatch, tmp_path):
    # a course installed for every user of a hub, in a root-owned folder: the tests run as root,
    # who may write anywhere, so the permission check answers as it would for a learner
    monkeypatch.delenv("PACKDATA_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(imagefolder, "may_write", lambda folder: False)
    assert imagefolder.data_dir() == tmp_path / ".cache" / "packdata"


def test_classes_are_told_apart_by_a_trivial_feature():
    """Nearest class mean on a shift-invariant spectrum beats chance (10 %) by far; no network
    needed."""

    def radial_spectrum(image):
        gray = image.mean(axis=2)
        power = np.abs(np.fft.fft2((gray - gray.mean()) / (gray.std() + 1e-6)))
        radius = np.hypot(*np.meshgrid(np.fft.fftfreq(64), np.fft.fftfreq(64))) * 64
        rings = np.minimum(radius.astype(int), 31).ravel()
        return np.log(
            np.bincount(rings, power.ravel(), 32) / np.bincount(rings, minlength=32) + 1e-3
        )

    labels = np.repeat(np.arange(10), 40)
    images = [
        synthetic.render_image(label, np.random.default_rng([1, index]))
        for index, label in enumerate(labels)
    ]
    features = np.array([radial_spectrum(image) for image in images])
    train = np.arange(len(labels)) % 2 == 0
    means = np.array([features[train & (labels == label)].mean(axis=0) for label in range(10)])
    scaled = (features[~train, None, :] - means) / features[train].std(axis=0)
    accuracy = ((scaled**2).sum(axis=2).argmin(axis=1) == labels[~train]).mean()
    assert accuracy > 0.3


# --- exporters ------------------------------------------------------------------------------------


def test_export_fake_data_round_trips(tmp_path):
    fake = FakeData(size=12, image_size=(3, 20, 24), num_classes=3)
    root = export.export_torchvision(fake, tmp_path / "fake", progress=False)
    manifest = imagefolder.load_manifest(root)
    assert manifest["classes"] == ["0", "1", "2"]
    assert [sample["key"] for sample in manifest["samples"]] == [
        f"{index:06d}" for index in range(12)
    ]
    folder = {Path(path).name: label for path, label in ImageFolder(root).samples}
    for index, sample in enumerate(manifest["samples"]):
        original, label = fake[index]
        assert sample["label"] == folder[sample["key"] + ".jpg"] == label
        exported = Image.open(root / sample["path"])
        assert (exported.format, exported.size) == ("JPEG", original.size)
    assert imagefolder.verify_dataset(root) == 12


def test_export_tensors_with_unsorted_class_names(tmp_path):
    generator = torch.Generator().manual_seed(0)
    samples = [
        (torch.randint(0, 256, (channels, 8, 10), dtype=torch.uint8, generator=generator), label)
        for channels, label in [(3, 0), (1, 1), (3, 1)]
    ]
    root = export.export_torchvision(
        samples, tmp_path / "tensors", classes=["zebra", "ant"], progress=False
    )
    folder = ImageFolder(root)
    assert folder.classes == imagefolder.load_manifest(root)["classes"] == ["0-zebra", "1-ant"]
    assert folder.targets == [0, 1, 1]
    assert folder[1][0].size == (10, 8)


def test_export_image_folder_keeps_jpegs_and_converts_the_rest(tmp_path):
    source = tmp_path / "source"
    (source / "cats").mkdir(parents=True)
    (source / "dogs").mkdir()
    Image.new("RGB", (30, 20), "orange").save(source / "cats" / "b.png")
    Image.new("RGB", (16, 16), "gray").save(source / "cats" / "a.jpg")
    Image.new("L", (12, 40), 200).save(source / "dogs" / "x.bmp")
    (source / "dogs" / "notes.txt").write_text("not an image")

    with pytest.warns(UserWarning) as said:
        root = export.export_image_folder(source, tmp_path / "exported", progress=False)
    warned = [str(warning.message) for warning in said]
    assert any("1 PNG re-encoded as JPEG, 1 L converted to RGB" in text for text in warned)
    assert any(
        "left out 1 file(s) that are no images PIL reads: dogs/notes.txt" in text for text in warned
    )
    samples = imagefolder.load_manifest(root)["samples"]
    expected = [("cats/000000.jpg", 0), ("cats/000001.jpg", 0), ("dogs/000002.jpg", 1)]
    assert [(s["path"], s["label"]) for s in samples] == expected
    assert (root / "cats" / "000000.jpg").read_bytes() == (source / "cats" / "a.jpg").read_bytes()
    assert [Image.open(root / s["path"]).size for s in samples] == [(16, 16), (30, 20), (12, 40)]
    assert ImageFolder(root).classes == ["cats", "dogs"]


def test_exporting_our_own_dataset_copies_it_exactly(tiny_dataset, tmp_path):
    root = export.export_image_folder(tiny_dataset, tmp_path / "copy", progress=False)
    assert image_bytes(root) == image_bytes(tiny_dataset)
    assert (
        imagefolder.load_manifest(root)["samples"]
        == imagefolder.load_manifest(tiny_dataset)["samples"]
    )


# --- bad input: a clear error and nothing left behind ---------------------------------------------


@pytest.mark.parametrize("size", [0, -5, 9, 2.5, True, "huge", "12.5", "", "-3"])
def test_nonsense_sizes_are_refused(tmp_path, size):
    with pytest.raises(ValueError, match="size"):
        synthetic.make_dataset(tmp_path / "ds", size=size, progress=False)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("options", [{"seed": -1}, {"seed": "0"}, {"image_size": 8}])
def test_nonsense_options_are_refused(tmp_path, options):
    with pytest.raises(ValueError):
        synthetic.make_dataset(tmp_path / "ds", size=10, progress=False, **options)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "write",
    [
        lambda target: synthetic.make_dataset(target, size=10, force=True, progress=False),
        lambda target: export.export_torchvision(
            FakeData(size=2, image_size=(3, 8, 8)), target, progress=False
        ),
    ],
    ids=["make_dataset", "export_torchvision"],
)
def test_a_folder_that_is_not_ours_is_never_replaced(tmp_path, write):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=named(target)):
        write(target)
    assert files_under(tmp_path) == {"mine/precious.txt": b"keep me"}


def test_a_file_is_not_a_dataset_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match=named(tmp_path / "file")):
        synthetic.make_dataset(tmp_path / "file", size=10, progress=False)
    with pytest.raises(OSError, match=named(tmp_path / "file")):
        synthetic.make_dataset(tmp_path / "file" / "ds", size=10, progress=False)
    assert files_under(tmp_path) == {"file": b"x"}


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0, reason="needs a user that permissions apply to"
)
def test_an_unwritable_folder_is_reported(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(PermissionError, match=named(locked / "ds")):
            synthetic.make_dataset(locked / "ds", size=10, progress=False)
        assert not any(locked.iterdir())
    finally:
        locked.chmod(0o700)


def test_an_interrupted_build_leaves_the_old_dataset_alone(tmp_path, monkeypatch):
    root = synthetic.make_dataset(tmp_path / "ds", size=20, progress=False)
    digest = imagefolder.manifest_digest(root)

    def interrupted(label, rng, image_size):
        raise KeyboardInterrupt

    monkeypatch.setattr(synthetic, "render_image", interrupted)
    with pytest.raises(KeyboardInterrupt):
        synthetic.make_dataset(root, size=20, seed=1, progress=False)
    with pytest.raises(KeyboardInterrupt):
        synthetic.make_dataset(tmp_path / "new", size=20, progress=False)
    assert imagefolder.manifest_digest(root) == digest
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ds"]


def test_bad_export_sources_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=named(tmp_path / "missing")):
        export.export_image_folder(tmp_path / "missing", tmp_path / "out", progress=False)
    (tmp_path / "empty" / "cats").mkdir(parents=True)
    with pytest.raises(ValueError, match=named(tmp_path / "empty")):
        export.export_image_folder(tmp_path / "empty", tmp_path / "out", progress=False)
    broken = tmp_path / "broken" / "cats" / "broken.png"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not a png")
    with pytest.raises(ValueError, match=named(broken)):
        export.export_image_folder(tmp_path / "broken", tmp_path / "out", progress=False)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["broken", "empty"]


@pytest.mark.parametrize(
    "sample, message",
    [
        ((torch.zeros(3, 8, 8), 0), "uint8"),
        ((torch.zeros(3, 8, 8, dtype=torch.uint8), 5), "label 5"),
        ((torch.zeros(3, 8, 8, dtype=torch.uint8), 0.5), "label 0.5"),
    ],
)
def test_bad_torchvision_samples_are_refused(tmp_path, sample, message):
    good = (torch.zeros(3, 8, 8, dtype=torch.uint8), 1)
    with pytest.raises(ValueError, match=message):
        export.export_torchvision(
            [good, sample], tmp_path / "out", classes=["a", "b"], progress=False
        )
    assert not any(tmp_path.iterdir())


def test_missing_foreign_or_damaged_datasets_are_named(tiny_dataset, tmp_path):
    with pytest.raises(FileNotFoundError, match=named(tmp_path)):
        imagefolder.load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not a packdata-imagefolder document"):
        imagefolder.manifest_digest(tmp_path)

    copy = Path(shutil.copytree(tiny_dataset, tmp_path / "copy"))
    first, second = [
        copy / sample["path"] for sample in imagefolder.load_manifest(copy)["samples"][:2]
    ]
    first.write_bytes(first.read_bytes() + b"\0")
    second.unlink()
    with pytest.raises(ValueError, match=named(first)):
        imagefolder.verify_dataset(copy)
    shutil.copy(tiny_dataset / first.relative_to(copy), first)
    with pytest.raises(FileNotFoundError, match=named(second)):
        imagefolder.verify_dataset(copy)
