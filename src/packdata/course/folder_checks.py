"""Checks of lessons 0 and 1: counting a folder of images, a ``Dataset`` over the folder, and the
cost model of reading one file per sample (an epoch's time, the workers it takes).
"""

import math
import numbers
from collections import Counter
from collections.abc import Mapping

from .. import imagefolder
from .feedback import (
    RELATIVE_TOLERANCE,
    CheckFailed,
    close_enough,
    is_number,
    mismatch,
    passed,
)


def check_count_per_class(count_per_class, root):
    """Lesson 0: counting images per class by walking the folders must agree with the manifest."""
    manifest = imagefolder.load_manifest(root)
    expected = Counter(manifest["classes"][s["label"]] for s in manifest["samples"])
    got = count_per_class(root)
    if not isinstance(got, Mapping):
        raise CheckFailed(
            f"count_per_class should return a dict {{class name: count}}, not a "
            f"{type(got).__name__}."
        )
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing or extra:
        raise CheckFailed(
            f"The class names differ from the folder names: missing {missing}, unexpected {extra}. "
            "Use each sub-folder's name as the class name and skip plain files such as "
            "manifest.json."
        )
    wrong = {name: (got[name], n) for name, n in expected.items() if got[name] != n}
    if wrong:
        name, (g, n) = next(iter(wrong.items()))
        if not isinstance(g, numbers.Integral):
            raise CheckFailed(
                f"'{name}': you counted {g!r}, a {type(g).__name__}; the folder holds {n}: "
                "return each count as an int."
            )
        raise CheckFailed(
            f"{len(wrong)} class(es) have the wrong count, e.g. '{name}': you counted {g}, the "
            f"folder holds {n}. "
            "Count only the .jpg files inside each class folder."
        )
    _check_counts_skip_stray_files(count_per_class)
    passed(
        f"{len(expected)} classes, {sum(expected.values())} images: your counts match the "
        "manifest; stray files are left out."
    )


def _check_counts_skip_stray_files(count_per_class):
    """A dataset as found on a share: a note beside the images, and a thumbnail cache."""
    import tempfile
    from pathlib import Path

    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        for name, images in {"cat": 3, "dog": 2}.items():
            (Path(tmp) / name).mkdir()
            for i in range(images):
                Image.new("RGB", (8, 8)).save(Path(tmp) / name / f"{name}_{i}.jpg")
        (Path(tmp) / "cat" / "notes.txt").write_text("collected 2026")
        (Path(tmp) / "dog" / "Thumbs.db").write_bytes(b"")
        (Path(tmp) / "manifest.json").write_text("{}")
        try:
            got = count_per_class(Path(tmp))
        except (ValueError, KeyError) as error:  # a manifest.json that is not the course's
            if "manifest.json" not in str(error) and error.args not in (("samples",), ("classes",)):
                raise
            raise CheckFailed(
                f"count_per_class read manifest.json ({error!r}): walk the class folders and "
                "count their images instead; a dataset found on a share has no manifest to trust."
            ) from None
    if dict(got) != {"cat": 3, "dog": 2}:
        raise CheckFailed(
            "In a folder with cat/ (3 JPEGs and notes.txt), dog/ (2 JPEGs and Thumbs.db) and "
            f"manifest.json, you counted {dict(got)}, not {{'cat': 3, 'dog': 2}}: count only the "
            ".jpg files of each class folder."
        )


def _label_mistake(label):
    """What is wrong with ``label`` as a class number, or ``None`` when it is an int (what the
    manifest holds, and what the DataLoader collates into an int64 tensor)."""
    import torch

    if isinstance(label, numbers.Integral) and not isinstance(label, bool):
        return None
    if not isinstance(label, torch.Tensor):
        kind, why = f"a {type(label).__name__}", "cross_entropy needs integer class numbers"
    elif label.is_floating_point():
        kind, why = f"a tensor of {label.dtype}", "cross_entropy needs integer class numbers"
    else:
        kind = f"a tensor of {label.dtype}"
        why = "the DataLoader collates a batch's ints into a tensor itself"
    return f"{kind}: return the manifest's label as it is, an int ({why})."


def _one_off(image, reference, index):
    """The index next to ``index`` (wrapping around, as ``samples[index - 1]`` does at 0) whose
    image in ``reference`` is ``image``, or ``None``."""
    import torch

    for other in ((index - 1) % len(reference), (index + 1) % len(reference)):
        if other != index and torch.equal(image, reference[other][0]):
            return other
    return None


