"""Auto-checks that exercise notebooks call right after the learner's code.

Each ``check_*`` runs the learner's work against a reference from ``packdata``, prints one line
starting with ✓ when it is right, and raises :class:`CheckFailed` with a specific, friendly message
when it is not.
"""

import time
from collections import Counter
from collections.abc import Mapping

from . import data


class CheckFailed(AssertionError):
    """The learner's answer is not right yet; the message says what to look at."""


def passed(message):
    print(f"✓ {message}")


def check_count_per_class(count_per_class, root):
    """Lesson 0: counting images per class by walking the folders must agree with the manifest."""
    manifest = data.load_manifest(root)
    expected = Counter(manifest["classes"][s["label"]] for s in manifest["samples"])
    got = count_per_class(root)
    if not isinstance(got, Mapping):
        raise CheckFailed(f"count_per_class should return a dict {{class name: count}}, not a {type(got).__name__}.")
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing or extra:
        raise CheckFailed(
            f"The class names differ from the folder names: missing {missing}, unexpected {extra}. "
            "Use each sub-folder's name as the class name and skip plain files such as manifest.json."
        )
    wrong = {name: (got[name], n) for name, n in expected.items() if got[name] != n}
    if wrong:
        name, (g, n) = next(iter(wrong.items()))
        raise CheckFailed(
            f"{len(wrong)} class(es) have the wrong count, e.g. '{name}': you counted {g}, the folder holds {n}. "
            "Count only the .jpg files inside each class folder."
        )
    passed(f"{len(expected)} classes, {sum(expected.values())} images: your counts match the manifest.")


def compare_with_reference(dataset, reference, source):
    """Raise ``CheckFailed`` unless ``dataset`` gives the same (image, label) pairs as ``reference``."""
    import torch

    if len(dataset) != len(reference):
        raise CheckFailed(f"len(dataset) is {len(dataset)}, but {source} holds {len(reference)} samples.")
    for index in sorted({0, len(reference) // 2, len(reference) - 1}):
        item = dataset[index]
        if not (isinstance(item, tuple) and len(item) == 2):
            raise CheckFailed(f"dataset[{index}] should be a tuple (image, label), got {type(item).__name__}.")
        (image, label), (expected_image, expected_label) = item, reference[index]
        if not isinstance(image, torch.Tensor):
            raise CheckFailed(f"dataset[{index}] image is a {type(image).__name__}: decode the bytes with decode_image "
                              "to get a uint8 tensor.")
        if image.shape != expected_image.shape or image.dtype != expected_image.dtype:
            raise CheckFailed(f"dataset[{index}] image has shape {tuple(image.shape)} and dtype {image.dtype}, "
                              f"expected {tuple(expected_image.shape)} and {expected_image.dtype} (channels first).")
        if label != expected_label:
            raise CheckFailed(f"dataset[{index}] has label {label}, {source} says {expected_label}: "
                              "take the label from the same manifest entry as the sample.")
        if not torch.equal(image, expected_image):
            raise CheckFailed(f"dataset[{index}] decodes to different pixels than {reference.paths[index]} of "
                              f"{source}: are you reading the right sample for this index?")


def check_folder_dataset(dataset, root):
    """Lesson 1: a folder dataset must give the same (image, label) pairs as ``packdata``'s FolderDataset."""
    from .datasets import FolderDataset

    compare_with_reference(dataset, FolderDataset(root), "the manifest")
    passed(f"{len(dataset)} samples; images and labels match the files and the manifest.")


def check_predict_epoch_seconds(predict_epoch_seconds):
    """Lesson 1: the cost model, requests × latency / workers + bytes / bandwidth, for one epoch."""
    from .costmodel import predict_time

    cases = [(10_000, 2_000, 0.002, 100e6, 1), (10_000, 2_000, 0.002, 100e6, 8), (500, 4e6, 0.05, 50e6, 4)]
    for n_files, mean_bytes, latency, bandwidth, workers in cases:
        got = predict_epoch_seconds(n_files, mean_bytes, latency, bandwidth, workers)
        expected = predict_time(n_files, n_files * mean_bytes, latency, bandwidth, concurrency=workers)
        if abs(got - expected) <= 1e-6 * expected:
            continue
        call = f"predict_epoch_seconds({n_files}, {mean_bytes:g}, {latency}, {bandwidth:g}, {workers})"
        waiting, transfer = n_files * latency, n_files * mean_bytes / bandwidth
        if abs(got - waiting / workers) <= 1e-6 * expected:
            hint = "you left out the transfer time, bytes / bandwidth."
        elif abs(got - (waiting + transfer)) <= 1e-6 * expected:
            hint = "workers wait for their requests at the same time: divide the latency term by the workers."
        else:
            hint = "time = requests × latency / workers + total bytes / bandwidth."
        raise CheckFailed(f"{call} returned {got:.4g} s, expected {expected:.4g} s: {hint}")
    passed("your prediction matches the cost model in every case.")


def check_workers_needed(workers_needed):
    """Lesson 1: the number of workers that reaches a target rate at a given latency."""
    from .costmodel import workers_needed as reference

    cases = [(1000, 0.005, 0.0002), (200, 0.002, 0.0), (3000, 0.01, 0.0003), (50, 0.001, 0.0)]
    for target, latency, seconds_per_sample in cases:
        got = workers_needed(target, latency, seconds_per_sample)
        expected = reference(target, latency, seconds_per_sample)
        if got == expected:
            continue
        call = f"workers_needed({target}, {latency}, {seconds_per_sample})"
        if not isinstance(got, int):
            hint = "a number of workers is a whole number: round up with math.ceil and return an int."
        elif got == expected - 1:
            hint = "round up, not down: one worker short misses the target."
        else:
            hint = "one worker delivers 1 / (latency + seconds_per_sample) samples per second."
        raise CheckFailed(f"{call} returned {got!r}, expected {expected}: {hint}")
    passed("right number of workers in every case.")


def check_pack_zip(pack_zip, root):
    """Lesson 2: ``pack_zip(root, archive)`` writes every JPEG uncompressed, with labels, deterministically."""
    import json
    import tempfile
    import zipfile
    from pathlib import Path

    manifest = data.load_manifest(root)
    with tempfile.TemporaryDirectory() as tmp:
        first, second = Path(tmp) / "first.zip", Path(tmp) / "second.zip"
        pack_zip(root, first)
        if not first.exists():
            raise CheckFailed(f"pack_zip(root, archive) did not write {first.name}: write to the archive path it is given.")
        with zipfile.ZipFile(first) as archive:
            infos = {info.filename: info for info in archive.infolist()}
            if "labels.json" not in infos:
                raise CheckFailed("The archive has no labels.json member: labels must travel inside the archive.")
            labels = json.loads(archive.read("labels.json"))
            for sample in manifest["samples"]:
                name = f"{sample['key']}.jpg"
                if name not in infos:
                    raise CheckFailed(f"Member {name} is missing: name each member <key>.jpg after the manifest's key.")
                if infos[name].compress_type != zipfile.ZIP_STORED:
                    raise CheckFailed(f"{name} is compressed: JPEG does not shrink, so store it (ZIP_STORED) and "
                                      "save the decompression time on every read.")
                if archive.read(name) != (Path(root) / sample["path"]).read_bytes():
                    raise CheckFailed(f"{name} differs from {sample['path']}: store the file's bytes unchanged.")
                if labels.get(sample["key"]) != sample["label"]:
                    raise CheckFailed(f"labels.json gives {labels.get(sample['key'])!r} for key {sample['key']}, "
                                      f"the manifest says {sample['label']}.")
        time.sleep(2.1)  # ZIP timestamps have 2-second resolution: let a clock-stamped archive show itself
        pack_zip(root, second)
        if first.read_bytes() != second.read_bytes():
            raise CheckFailed("Packing the same folder twice gave different archives. writestr(name, data) stamps "
                              "each member with the current time: pass a ZipInfo(name, date_time=...) with a fixed "
                              "date instead, and add members in sorted key order.")
    passed(f"{len(manifest['samples'])} samples stored uncompressed with their labels; the archive is reproducible.")


def check_zip_dataset(dataset, archive):
    """Lesson 2: a ZIP-backed dataset must give the same (image, label) pairs as ``packdata``'s ZipDataset."""
    from .datasets import ZipDataset

    compare_with_reference(dataset, ZipDataset(archive), "the archive")
    passed(f"{len(dataset)} samples read through the ZIP's central directory match the reference.")


def check_tar_index(tar_index, tar_path):
    """Lesson 2: ``tar_index(path)`` maps every member name to (data offset, size), read from the headers."""
    from . import tario

    with open(tar_path, "rb") as file:
        expected = {name: tuple(place) for name, place in tario.index_members(file, str(tar_path)).items()}
    got = tar_index(tar_path)
    if not isinstance(got, dict):
        raise CheckFailed(f"tar_index should return a dict {{name: (offset, size)}}, got {type(got).__name__}.")
    missing = [name for name in expected if name not in got]
    if missing:
        raise CheckFailed(f"{len(missing)} members are missing, e.g. {missing[0]!r}: keep walking header after header "
                          "until the first all-zero block.")
    for name, (offset, size) in expected.items():
        got_offset, got_size = got[name]
        if got_size != size:
            raise CheckFailed(f"{name!r}: size {got_size}, expected {size}. The size field (bytes 124-136) is an "
                              "octal number written as ASCII: int(field.strip(b'\\0 '), 8).")
        if got_offset == offset - 512:
            raise CheckFailed(f"{name!r}: offset {got_offset} is where its header starts; the data starts one "
                              "512-byte block later.")
        if got_offset != offset:
            raise CheckFailed(f"{name!r}: data offset {got_offset}, expected {offset}. After each member's data, "
                              "skip its padding up to the next multiple of 512.")
    passed(f"all {len(expected)} members indexed: any sample is now one seek and one read away.")