def compare_with_reference(dataset, reference, source):
    """Raise ``CheckFailed`` unless ``dataset`` gives the same (image, label) pairs as
    ``reference``."""
    import torch

    if len(dataset) != len(reference):
        raise CheckFailed(
            f"len(dataset) is {len(dataset)}, but {source} holds {len(reference)} samples."
        )
    for index in sorted({0, len(reference) // 2, len(reference) - 1}):
        item = dataset[index]
        if not (isinstance(item, tuple) and len(item) == 2):
            raise CheckFailed(
                f"dataset[{index}] should be a tuple (image, label), got {type(item).__name__}."
            )
        (image, label), (expected_image, expected_label) = item, reference[index]
        if isinstance(label, torch.Tensor) and not isinstance(image, torch.Tensor):
            raise CheckFailed(
                f"dataset[{index}] is (label, image): return (image, label), the image first."
            )
        if not isinstance(image, torch.Tensor):
            raise CheckFailed(
                f"dataset[{index}] image is a {type(image).__name__}: decode the bytes with "
                "decode_image "
                "to get a uint8 tensor."
            )
        if image.shape != expected_image.shape or image.dtype != expected_image.dtype:
            raise CheckFailed(
                f"dataset[{index}] image has shape {tuple(image.shape)} and dtype {image.dtype}, "
                f"expected {tuple(expected_image.shape)} and {expected_image.dtype} (channels "
                "first)."
            )
        same_pixels = torch.equal(image, expected_image)
        other = None if same_pixels else _one_off(image, reference, index)
        if other is not None:
            raise CheckFailed(
                f"dataset[{index}] is sample {other} of {source}, one off: read the file and the "
                "label of the manifest entry at index itself, self.samples[index]."
            )
        mistake = _label_mistake(label)
        if mistake:
            raise CheckFailed(f"dataset[{index}] has label {label!r}, {mistake}")
        if label != expected_label:
            raise CheckFailed(
                f"dataset[{index}] has label {label!r}, {source} says {expected_label!r}: "
                "take the label from the same manifest entry as the sample."
            )
        if not same_pixels:
            raise CheckFailed(
                f"dataset[{index}] decodes to different pixels than {reference.paths[index]} of "
                f"{source}: are you reading the right sample for this index?"
            )


def check_folder_dataset(dataset, root):
    """Lesson 1: a folder dataset must give the same (image, label) pairs as ``packdata``'s
    FolderDataset."""
    from ..datasets import FolderDataset

    compare_with_reference(dataset, FolderDataset(root), "the manifest")
    passed(f"{len(dataset)} samples; images and labels match the files and the manifest.")


def check_predict_epoch_seconds(predict_epoch_seconds):
    """Lesson 1: the cost model for one epoch, with ``bandwidth`` capped per connection as the
    emulated store does: requests × latency / workers + bytes / (workers × bandwidth)."""
    from ..costmodel import predict_time

    cases = [
        (10_000, 2_000, 0.002, 100e6, 1),
        (10_000, 2_000, 0.002, 1e6, 8),
        (500, 4e6, 0.05, 50e6, 4),
    ]
    # (what a learner's formula that gives these numbers in every case left out, the formula)
    mistakes = [
        ("you left out the transfer time, bytes / bandwidth.", lambda n, m, lat, b, w: n * lat / w),
        (
            "the transfer is for every file: n_files × mean_bytes bytes in all.",
            lambda n, m, lat, b, w: (n * lat + m / b) / w,
        ),
        (
            "the store paces each connection on its own, so the workers' transfers run side by "
            "side too: divide the "
            "transfer term by the workers as well.",
            lambda n, m, lat, b, w: n * lat / w + n * m / b,
        ),
        (
            "workers wait for their requests at the same time: divide by the workers.",
            lambda n, m, lat, b, w: n * lat + n * m / b,
        ),
        (
            "the waiting overlaps across workers as the transfers do: divide the latency term "
            "by the workers too.",
            lambda n, m, lat, b, w: n * lat + n * m / (b * w),
        ),
        (
            "that is the right time in milliseconds: return seconds, as latency is given.",
            lambda n, m, lat, b, w: 1000 * (n * lat / w + n * m / (b * w)),
        ),
        (
            "latency is already in seconds (0.002 is 2 ms): use it as it is.",
            lambda n, m, lat, b, w: n * lat / 1000 / w + n * m / (b * w),
        ),
        (
            "that is one file's time: the epoch reads n_files of them.",
            lambda n, m, lat, b, w: (lat + m / b) / w,
        ),
        (
            "that is one file's time, as one worker waits for it: the epoch reads n_files of "
            "them, and the workers share them.",
            lambda n, m, lat, b, w: lat + m / b,
        ),
        (
            "the two costs add up: every request waits for its latency and then moves its bytes, "
            "so take their sum, not the larger.",
            lambda n, m, lat, b, w: max(n * lat / w, n * m / (b * w)),
        ),
        (
            "bandwidth is in bytes per second, as mean_bytes is in bytes: no factor of 8.",
            lambda n, m, lat, b, w: n * lat / w + 8 * n * m / (b * w),
        ),
    ]
    for n_files, mean_bytes, latency, bandwidth, workers in cases:
        got = predict_epoch_seconds(n_files, mean_bytes, latency, bandwidth, workers)
        expected = predict_time(
            n_files, n_files * mean_bytes, latency, workers * bandwidth, concurrency=workers
        )
        if close_enough(got, expected):
            continue
        call = (
            f"predict_epoch_seconds({n_files}, {mean_bytes:g}, {latency}, {bandwidth:g}, {workers})"
        )
        if not is_number(got):
            raise CheckFailed(
                f"{call} {mismatch(got, expected, 's')}: return the seconds, a number."
            )
        # the mistake whose formula gives the learner's numbers
        follows = [
            hint
            for hint, formula in mistakes
            if all(close_enough(predict_epoch_seconds(*c), formula(*c), 1e-9) for c in cases)
        ]
        hint = (
            follows
            or [
                "the epoch is two costs added: the waiting for the requests and the moving of the "
                "bytes. Check how many of each there are, and which of them the workers overlap."
            ]
        )[0]
        raise CheckFailed(f"{call} {mismatch(got, expected, 's', RELATIVE_TOLERANCE)}: {hint}")
    passed("your prediction matches the cost model in every case.")


def check_workers_needed(workers_needed):
    """Lesson 1: the number of workers that reaches a target rate at a given latency."""
    from ..costmodel import workers_needed as reference

    cases = [
        (1000, 0.005, 0.0002),
        (200, 0.002, 0.0),
        (3000, 0.01, 0.0003),
        (50, 0.001, 0.0),
        (500, 0.004, 0.0),
        (100, 0.001, 0.02),  # the work, not the waiting, decides
        (100, 0.0, 0.0),  # last (the rules below leave it out): nothing to wait for or do
    ]
    rules = [  # (hint, what a learner's function returns when it follows that mistake)
        (
            "round up, not down: a worker short misses the target.",
            lambda t, lat, s: max(1, math.floor(t * (lat + s))),
        ),
        (
            "include the work time, seconds_per_sample: a worker that decodes is not waiting "
            "for the next sample.",
            lambda t, lat, s: reference(t, lat, 0),
        ),
        (
            "the work time is paid for every sample, as the latency is: both belong inside the "
            "product with the target rate.",
            lambda t, lat, s: max(1, math.ceil(t * lat + s)),
        ),
    ]
    for target, latency, seconds_per_sample in cases:
        call = f"workers_needed({target}, {latency}, {seconds_per_sample})"
        try:
            got = workers_needed(target, latency, seconds_per_sample)
        except ZeroDivisionError:
            raise CheckFailed(
                f"{call} divided by zero: with no latency and no work, one worker takes no time "
                "per sample, and the docstring still asks for at least 1 worker."
            ) from None
        expected = reference(target, latency, seconds_per_sample)
        whole = isinstance(got, numbers.Integral) and not isinstance(got, bool)
        if got == expected and whole:
            continue
        if got == expected:
            raise CheckFailed(
                f"{call} returned {got!r}, a {type(got).__name__}: the number is right; return "
                "it as an int (math.ceil gives one)."
            )
        follows = [
            hint
            for hint, rule in rules
            if all(workers_needed(t, lat, s) == rule(t, lat, s) for t, lat, s in cases[:-1])
        ]
        if not whole:
            hint = (
                "a number of workers is a whole number: round up with math.ceil and return an int."
            )
        elif follows:
            hint = follows[0]
        elif got == 0:
            hint = (
                "the docstring asks for at least 1: with no latency and no work the formula "
                "gives 0 workers."
            )
        elif got == expected - 1:
            hint = "round up, not down: one worker short misses the target."
        elif got == expected + 1:
            hint = (
                "one worker too many: when target × (latency + seconds_per_sample) is already "
                "whole, math.ceil "
                "keeps it; int(x) + 1 does not."
            )
        else:
            hint = (
                "start from the rate of one worker: it waits, then works, for every sample it "
                "delivers."
            )
        raise CheckFailed(f"{call} {mismatch(got, expected)}: {hint}")
    passed("right number of workers in every case.")
