"""Auto-checks that exercise notebooks call right after the learner's code.

Each ``check_*`` runs the learner's work against a reference from ``packdata``, prints one line
starting with ✓ when it is right, and raises :class:`CheckFailed` with a specific, friendly message
when it is not.
"""

import math
import numbers
import re
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from .. import imagefolder


class CheckFailed(AssertionError):
    """The learner's answer is not right yet; the message says what to look at."""


def passed(message):
    print(f"✓ {message}")


# relative tolerance of the checks whose answer is a real number (float rounding, nothing more)
RELATIVE_TOLERANCE = 1e-6
# what pickle says of an open file or a lock: "cannot pickle '_io.BufferedReader' object" up to
# Python 3.11, "cannot pickle 'BufferedReader' instances" from 3.12; "'_thread.RLock' object";
# and of the other handles a dataset may hold: a memory map, a socket, a per-thread store, SQLite
UNPICKLABLE_HANDLE = re.compile(
    r"cannot pickle '(_io\.|_thread\.|mmap\.|sqlite3\.)?"
    r"(Buffered\w+|TextIOWrapper|FileIO|\w*lock|mmap|socket|_local|Connection|Cursor)'",
    re.IGNORECASE,
)


def _significant(value, digits):
    """``value`` with ``digits`` significant digits, in plain notation where that stays short."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    magnitude = math.floor(math.log10(abs(value)))
    if not -6 <= magnitude < 15:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{max(0, digits - 1 - magnitude)}f}"


def _percent(fraction):
    """A positive fraction as a percentage with two significant digits: 0.003 -> '0.3%'."""
    percent = abs(fraction) * 100
    if percent >= 10 or percent == 0:
        return f"{percent:.0f}%"
    decimals = max(0, 1 - math.floor(math.log10(percent)))
    return f"{percent:.{decimals}f}".rstrip("0").rstrip(".") + "%"


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def close_enough(got, expected, tolerance=RELATIVE_TOLERANCE):
    """Whether ``got`` is ``expected`` within a relative ``tolerance``."""
    return _is_number(got) and abs(got - expected) <= tolerance * abs(expected)


def mismatch(got, expected, unit="", tolerance=0):
    """'returned 20.24 s, expected 20.19 s (0.3% off; the check allows 0.0001%)': both numbers with
    as many digits as it takes for them to differ on screen, and how far apart they are."""
    suffix = f" {unit}" if unit else ""
    if not _is_number(got):
        return f"returned {got!r:.80}, expected {expected:g}{suffix}"
    if isinstance(got, numbers.Integral) and isinstance(expected, numbers.Integral):
        shown = str(got), str(expected)
    else:
        shown = next(
            (
                (_significant(got, digits), _significant(expected, digits))
                for digits in range(4, 18)
                if _significant(got, digits) != _significant(expected, digits)
            ),
            (repr(float(got)), repr(float(expected))),
        )
    allows = f"the check allows {_percent(tolerance)}" if tolerance else "the check wants it exact"
    off = f"{_percent((got - expected) / expected)} off" if expected else "expected zero"
    return f"returned {shown[0]}{suffix}, expected {shown[1]}{suffix} ({off}; {allows})"


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
        if label != expected_label:
            kind = (
                f" (a {type(label).__name__}, not an {type(expected_label).__name__})"
                if str(label) == str(expected_label)
                else ""
            )
            raise CheckFailed(
                f"dataset[{index}] has label {label!r}{kind}, {source} says {expected_label!r}: "
                "take the label from the same manifest entry as the sample, as an int."
            )
        if not torch.equal(image, expected_image):
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
        if not _is_number(got):
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


def _labels_of(text):
    """The ``{key: label}`` dict of an archive's labels.json, or ``CheckFailed`` saying what it
    holds instead."""
    import json

    try:
        labels = json.loads(text)
    except ValueError as error:
        raise CheckFailed(
            f"labels.json is not JSON ({error}): write json.dumps(labels) into it."
        ) from None
    if not isinstance(labels, dict):
        raise CheckFailed(
            f"labels.json holds a {type(labels).__name__}: write a dict {{key: label}}, so that "
            "a reader finds a sample's label by its key."
        )
    return labels


def check_pack_zip(pack_zip, root):
    """Lesson 2: ``pack_zip(root, archive)`` writes every JPEG uncompressed, with labels,
    deterministically."""
    import shutil
    import tempfile
    import zipfile
    from pathlib import Path

    manifest = imagefolder.load_manifest(root)
    with tempfile.TemporaryDirectory() as tmp:
        first, second = Path(tmp) / "first.zip", Path(tmp) / "second.zip"
        pack_zip(root, first)
        if not first.exists():
            raise CheckFailed(
                f"pack_zip(root, archive) did not write {first.name}: write to the archive path it "
                "is given."
            )
        if not zipfile.is_zipfile(first):
            raise CheckFailed(
                f"pack_zip wrote {first.name}, but it is not a ZIP archive: write it with "
                "zipfile.ZipFile(archive, 'w')."
            )
        with zipfile.ZipFile(first) as archive:
            infos = {info.filename: info for info in archive.infolist()}
            if "labels.json" not in infos:
                raise CheckFailed(
                    "The archive has no labels.json member: labels must travel inside the archive."
                )
            labels = _labels_of(archive.read("labels.json"))
            for sample in manifest["samples"]:
                name = f"{sample['key']}.jpg"
                if name not in infos:
                    raise CheckFailed(
                        f"Member {name} is missing: name each member <key>.jpg after the "
                        "manifest's key."
                    )
                if infos[name].compress_type != zipfile.ZIP_STORED:
                    raise CheckFailed(
                        f"{name} is compressed: JPEG does not shrink, so store it (ZIP_STORED) and "
                        "save the decompression time on every read."
                    )
                if archive.read(name) != (Path(root) / sample["path"]).read_bytes():
                    raise CheckFailed(
                        f"{name} differs from {sample['path']}: store the file's bytes unchanged."
                    )
                if sample["key"] not in labels:
                    some = next(iter(labels), None)
                    raise CheckFailed(
                        f"labels.json has no key {sample['key']!r} (its keys look like {some!r}): "
                        "key each label by the sample's key, as the manifest does."
                    )
                label = labels[sample["key"]]
                same_number = label == sample["label"] or str(label) == str(sample["label"])
                if same_number and (not isinstance(label, int) or isinstance(label, bool)):
                    raise CheckFailed(
                        f"labels.json gives {label!r} for key {sample['key']}, a "
                        f"{type(label).__name__}: a class number is an int, which a loss such as "
                        "cross_entropy needs. Store the manifest's label as it is."
                    )
                if label != sample["label"]:
                    raise CheckFailed(
                        f"labels.json gives {label!r} for key {sample['key']}, the manifest says "
                        f"{sample['label']}."
                    )
            order = [name for name in infos if name.endswith(".jpg")]
            if order != [f"{sample['key']}.jpg" for sample in manifest["samples"]]:
                raise CheckFailed(
                    "The members come in another order than the manifest's samples: add them in "
                    "the manifest's order. An order of your own (a set, say) can change from one "
                    "run to the next, as Python draws str hashes anew in every process."
                )
        # a copy of the folder: the same files with new modification times, as after cp or a
        # regeneration; and ZIP timestamps have 2-second resolution: let a clock stamp show
        time.sleep(2.1)
        copy = Path(tmp) / "copy"
        shutil.copytree(root, copy, copy_function=shutil.copyfile)
        pack_zip(copy, second)
        if first.read_bytes() != second.read_bytes():
            raise CheckFailed(
                "Packing the same files twice (the second time from a copy, whose files have new "
                "modification times) gave different archives. writestr(name, data) stamps each "
                "member with the current time, and write(path) with the file's: pass a "
                "ZipInfo(name, date_time=...) with a fixed date instead."
            )
    passed(
        f"{len(manifest['samples'])} samples stored uncompressed with their labels; the archive is "
        "reproducible."
    )


def check_zip_dataset(dataset, archive):
    """Lesson 2: a ZIP-backed dataset must give the same (image, label) pairs as ``packdata``'s
    ZipDataset."""
    from ..datasets import ZipDataset

    opened = _zip_opens(dataset, 3)
    if opened:
        raise CheckFailed(
            f"after a first sample, reading 3 more opened the ZIP {opened} more time(s): every "
            "opening reads the whole central directory again, an entry for every member, so each "
            "sample would cost a read of the whole directory. Open it once (self.zip_file, from "
            "__init__) and ask it for each member."
        )
    compare_with_reference(dataset, ZipDataset(archive), "the archive")
    passed(f"{len(dataset)} samples read through the ZIP's central directory match the reference.")


def _zip_opens(dataset, count):
    """How many ``zipfile.ZipFile`` objects reading ``count`` samples of ``dataset`` makes, after
    a first one (which may open the archive lazily, once)."""
    import zipfile
    from unittest import mock

    dataset[0]
    make = zipfile.ZipFile.__init__
    with mock.patch.object(zipfile.ZipFile, "__init__", autospec=True, side_effect=make) as init:
        for index in range(1, min(count + 1, len(dataset))):
            dataset[index]
    return init.call_count


# how a tar walk goes from a member's data to the next header
PADDING_RULE = (
    "after each member's data, skip to the next multiple of 512, 512 × ceil(size / 512) bytes "
    "(none after a member of 0 or 512 bytes)"
)


def check_tar_index(tar_index, tar_path):
    """Lesson 2: ``tar_index(path)`` maps every member name to (data offset, size), read from the
    headers."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:  # members of sizes at the padding's edges
        _check_tar_index_on(
            tar_index, _padding_tar(folder), "a small tar of 0, 1, 512 and 1,000-byte members"
        )
    expected = _check_tar_index_on(tar_index, tar_path, tar_path)
    passed(f"all {len(expected)} members indexed: any sample is now one seek and one read away.")


def _padding_tar(folder):
    """A tar whose members are 0, 1, 512 and 1,000 bytes long: where padding goes wrong."""
    from pathlib import Path

    from ..shardwrite import write_tar

    sizes = {"empty": 0, "one": 1, "block": 512, "thousand": 1000}
    # not zeros: a header read inside the data must not look like the end of the archive
    members = [(name, {"bin": b"x" * size}) for name, size in sizes.items()]
    return write_tar(Path(folder) / "padding.tar", members).path


def _check_tar_index_on(tar_index, tar_path, what):
    """``tar_index(tar_path)`` against the reference, in words naming ``what``; the reference's
    index."""
    from .. import tarindex

    with open(tar_path, "rb") as file:
        expected = {
            name: tuple(place)
            for name, place in tarindex.index_members(file, str(tar_path)).items()
        }
    try:
        got = tar_index(tar_path)
    except ValueError as error:
        if "\\x00" in str(error):  # int(b"00000000012\0", 8): the field's NUL kept
            raise CheckFailed(
                f"on {what}, tar_index raised ValueError: {error}. The size field ends in a NUL "
                "(or a space): strip b'\\0 ' before int(field, 8)."
            ) from None
        raise CheckFailed(
            f"on {what}, tar_index raised ValueError: {error}. Past the first header, that means "
            f"it read a header where there is data or padding: {PADDING_RULE}."
        ) from None
    if not isinstance(got, dict):
        raise CheckFailed(
            f"tar_index should return a dict {{name: (offset, size)}}, got {type(got).__name__}."
        )
    if any(isinstance(name, bytes) for name in got):
        raise CheckFailed(
            "The member names are bytes: decode them to str, e.g. "
            "block[:100].rstrip(b'\\0').decode()."
        )
    padded = [name for name in got if isinstance(name, str) and "\0" in name]
    if padded:
        name = padded[0].rstrip("\0")
        raise CheckFailed(
            f"Member name {name!r} is followed by {len(padded[0]) - len(name)} NUL characters: "
            "strip the "
            "NUL padding from the name field, e.g. block[:100].rstrip(b'\\0').decode()."
        )
    missing = [name for name in expected if name not in got]
    if missing:
        raise CheckFailed(
            f"on {what}, {len(missing)} members are missing, e.g. {missing[0]!r}: keep walking "
            "header after header until the first all-zero block."
        )
    for name, (offset, size) in expected.items():
        got_offset, got_size = got[name]
        if (got_size, got_offset) == (offset, size):
            raise CheckFailed(
                f"{name!r}: ({got_offset}, {got_size}) is (size, offset): return (data offset, "
                "size), in that order."
            )
        if got_size != size:
            raise CheckFailed(
                f"{name!r}: size {got_size}, expected {size}. The size field (bytes 124-136) is an "
                "octal number written as ASCII: int(field.strip(b'\\0 '), 8)."
            )
        if got_offset == offset - 512:
            raise CheckFailed(
                f"{name!r}: offset {got_offset} is where its header starts; the data starts one "
                "512-byte block later."
            )
        if got_offset != offset:
            raise CheckFailed(
                f"on {what}, {name!r}: data offset {got_offset}, expected {offset}: {PADDING_RULE}."
            )
    return expected


def check_samples_per_shard(samples_per_shard):
    """Lesson 6: samples per shard so that each GET reaches ``efficiency`` of the bandwidth, by the
    cost model."""
    from ..costmodel import size_for_efficiency

    cases = [
        (0.002, 100e6, 2_100, 0.9),
        (0.02, 100e6, 2_100, 0.9),
        (0.05, 1e9, 110_000, 0.95),
        (1e-4, 500e6, 2_100, 0.5),
        (0.01, 100e6, 1_000, 0.5),  # exactly 1,000 samples: nothing to round
    ]
    for latency, bandwidth, mean_bytes, efficiency in cases:
        expected = math.ceil(size_for_efficiency(latency, bandwidth, efficiency) / mean_bytes)
        got = samples_per_shard(latency, bandwidth, mean_bytes, efficiency)
        call = f"samples_per_shard({latency}, {bandwidth:g}, {mean_bytes}, {efficiency})"
        if isinstance(got, float) and got == expected:
            raise CheckFailed(
                f"{call} returned {got!r}, a float: return an int (math.ceil gives one; np.ceil "
                "gives "
                "a float)."
            )
        if not isinstance(got, numbers.Integral) or isinstance(got, bool):
            raise CheckFailed(
                f"{call} {mismatch(got, expected)}: a number of samples is a whole number (round "
                "up)."
            )
        if got == expected - 1:
            raise CheckFailed(
                f"{call} {mismatch(got, expected)}: one too few. Round up, or the shard falls "
                f"short of {efficiency:.0%}."
            )
        if got == expected + 1:
            raise CheckFailed(
                f"{call} {mismatch(got, expected)}: one too many. When the size is already a "
                "whole number of samples, math.ceil keeps it; int(x) + 1 does not."
            )
        size = size_for_efficiency(latency, bandwidth, efficiency)
        if got != expected and abs(got - size) <= 1:
            raise CheckFailed(
                f"{call} {mismatch(got, expected)}: that is the shard's size in bytes. Divide it "
                "by the bytes of a sample (mean_bytes), then round up."
            )
        slips = [
            math.ceil(size_for_efficiency(latency * f, bandwidth, efficiency) / mean_bytes)
            for f in (1e-3, 1e3)  # the latency taken for milliseconds, or made into them
        ]
        if got != expected and got in slips:
            raise CheckFailed(
                f"{call} {mismatch(got, expected)}: about 1,000 times off. The latency comes in "
                "seconds and the bandwidth in bytes per second: use them as they are."
            )
        if got != expected:
            raise CheckFailed(
                f"{call} {mismatch(got, expected)}. Solve size / (size + latency × bandwidth) = "
                "efficiency for the size in bytes, then divide by the bytes per sample."
            )
    passed(
        "right shard size for every latency and bandwidth: the slower the round trip, the bigger "
        "the shard."
    )


def _stage_or_stream(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch_bytes, dataset_bytes):
    """The reference: stage when the data fits on scratch and the copy plus every epoch from the
    disk takes less time than every epoch over the network."""
    if dataset_bytes > scratch_bytes:
        return "stream"
    return "stage" if copy_s + epochs * local_epoch_s < epochs * remote_epoch_s else "stream"


def check_stage_or_stream(stage_or_stream):
    """Lesson 6: ``stage_or_stream(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch_bytes,
    dataset_bytes)`` says "stage" when the data fits on scratch and copying once, then reading
    locally, beats reading remotely every epoch; else "stream"."""
    gb = 1e9
    # (copy_s, remote_epoch_s, local_epoch_s, epochs, scratch_bytes, dataset_bytes)
    cases = [
        (60, 30, 10, 5, 1000 * gb, 100 * gb),  # 110 s against 150 s: stage
        (60, 30, 10, 2, 1000 * gb, 100 * gb),  # 80 s against 60 s: stream
        (60, 30, 10, 5, 50 * gb, 100 * gb),  # staging would pay, but it does not fit
        (60, 30, 10, 1, 1000 * gb, 100 * gb),  # one epoch: the copy is pure cost
        (100, 30, 10, 10, 1000 * gb, 100 * gb),  # pays back only over several epochs
        (20, 12, 11, 50, 2000 * gb, 1500 * gb),  # a small saving, many epochs, a big dataset
        (30, 10, 12, 100, 1000 * gb, 1 * gb),  # the remote store is faster than the disk
        (60, 30, 10, 3, 1000 * gb, 100 * gb),  # 90 s each way: a tie streams
        (65, 30, 10, 3, 1000 * gb, 100 * gb),  # 95 s against 90 s: the copy is no epoch
        (60, 30, 10, 5, 100 * gb, 100 * gb),  # the dataset fills scratch exactly: it fits
    ]
    # (what a learner whose answers follow this rule in every case got wrong, the rule)
    mistakes = [
        (
            "you return 'stage' where streaming is quicker, and the other way round.",
            lambda *case: {"stage": "stream", "stream": "stage"}[_stage_or_stream(*case)],
        ),
        (
            "staging needs room: when the dataset is bigger than the scratch disk there is "
            "nothing to decide, however much time staging would save.",
            lambda c, r, loc, e, scratch, size: _stage_or_stream(c, r, loc, e, size, size),
        ),
        (
            "you left out the copy: reading from the disk saves time in every epoch, but only "
            "after the copy has been paid for.",
            lambda c, r, loc, e, scratch, size: _stage_or_stream(0, r, loc, e, scratch, size),
        ),
        (
            "the copy is paid once, and the saving comes in every epoch: compare the whole job, "
            "all of its epochs, not one epoch.",
            lambda c, r, loc, e, scratch, size: _stage_or_stream(c, r, loc, 1, scratch, size),
        ),
        (
            "the copy does not stand in for an epoch: the job copies first, then reads every "
            "one of its epochs from the disk (an epoch trained during the copy would read "
            "remotely: that is streaming). Compare copy + epochs × local against epochs × remote.",
            lambda c, r, loc, e, scratch, size: _stage_or_stream(c - loc, r, loc, e, scratch, size),
        ),
        (
            "on a tie, stream: staging then gains nothing, and streaming starts at once.",
            lambda c, r, loc, e, scratch, size: _stage_or_stream(
                c, r + 1e-9, loc, e, scratch, size
            ),
        ),
        (
            "a dataset exactly as big as the free space still fits: stream only when it is bigger.",
            lambda c, r, loc, e, scratch, size: _stage_or_stream(c, r, loc, e, scratch - 1, size),
        ),
        (
            "when the disk is slower than the network (local_epoch_s > remote_epoch_s), staging "
            "never pays back: a break-even of copy_s / (remote_epoch_s - local_epoch_s) epochs "
            "is then negative, and every number of epochs passes it.",
            lambda c, r, loc, e, scratch, size: (
                "stage" if size <= scratch and r != loc and e > c / (r - loc) else "stream"
            ),
        ),
        (
            "fitting on scratch is not enough: staging must also save time, and it does not "
            "when there are few epochs, or when the disk is no faster than the network.",
            lambda c, r, loc, e, scratch, size: "stage" if size <= scratch else "stream",
        ),
    ]
    for case in cases:
        got, expected = stage_or_stream(*case), _stage_or_stream(*case)
        if got == expected:
            continue
        copy_s, remote_s, local_s, epochs, scratch, size = case
        call = (
            f"stage_or_stream({copy_s}, {remote_s}, {local_s}, {epochs}, {scratch / gb:g}e9, "
            f"{size / gb:g}e9)"
        )
        if got not in ("stage", "stream"):
            raise CheckFailed(
                f"{call} returned {got!r}: return the string 'stage' or the string 'stream'."
            )
        follows = [
            hint
            for hint, rule in mistakes
            if all(stage_or_stream(*other) == rule(*other) for other in cases)
        ]
        staged, streamed = copy_s + epochs * local_s, epochs * remote_s
        fits = "fits on" if size <= scratch else "does not fit on"
        hint = (
            follows
            or [
                f"here staging takes {staged:g} s for the whole job, streaming {streamed:g} s, "
                f"and the {size / gb:g} GB dataset {fits} {scratch / gb:g} GB of scratch."
            ]
        )[0]
        raise CheckFailed(f"{call} returned {got!r}, expected {expected!r}: {hint}")
    passed(
        "stage only when the data fits and the copy pays for itself within the job's epochs; "
        "stream otherwise."
    )


def _common_full_steps(samples_per_worker, batch_size):
    """The reference: each worker's full batches, added up per rank; the fewest over the ranks."""
    return min(sum(n // batch_size for n in rank) for rank in samples_per_worker)


def _whole(value):
    """Whether ``value`` is a whole number: an int, or a NumPy integer (not a bool)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_common_full_steps(common_full_steps):
    """Lesson 6: ``common_full_steps(samples_per_worker, batch_size)``, where
    ``samples_per_worker[rank][worker]`` is what each DataLoader worker of each rank streams, is
    the number of full batches (``drop_last=True``) that every rank can run."""
    cases = [
        ([[100, 100], [100, 90]], 32),
        ([[50, 50], [60, 60]], 32),
        ([[70, 70], [64, 64], [80, 40]], 16),
        ([[33, 31]], 16),
        ([[12, 12, 12, 12], [16, 16, 8, 8]], 8),
        ([[40, 40], [24, 24]], 8),
    ]

    def full(n, batch_size):
        return n // batch_size

    def short_too(n, batch_size):
        return -(-n // batch_size)

    # (what a learner whose answers follow this rule in every case got wrong, the rule)
    mistakes = [
        (
            "you took the most full batches of any rank: the ranks with fewer run out first, and "
            "the others then wait for them in the next gradient all-reduce. Take the fewest.",
            lambda ranks, b: max(sum(full(n, b) for n in rank) for rank in ranks),
        ),
        (
            "that is rank 0's own count: every rank must stop after the same number of steps, "
            "the number the rank with the fewest full batches can run.",
            lambda ranks, b: sum(full(n, b) for n in ranks[0]),
        ),
        (
            "you pooled each rank's samples into its batches (samples // batch_size per rank). "
            "But each DataLoader worker batches its own samples, and drop_last=True drops each "
            "worker's short last batch: count the full batches worker by worker.",
            lambda ranks, b: min(full(sum(rank), b) for rank in ranks),
        ),
        (
            "you counted each worker's short last batch: drop_last=True drops it. Round down.",
            lambda ranks, b: min(sum(short_too(n, b) for n in rank) for rank in ranks),
        ),
        (
            "you shared all the samples out among the ranks; but a rank can only run the batches "
            "its own workers deliver. Count per rank, then take the fewest.",
            lambda ranks, b: full(sum(map(sum, ranks)), b * len(ranks)),
        ),
        (
            "you added up the steps of every rank; but the ranks step together, each through its "
            "own batches. Take the fewest that any rank can run.",
            lambda ranks, b: sum(sum(full(n, b) for n in rank) for rank in ranks),
        ),
        (
            "round() counts a short last batch when it is at least half full; drop_last=True "
            "drops every short batch. Divide with //.",
            lambda ranks, b: min(sum(round(n / b) for n in rank) for rank in ranks),
        ),
        (
            "one step fewer than every rank can run: the last full batch of the shortest rank "
            "counts too.",
            lambda ranks, b: _common_full_steps(ranks, b) - 1,
        ),
    ]
    for samples_per_worker, batch_size in cases:
        got = common_full_steps([list(rank) for rank in samples_per_worker], batch_size)
        expected = _common_full_steps(samples_per_worker, batch_size)
        if got == expected and _whole(got):
            continue
        call = f"common_full_steps({samples_per_worker}, {batch_size})"
        if got == expected:
            raise CheckFailed(
                f"{call} returned {got!r}, a {type(got).__name__}: a number of steps is a whole "
                "number, an int (// divides to one)."
            )
        follows = [
            hint
            for hint, rule in mistakes
            if all(
                common_full_steps([list(r) for r in ranks], b) == rule(ranks, b)
                for ranks, b in cases
            )
        ]
        hint = (
            follows
            or [
                "count the full batches each worker delivers, add them up per rank, and every "
                "rank can run as many steps as the rank with the fewest."
            ]
        )[0]
        raise CheckFailed(f"{call} {mismatch(got, expected)}: {hint}")
    passed(
        "full batches counted worker by worker, and every rank stops after as many steps as the "
        "rank with the fewest: no rank waits for another in the all-reduce."
    )


# --- lesson 6: shards in an S3 bucket -------------------------------------------------------------

LISTING_BUCKET, LISTING_SHARDS = "check-listing", 1_024


def _client_error():
    from botocore.exceptions import ClientError

    return ClientError


def _listing_bucket(client):
    """Make the bucket ``check-listing`` once per server: 1,024 empty shards under ``train/``, more
    than one listing call returns, beside a ``train/manifest.json`` and a ``val/`` shard. A last
    object, ``complete``, marks it done."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        client.head_object(Bucket=LISTING_BUCKET, Key="complete")
        return
    except _client_error():
        pass
    try:
        client.create_bucket(Bucket=LISTING_BUCKET)
    except _client_error() as error:
        if error.response["Error"]["Code"] not in (
            "BucketAlreadyOwnedByYou",
            "BucketAlreadyExists",
        ):
            raise
    keys = [f"train/train-{index:06d}.tar" for index in range(LISTING_SHARDS)]
    keys += ["train/manifest.json", "val/val-000000.tar"]
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(lambda key: client.put_object(Bucket=LISTING_BUCKET, Key=key, Body=b""), keys)
        )
    client.put_object(Bucket=LISTING_BUCKET, Key="complete", Body=b"")


def _listed_shards(client, bucket, prefix):
    """The keys ending in ``.tar`` under ``prefix``, all pages of the listing, in key order."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [
        item["Key"]
        for page in pages
        for item in page.get("Contents", [])
        if item["Key"].endswith(".tar")
    ]


def _key_of(url, bucket, call):
    """The object key a URL addresses (path style or virtual-host style); ``CheckFailed`` for
    anything a loader cannot GET."""
    import urllib.parse

    if not isinstance(url, str):
        raise CheckFailed(f"{call} returned a {type(url).__name__} among the URLs: return strings.")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise CheckFailed(
            f"{call} returned {url!r}: a loader (webdataset's curl, a plain GET) reads http(s) "
            "URLs and has no credentials. Give it a presigned URL for each key: "
            "client.generate_presigned_url('get_object', Params={'Bucket': …, 'Key': …}, "
            "ExpiresIn=…)."
        )
    path = urllib.parse.unquote(parts.path)
    return path[len(bucket) + 2 :] if path.startswith(f"/{bucket}/") else path[1:]


def _lifetime(url):
    """Seconds the presigned ``url`` stays valid from now, or None when it carries no
    signature."""
    import urllib.parse

    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    if "X-Amz-Expires" in query:  # signature version 4: seconds from its X-Amz-Date
        return float(query["X-Amz-Expires"][0])
    if "Signature" in query and "Expires" in query:  # version 2: the moment it expires
        return float(query["Expires"][0]) - time.time()
    return None


def _same_shards(urls, client, bucket, prefix, expires_s, call):
    """``CheckFailed`` unless ``urls`` are presigned GETs of every shard under ``prefix``, in key
    order, valid for ``expires_s``."""
    if isinstance(urls, (str, bytes)) or not hasattr(urls, "__iter__"):
        raise CheckFailed(f"{call} returned {urls!r:.80}: return a list of URLs, one per shard.")
    urls = list(urls)
    keys = [_key_of(url, bucket, call) for url in urls]
    expected = _listed_shards(client, bucket, prefix)
    repeated = [key for key, count in Counter(keys).items() if count > 1]
    if repeated:
        raise CheckFailed(f"{call}: {repeated[0]} is in the list twice: it would be read twice.")
    outside = [key for key in keys if not key.startswith(prefix)]
    elsewhere = [key.split("/", 1) for key in outside if "/" in key]
    if elsewhere and elsewhere[0][1] in expected:
        raise CheckFailed(
            f"{call}: a URL names the bucket {elsewhere[0][0]!r}, not {bucket!r}: sign each key "
            "in the bucket you were given (Params={'Bucket': bucket, ...})."
        )
    if outside and prefix + outside[0] in expected:
        raise CheckFailed(
            f"{call}: a URL names the object {outside[0]}, which does not exist: sign each "
            f"object's whole key, as the listing gives it ({prefix}{outside[0]})."
        )
    if outside:
        raise CheckFailed(
            f"{call}: {outside[0]} is not under {prefix}: list with Prefix=prefix, or you read "
            "the whole bucket (another split, older shards)."
        )
    others = [key for key in keys if not key.endswith(".tar")]
    if others:
        raise CheckFailed(
            f"{call}: {others[0]} is no shard: keep the keys that end in .tar (a listing also "
            "holds manifests, markers, logs)."
        )
    missing = [key for key in expected if key not in set(keys)]
    if keys and all(key.removeprefix(prefix) in expected for key in keys):
        raise CheckFailed(
            f"{call}: a URL names the object {keys[0]}: the keys a listing gives already start "
            f"with {prefix}; sign each as it is listed."
        )
    if missing and sorted(keys) == expected[: len(keys)] and len(keys) < 1000:
        raise CheckFailed(
            f"{call} gave the first {len(keys):,} of the {len(expected):,} shards under {prefix}: "
            "one list_objects_v2 call returns at most 1,000 keys, and says IsTruncated when there "
            "are more. Follow the pages: client.get_paginator('list_objects_v2')."
        )
    if missing:
        raise CheckFailed(
            f"{call}: {len(missing):,} of the {len(expected):,} shards under {prefix} are missing "
            f"(e.g. {missing[0]})."
        )
    if keys != expected:
        raise CheckFailed(
            f"{call}: the URLs are not in key order. Every rank builds this list and then "
            "shuffles it with the same seed, so all must start from the same order: keep the "
            "listing's (it is sorted by key)."
        )
    lifetimes = [_lifetime(url) for url in urls]
    if None in lifetimes:
        raise CheckFailed(
            f"{call}: {urls[lifetimes.index(None)]} carries no signature. The objects are "
            "private (as they should be), so a GET without one is answered 403 Forbidden: "
            "presign each URL with client.generate_presigned_url('get_object', …)."
        )
    version_2 = [url for url in urls if "X-Amz-Signature=" not in url]
    if version_2:
        raise CheckFailed(
            f"{call}: {version_2[0]:.100}… is signed with Signature Version 2 (Signature=), which "
            "Amazon S3 refuses for buckets made since June 2020: make the client sign with "
            "version 4, boto3.client('s3', config=Config(signature_version='s3v4')) (Config from "
            "botocore.config), as s3.client() does."
        )
    method = _signed_method(client, urls[0])
    if method not in (None, "GET"):
        raise CheckFailed(
            f"{call}: {urls[0]:.100}… is signed for a {method}, not a GET: a real store refuses "
            "it to a loader, which only reads (the loopback server here checks no signature). "
            "Presign 'get_object'."
        )
    shortest = round(min(lifetimes) / 10) * 10  # signed a moment ago: to the nearest 10 s
    if abs(shortest - expires_s) > 120:
        default = " (an hour: ExpiresIn's default)" if abs(shortest - 3600) <= 120 else ""
        raise CheckFailed(
            f"{call}: the URLs expire after {shortest:,} s{default}, not {expires_s:,} s. "
            "A URL that expires while the job runs is answered 403 Forbidden in the middle of an "
            "epoch: pass ExpiresIn=expires_s."
        )
    return urls


def _signed_method(client, url):
    """The HTTP method the version-4 presigned ``url`` was signed for, found by signing it again
    with ``client``'s credentials at the URL's own time for each method; None when none matches
    (or it is no version-4 URL)."""
    import datetime
    import urllib.parse
    from unittest import mock

    import botocore.auth
    from botocore.awsrequest import AWSRequest

    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    if not {"X-Amz-Date", "X-Amz-Expires", "X-Amz-Signature"} <= set(query):
        return None
    when = datetime.datetime.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
    signer = getattr(client, "_request_signer", None)  # botocore's own: gone, say nothing
    if getattr(signer, "_credentials", None) is None or not hasattr(
        botocore.auth, "get_current_datetime"
    ):
        return None
    auth = botocore.auth.S3SigV4QueryAuth(
        signer._credentials.get_frozen_credentials(),
        "s3",
        client.meta.region_name,
        expires=int(query["X-Amz-Expires"]),
    )
    for method in ("GET", "PUT", "HEAD", "DELETE"):
        request = AWSRequest(method=method, url=urllib.parse.urlunsplit(parts._replace(query="")))
        with mock.patch.object(botocore.auth, "get_current_datetime", return_value=when):
            auth.add_auth(request)
        signed = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(request.url).query))
        if signed.get("X-Amz-Signature") == query["X-Amz-Signature"]:
            return method
    return None


def _get(url, call):
    """The bytes a plain GET of ``url`` returns, no credentials; ``CheckFailed`` on an HTTP
    error."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.read()
    except urllib.error.HTTPError as error:
        raise CheckFailed(
            f"{call}: GET {url} was answered {error.code} {error.reason}: presign a GET of the "
            "object ('get_object', with its Bucket and its Key as the listing gives it)."
        ) from None


def _at_most_1000_keys(params, **_):
    """A listing call's parameters with MaxKeys capped at 1,000, as S3 caps it."""
    if params.get("MaxKeys", 1000) > 1000:
        params["MaxKeys"] = 1000


def check_shard_urls(shard_urls, client, bucket, prefix):
    """Lesson 6: ``shard_urls(client, bucket, prefix, expires_s)`` lists every shard under
    ``prefix`` (past the first 1,000 keys), in key order, as presigned GET URLs valid for
    ``expires_s``; a plain GET of each returns the object, and webdataset reads every sample
    once."""
    import webdataset as wds

    from ..layout import is_meta, split_member
    from ..tarscan import iter_buffer

    _listing_bucket(client)
    day = 86_400
    # S3 returns at most 1,000 keys a listing call whatever MaxKeys asks; moto returns more
    client.meta.events.register("provide-client-params.s3.ListObjectsV2", _at_most_1000_keys)
    try:
        first = shard_urls(client, LISTING_BUCKET, "train/", day)
    finally:
        client.meta.events.unregister("provide-client-params.s3.ListObjectsV2", _at_most_1000_keys)
    _same_shards(
        first,
        client,
        LISTING_BUCKET,
        "train/",
        day,
        f"shard_urls(client, {LISTING_BUCKET!r}, 'train/', {day})",
    )
    _nothing_under(shard_urls, client, "no-such-prefix/", day)
    call = f"shard_urls(client, {bucket!r}, {prefix!r}, 21600)"
    urls = _same_shards(
        shard_urls(client, bucket, prefix, 21_600), client, bucket, prefix, 21_600, call
    )
    expected = []
    for url, key in zip(urls, _listed_shards(client, bucket, prefix)):
        data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        if _get(url, call) != data:
            raise CheckFailed(f"{call}: GET {url} returned other bytes than the object {key}.")
        expected += [
            split_member(name)[0] for name, _ in iter_buffer(data, key) if not is_meta(name)
        ]
    expected = sorted(set(expected))
    read = sorted(sample["__key__"] for sample in wds.WebDataset(urls, shardshuffle=False))
    if read != expected:
        raise CheckFailed(
            f"{call}: webdataset read {len(read):,} samples ({len(set(read)):,} distinct) through "
            f"the URLs, of {len(expected):,} in the shards."
        )
    passed(
        f"{LISTING_SHARDS:,} shards listed past the first page of 1,000, in key order, each URL "
        f"signed for {day:,} s; webdataset read all {len(read):,} samples of s3://{bucket}/"
        f"{prefix} once, through {len(urls)} presigned URLs and no credentials."
    )


def _nothing_under(shard_urls, client, prefix, expires_s):
    """``shard_urls`` gives no URL for a prefix that holds no object."""
    call = f"shard_urls(client, {LISTING_BUCKET!r}, {prefix!r}, {expires_s})"
    try:
        urls = list(shard_urls(client, LISTING_BUCKET, prefix, expires_s))
    except KeyError as error:
        raise CheckFailed(
            f"{call}, a prefix with no objects, raised KeyError: {error}. A page of the listing "
            "that holds no key has no 'Contents': page.get('Contents', [])."
        ) from None
    if urls:
        raise CheckFailed(f"{call}, a prefix with no objects, returned {urls!r:.80}, not [].")


# --- lesson 6: who am I under torchrun? -----------------------------------------------------------

# some of what torchrun sets in each process: five processes of four jobs, on 1, 2 (two of its
# processes), 2 and 3 machines
_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
_TORCHRUN_PROCESSES = [
    (1, 2, 1, 2, 0),
    (1, 4, 1, 2, 0),
    (3, 4, 1, 2, 1),
    (6, 8, 2, 4, 1),
    (2, 3, 0, 1, 2),
]
# the first: a plain `python train.py`, or a notebook (no torchrun, none of them set)
_TORCHRUN_CASES = [{}] + [
    dict(zip(_TORCHRUN_VARIABLES, map(str, values), strict=True)) for values in _TORCHRUN_PROCESSES
]


def _where(environ):
    """The reference: ``(rank, world_size, local_rank)``; rank 0 of 1 outside torchrun."""
    return tuple(
        int(environ.get(name, default))
        for name, default in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0))
    )


def _where_mistakes():
    """``(what a learner whose answers follow this rule in every case got wrong, the rule)``."""
    import os

    return [
        (
            "you read os.environ, not the environ given (the check passes each process's "
            "variables as environ), or names torchrun does not set: read environ['RANK'], "
            "environ['WORLD_SIZE'] and environ['LOCAL_RANK'], upper case.",
            lambda env: _where(os.environ),
        ),
        (
            "LOCAL_RANK numbers the processes of one machine, from 0 on every machine; RANK "
            "numbers them across the whole job. With LOCAL_RANK as the rank, the first process "
            "of every machine would read the same shards.",
            lambda env: _where({**env, "RANK": env.get("LOCAL_RANK", 0)}),
        ),
        (
            "GROUP_RANK is the machine's number, not the process's: RANK is.",
            lambda env: _where({**env, "RANK": env.get("GROUP_RANK", 0)}),
        ),
        (
            "outside torchrun a process is alone: a world of 1, not 0 (shards[rank::0] fails).",
            lambda env: _where({"WORLD_SIZE": 0, **env}),
        ),
        (
            "LOCAL_WORLD_SIZE counts the processes of one machine; WORLD_SIZE counts all the "
            "job's processes, on every machine.",
            lambda env: _where({**env, "WORLD_SIZE": env.get("LOCAL_WORLD_SIZE", 1)}),
        ),
        (
            "the local rank is LOCAL_RANK: it picks this process's GPU (cuda:LOCAL_RANK), and "
            "every machine numbers its GPUs from 0, so rank 3 on a machine of 2 GPUs has no "
            "cuda:3.",
            lambda env: _where({**env, "LOCAL_RANK": env.get("RANK", 0)}),
        ),
    ]


def _before_torchruns_traceback(stderr):
    """What the processes torchrun started printed: ``stderr`` up to torchrun's own traceback,
    which comes last and only says that a process failed (all of it when there is nothing else)."""
    own = stderr.rfind("Traceback (most recent call last)")
    return stderr[:own] if own > 0 else stderr


def _run_under_torchrun(where_am_i):
    """Write ``where_am_i`` into a script, run it with ``torchrun --standalone
    --nproc_per_node=2``, and return each process's ``{"got", "rank", "world_size"}``, the last two
    from ``torch.distributed`` after ``init_process_group``."""
    import inspect
    import json
    import subprocess
    import sys
    import tempfile
    import textwrap
    from pathlib import Path

    from .. import multinode

    try:
        source = textwrap.dedent(inspect.getsource(where_am_i))
    except (OSError, TypeError) as error:
        raise CheckFailed(
            f"could not read the source of where_am_i ({error}): define it with def in a cell."
        ) from None
    script = "\n".join(
        [
            "import json, os, sys",
            "import torch.distributed as dist",
            source,
            f"where_am_i = {where_am_i.__name__}",
            'dist.init_process_group("gloo")',
            "try:",
            "    got = list(where_am_i(os.environ))",
            "except Exception as error:",
            '    got = f"{type(error).__name__}: {error}"',
            "answer = dict(got=got, rank=dist.get_rank(), world_size=dist.get_world_size())",
            "with open(os.path.join(sys.argv[1], f'{dist.get_rank()}.json'), 'w') as file:",
            "    json.dump(answer, file)",
            "dist.destroy_process_group()",
        ]
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "where_am_i.py"
        path.write_text(script)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        with subprocess.Popen(
            [*command, "--nproc_per_node=2", str(path), folder],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as run:
            _, printed, _ = multinode.finish(run, timeout=300)
        if run.returncode != 0:
            raise CheckFailed(
                f"under torchrun --standalone --nproc_per_node=2 your function failed (exit "
                f"status {run.returncode}); the end of what the processes printed:\n"
                f"{_before_torchruns_traceback(printed)[-1500:]}"
            )
        return [json.loads(answer.read_text()) for answer in sorted(Path(folder).glob("*.json"))]


def _follows(where_am_i, rule):
    """Whether ``where_am_i`` answers as ``rule`` does for every process of ``_TORCHRUN_CASES``."""
    try:
        return all(where_am_i(dict(env)) == rule(env) for env in _TORCHRUN_CASES)
    except Exception:  # a rule it does not follow, whatever it raised
        return False


def check_where_am_i(where_am_i):
    """Lesson 6: ``where_am_i(environ)`` reads ``(rank, world_size, local_rank)`` from the variables
    torchrun sets, as ints, and ``(0, 1, 0)`` outside torchrun; then it runs for real under
    ``torchrun --standalone --nproc_per_node=2`` and must agree with ``torch.distributed``."""
    for environ in _TORCHRUN_CASES:
        shown = ", ".join(f"{name}={value}" for name, value in environ.items()) or "nothing"
        call = f"where_am_i({{{shown}}})" if environ else "where_am_i({}) (no torchrun)"
        expected = _where(environ)
        try:
            got = where_am_i(dict(environ))
        except KeyError as error:
            raise CheckFailed(
                f"{call} raised KeyError: {error}. Outside torchrun (python train.py, a "
                "notebook) none of its variables is set: a single process is rank 0 of a world "
                "of 1, local rank 0."
            ) from None
        except TypeError as error:
            if "NoneType" not in str(error):
                raise
            raise CheckFailed(
                f"{call} raised TypeError: {error}. environ.get(name) is None where torchrun set "
                'nothing: give each a default, environ.get("RANK", 0), so that a process alone is '
                "rank 0 of a world of 1, local rank 0."
            ) from None
        except (ValueError, RuntimeError) as error:
            if "process group" not in str(error).lower():
                raise
            raise CheckFailed(
                f"{call} asked torch.distributed ({error}): it knows the rank only after "
                "init_process_group, which itself reads these variables. Read the environment."
            ) from None
        if not isinstance(got, tuple | list) or len(got) != 3:
            raise CheckFailed(f"{call} returned {got!r}: return (rank, world_size, local_rank).")
        if any(isinstance(value, str) for value in got):
            raise CheckFailed(
                f"{call} returned {got!r}: the environment holds strings; convert each with "
                "int(), or shards[rank::world_size] fails."
            )
        if not all(map(_whole, got)):
            raise CheckFailed(
                f"{call} returned {tuple(got)!r}: ranks and sizes are whole numbers, and "
                "shards[rank::world_size] takes only ints: convert each with int()."
            )
        got = tuple(got)
        if got == expected:
            continue
        follows = [hint for hint, rule in _where_mistakes() if _follows(where_am_i, rule)]
        hint = (follows or ["read RANK, WORLD_SIZE and LOCAL_RANK, each as an int."])[0]
        raise CheckFailed(f"{call} returned {got}, expected {expected}: {hint}")
    answers = _run_under_torchrun(where_am_i)
    if len(answers) != 2:
        raise CheckFailed(f"under torchrun, {len(answers)} processes answered instead of 2.")
    for answer in sorted(answers, key=lambda a: a["rank"]):
        if isinstance(answer["got"], str):
            raise CheckFailed(
                f"under torchrun, where_am_i raised {answer['got']}. The script holds your "
                "function alone, after `import json, os`: import anything else it needs inside it."
            )
        truth = [answer["rank"], answer["world_size"], answer["rank"]]  # one machine
        if answer["got"] != truth:
            raise CheckFailed(
                f"under torchrun, the process that torch.distributed calls rank {answer['rank']} "
                f"of {answer['world_size']} got {tuple(answer['got'])} from where_am_i, expected "
                f"{tuple(truth)}."
            )
    passed(
        "rank, world size and local rank read as ints from the environment on 1 to 3 machines, "
        "rank 0 of 1 alone; under torchrun both processes agree with torch.distributed."
    )


# --- lesson 4: shuffle before sharding ------------------------------------------------------------

# the check's own data: 10 classes of 60 keys each, in key order, which is class order (as a dataset
# folder lists them)
_SORTED_KEYS = [f"{index:06d}" for index in range(600)]


def _label_of(key):
    return int(key) // 60


def _cuts(keys, per_shard):
    """``keys`` cut into consecutive shards of ``per_shard``, the last holding what is left."""
    return [list(keys[start : start + per_shard]) for start in range(0, len(keys), per_shard)]


def _as_shards(got, call):
    """The learner's answer as a list of lists of keys, or ``CheckFailed`` saying what it is."""
    try:
        return [list(shard) for shard in got]
    except TypeError:
        raise CheckFailed(
            f"{call} returned {got!r:.80}: return a list of shards, each a list of keys."
        ) from None


def _random_state():
    """The state of Python's, NumPy's and torch's global random generators."""
    import random

    import numpy as np
    import torch

    return random.getstate(), str(np.random.get_state()), torch.get_rng_state().numpy().tobytes()


def _assignment(assign_shards, keys, per_shard, seed):
    """``assign_shards`` called on a copy of ``keys``; ``CheckFailed`` when it changes the copy or
    reseeds a global random generator."""
    given, before = list(keys), _random_state()
    call = f"assign_shards(keys, {per_shard}, seed={seed})"
    shards = _as_shards(assign_shards(given, per_shard, seed), call)
    if given != list(keys):
        raise CheckFailed(
            f"{call} reordered the list it was given (random.shuffle(keys) shuffles in place): the "
            "caller's keys changed under it. Shuffle a copy, or draw a permutation of the indices."
        )
    if _random_state() != before:
        raise CheckFailed(
            f"{call} reseeded or drew from a global random generator, Python's, NumPy's or "
            "torch's (random.seed, np.random.seed, torch.manual_seed, random.shuffle): every "
            "other user of it, an "
            "augmentation say, now repeats its numbers or loses them. Make a generator of your "
            "own from the seed: random.Random(seed) or np.random.default_rng(seed)."
        )
    return shards


def _each_key_once(shards, keys, per_shard, call):
    """``CheckFailed`` unless the shards hold every key of ``keys`` once, cut every
    ``per_shard``."""
    where = {}
    for number, shard in enumerate(shards):
        for key in shard:
            if where.get(key) == number:
                raise CheckFailed(
                    f"{call}: key {key!r} is twice in shard {number}: drawing with replacement "
                    "(random.choices, rng.choice without replace=False) repeats keys and leaves "
                    "others out. Shuffle a copy of the list, or draw a permutation of it."
                )
            if key in where:
                raise CheckFailed(
                    f"{call}: key {key!r} is in shard {where[key]} and in shard {number}, so its "
                    "sample would come twice an epoch. Cut the shuffled list into slices that do "
                    "not overlap: [start : start + per_shard], start going up by per_shard."
                )
            where[key] = number
    given = set(keys)
    stray = [key for key in where if key not in given]
    if stray:
        raise CheckFailed(f"{call}: {stray[0]!r} is not one of the keys given.")
    lost = [key for key in keys if key not in where]
    if lost:
        cure = (
            "Keep the last, shorter shard."
            if len(shards) < -(-len(keys) // per_shard)
            else f"Your shards hold fewer than {per_shard} keys: look at where each slice starts "
            "and ends."
        )
        raise CheckFailed(
            f"{call}: {len(lost)} of {len(keys)} keys are in no shard (e.g. {lost[0]!r}): those "
            f"samples would never be trained on. {cure}"
        )
    sizes = [len(shard) for shard in shards]
    if any(size != per_shard for size in sizes[:-1]) or not 0 < sizes[-1] <= per_shard:
        raise CheckFailed(
            f"{call}: the shards hold {sorted(set(sizes))} keys; expected {per_shard} in each, "
            "the last one fewer when the keys run out (as write_shards(maxcount=...) cuts them)."
        )


def _class_mix(shards, keys, per_shard, call):
    """``CheckFailed`` when the shards are the given order cut up, or a shard holds few
    classes."""
    cut = _cuts(keys, per_shard)
    if shards == cut:
        raise CheckFailed(
            f"{call}: shard 0 holds only class {_label_of(shards[0][0])}: you cut the keys in the "
            "order given, which is class order. Shuffle the whole list first, then cut it."
        )
    if [sorted(shard) for shard in shards] == [sorted(shard) for shard in cut]:
        raise CheckFailed(
            f"{call}: each shard holds one class, in a new order: you shuffled inside each shard, "
            "after cutting. A shard's classes are decided by the cut: shuffle the whole list "
            "before it."
        )
    mixes = [len({_label_of(key) for key in shard}) for shard in shards[:-1]]
    if min(mixes) < 5:
        number = mixes.index(min(mixes))
        raise CheckFailed(
            f"{call}: shard {number} holds {min(mixes)} of 10 classes, where a full shuffle gives "
            f"every shard of {per_shard} nearly all 10. Shuffle the whole list, then cut."
        )
    if all(shard == sorted(shard) for shard in shards):
        raise CheckFailed(
            f"{call}: the keys of every shard come in sorted order, so a shard streams its "
            "classes one after another and a shuffle buffer sees runs of one class. Keep the "
            "shuffled order within each shard."
        )


def _check_same_shards_elsewhere(assign_shards, shards, per_shard, seed):
    """``CheckFailed`` when ``assign_shards``, run from its source by fresh Python processes with
    other hash seeds, cuts other shards than ``shards`` from the same keys and seed; nothing to
    say when it cannot run there (it calls a helper of the notebook)."""
    import subprocess

    from . import fresh

    call = f"[[str(key) for key in shard] for shard in {{name}}(args, {per_shard}, {seed})]"
    try:
        others = [fresh.run(assign_shards, _SORTED_KEYS, call, hash_seed) for hash_seed in (1, 2)]
    except (fresh.Unreadable, fresh.Failed, subprocess.TimeoutExpired):
        return
    if any(other != [[str(key) for key in shard] for shard in shards] for other in others):
        raise CheckFailed(
            f"assign_shards(keys, {per_shard}, seed={seed}) cut other shards in another Python "
            "process: str's hash() changes with every interpreter (PYTHONHASHSEED), so a shard "
            "written again later, or on another machine, would hold other keys. Draw from a "
            "generator made from the seed: random.Random(seed) or np.random.default_rng(seed)."
        )


def check_assign_shards(assign_shards, root):
    """Lesson 4: ``assign_shards(keys, per_shard, seed)`` cuts a full shuffle, seeded by ``seed``,
    into shards of ``per_shard`` keys: every key once, every shard a mix of classes, the same
    shards from the same seed and others from another seed."""
    for per_shard, seed in [(50, 1), (64, 7), (600, 3)]:
        call = f"assign_shards(keys, {per_shard}, seed={seed})"
        shards = _assignment(assign_shards, _SORTED_KEYS, per_shard, seed)
        _each_key_once(shards, _SORTED_KEYS, per_shard, call)
        if len(shards) > 1:
            _class_mix(shards, _SORTED_KEYS, per_shard, call)
        if _assignment(assign_shards, _SORTED_KEYS, per_shard, seed) != shards:
            raise CheckFailed(
                f"{call} gave other shards when called again with the same seed: draw from a "
                "generator made from the seed (random.Random(seed) or "
                "np.random.default_rng(seed)), so that the same seed rewrites the same shards."
            )
    _check_same_shards_elsewhere(
        assign_shards, _assignment(assign_shards, _SORTED_KEYS, 50, 1), 50, 1
    )
    if _assignment(assign_shards, _SORTED_KEYS, 50, 1) == _assignment(
        assign_shards, _SORTED_KEYS, 50, 2
    ):
        raise CheckFailed(
            "assign_shards(keys, 50, seed=1) and seed=2 gave the same shards: the seed must "
            "choose the shuffle (make the generator from it)."
        )
    samples = imagefolder.load_manifest(root)["samples"]
    keys = sorted(sample["key"] for sample in samples)
    labels = {sample["key"]: sample["label"] for sample in samples}
    per_shard = -(-len(keys) // 20)
    shards = _assignment(assign_shards, keys, per_shard, 0)
    _each_key_once(shards, keys, per_shard, f"with the dataset's {len(keys):,} keys")

    def mixes(cut):
        return [len({labels[key] for key in shard}) for shard in cut]

    mixed, unshuffled = mixes(shards), mixes(_cuts(keys, per_shard))
    passed(
        f"every key once, the same shards from the same seed; the dataset's {len(keys):,} samples "
        f"in {len(shards)} shards of {per_shard}, each holding {min(mixed)} to {max(mixed)} of "
        f"{len(set(labels.values()))} classes (cut in key order: {min(unshuffled)} to "
        f"{max(unshuffled)})."
    )


def _stream_keys(shards, world_size=2, num_workers=3, epoch=0, **options):
    """Keys of one epoch as ``world_size`` simulated ranks × ``num_workers`` DataLoader workers
    stream them from ``shards`` with ``ShardDataset(**options)``: real worker processes where
    ``fork`` exists (a function defined in a notebook reaches them that way), else each worker's
    share computed in this process."""
    import multiprocessing
    import warnings

    from torch.utils.data import DataLoader

    from ..streaming import ShardDataset

    keys = []
    for rank in range(world_size):
        dataset = ShardDataset(
            shards, rank=rank, world_size=world_size, keys=("__key__",), decode=False, **options
        )
        dataset.set_epoch(epoch)
        if "fork" in multiprocessing.get_all_start_methods():
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*worker processes in total.*")
                loader = DataLoader(
                    dataset,
                    batch_size=None,
                    num_workers=num_workers,
                    multiprocessing_context="fork",
                )
                keys += [key for (key,) in loader]
        else:
            keys += [
                key
                for worker in range(num_workers)
                for (key,) in dataset.iterate(worker, num_workers)
            ]
    return keys


def _check_exactly_once(shards, what, **options):
    """2 ranks × 3 workers, two epochs: every sample exactly once per epoch, and the next epoch in
    another order."""
    from ..layout import expand_shards
    from ..shardread import count_shard_samples

    expected = sum(count_shard_samples(shard) for shard in expand_shards(shards))
    orders = [_stream_keys(shards, epoch=epoch, **options) for epoch in (0, 1)]
    for epoch, keys in enumerate(orders):
        repeated = [key for key, n in Counter(keys).items() if n > 1]
        if repeated:
            raise CheckFailed(
                f"epoch {epoch}: {len(repeated)} samples arrived more than once across 2 ranks × 3 "
                f"workers (e.g. key {repeated[0]!r}) {what}"
            )
        if len(keys) != expected:
            raise CheckFailed(
                f"epoch {epoch}: {expected - len(keys)} of {expected} samples never arrived across "
                "2 "
                f"ranks × 3 workers {what}"
            )
    if orders[0] == orders[1]:
        raise CheckFailed(f"epochs 0 and 1 delivered the samples in the same order {what}")
    return expected


def _split_parts(split_shards, names, world_size, num_workers, call):
    """``{(rank, worker): part}``; ``CheckFailed`` when a call changes the list it is given or
    gives another part for the same arguments (a shuffle inside the split)."""
    given = list(names)
    parts = {
        (rank, worker): list(split_shards(given, rank, world_size, worker, num_workers))
        for rank in range(world_size)
        for worker in range(num_workers)
    }
    if given != names:
        raise CheckFailed(
            f"{call}, split_shards reordered the list it was given: the caller's shard list "
            "changed under it. Only slice it; the shuffle happens before the split."
        )
    if list(split_shards(given, 0, world_size, 0, num_workers)) != parts[0, 0]:
        raise CheckFailed(
            f"{call}, split_shards gave rank 0 worker 0 another part when called again with the "
            "same arguments: a shuffle inside the split makes the ranks' and workers' parts "
            "overlap. Only slice the list; it arrives already shuffled for the epoch."
        )
    return parts


def _check_split_follows_order(split_shards, given):
    """``CheckFailed`` when each part holds the same shards whatever the list's order: a split by
    the shards' names, which the epoch's shuffle then cannot change."""
    rotated = given[1:] + given[:1]

    def part(shards, rank, worker):
        return set(split_shards(list(shards), rank, 2, worker, 2))

    places = [(rank, worker) for rank in range(2) for worker in range(2)]
    if all(part(given, *place) == part(rotated, *place) for place in places):
        raise CheckFailed(
            "each rank and worker gets the same shards whatever order the list comes in: your "
            "split goes by the shards' names, so every worker reads the same shards every epoch. "
            "Take the parts by position in the list you are given."
        )


def check_shard_split(split_shards, shards):
    """Lesson 4: ``split_shards(shards, rank, world_size, worker, num_workers)`` gives every (rank,
    worker) a part of the list: disjoint, complete, within one shard of each other; then streams
    every sample exactly once."""
    for count, world_size, num_workers in [(20, 2, 3), (7, 2, 2), (5, 1, 4), (12, 3, 1), (3, 2, 3)]:
        names = [f"train-{i:06d}.tar" for i in range(count)]
        call = f"with {count} shards, {world_size} ranks and {num_workers} workers"
        parts = _split_parts(split_shards, names, world_size, num_workers, call)
        owners = {}
        for place, part in parts.items():
            for name in part:
                if name in owners:
                    (r1, w1), (r2, w2) = owners[name], place
                    raise CheckFailed(
                        f"{call}, {name} goes to rank {r1} worker {w1} and to rank {r2} worker "
                        f"{w2}: its samples would arrive twice. Split by rank first, then by "
                        "worker ([rank::world_size][worker::num_workers]), or deal in one step: "
                        "[rank * num_workers + worker :: world_size * num_workers]."
                    )
                owners[name] = place
        if len(owners) != count:
            missing = sorted(set(names) - set(owners))
            raise CheckFailed(
                f"{call}, nobody reads {missing[0]} ({len(missing)} shards left out)."
            )
        sizes = sorted(map(len, parts.values()))
        if sizes[-1] - sizes[0] > 1:
            raise CheckFailed(
                f"{call}, workers get {sizes[0]} to {sizes[-1]} shards: deal them out like cards."
            )
    # an epoch's shuffled order, here simply reversed
    given = [f"train-{i:06d}.tar" for i in reversed(range(8))]
    for rank in range(2):
        part = list(split_shards(given, rank, 2, 0, 1))
        if part != sorted(part, key=given.index):
            raise CheckFailed(
                "Keep the order you are given: the list arrives reshuffled for each epoch, and "
                "reordering it (sorting, a shuffle of your own) gives every epoch the same order."
            )
    _check_split_follows_order(split_shards, given)
    samples = _check_exactly_once(shards, "with your split.", splitter=split_shards)
    passed(
        f"disjoint, complete, balanced; 2 ranks × 3 workers streamed all {samples:,} samples "
        "exactly once per epoch, "
        "in a new order in the next epoch."
    )


def _past_the_buffer_named(stream):
    """The items of ``stream``; an ``IndexError`` from it becomes a ``CheckFailed`` that says
    where such an index comes from."""
    try:
        yield from stream
    except IndexError as error:
        raise CheckFailed(
            f"shuffle_buffer raised IndexError ({error}): it indexed past the buffer. "
            "rng.randint(0, size) can return size itself, rng.randrange(size) cannot; and pick "
            "from the buffer only once it is full."
        ) from None


def check_shuffle_buffer(shuffle_buffer, shards):
    """Lesson 4: ``shuffle_buffer(samples, size, rng)`` fills up before it yields, loses and repeats
    nothing, shuffles, and is reproducible from ``rng``; then streams every sample exactly once with
    it."""
    import random

    consumed = []

    def source(count=200):
        for item in range(count):
            consumed.append(item)
            yield item

    stream = shuffle_buffer(source(), 50, random.Random(0))
    if not isinstance(stream, Iterator):
        raise CheckFailed(
            f"shuffle_buffer returned a {type(stream).__name__}: write a generator (yield the "
            "samples "
            "one at a time), or it holds the whole stream in memory."
        )
    out = []
    for item in _past_the_buffer_named(stream):
        if not out and len(consumed) < 50:
            raise CheckFailed(
                f"the first sample came out after reading only {len(consumed)} of a buffer of 50: "
                "fill "
                "the buffer before yielding, or the first samples are hardly shuffled."
            )
        if len(consumed) > 50 + len(out) + 1:
            raise CheckFailed(
                f"sample {len(out) + 1} came out after reading {len(consumed)}: a buffer of 50 "
                "never "
                "reads more than 50 ahead of what it has yielded (the stream may not fit in "
                "memory)."
            )
        out.append(item)
    if len(set(out)) < len(out):
        raise CheckFailed(
            f"200 samples went in, {len(out)} came out, {len(out) - len(set(out))} of them more "
            f"than once and {200 - len(set(out))} never: yield the sample you picked, then put the "
            "newcomer in its place (buffer[i] = sample), not beside it."
        )
    if sorted(out) != list(range(200)):
        lost = 200 - len(set(out))
        raise CheckFailed(
            f"200 samples went in, {len(out)} came out ({lost} missing): at the end, yield what is "
            "still in the buffer."
        )
    if out == list(range(200)):
        raise CheckFailed(
            "the samples come out in the order they went in: pick a random one of the buffer with "
            "rng."
        )
    long_run = list(_past_the_buffer_named(shuffle_buffer(iter(range(2000)), 50, random.Random(0))))
    stuck = [item for place, item in enumerate(long_run) if place - item > 1900]
    if stuck:
        raise CheckFailed(
            f"in a stream of 2,000, sample {stuck[0]} stayed in the buffer from the start to the "
            "final drain, through more than 1,900 draws: a slot that is never picked? "
            "rng.randrange(size - 1) leaves out the last one; rng.randrange(size) picks any."
        )
    if sorted(out[:50]) == list(range(50)):
        raise CheckFailed(
            "the first 50 samples out are the first 50 in, reordered: you shuffle block by block, "
            "so a sample never meets one from the next block. Once the buffer is full, yield one "
            "random sample of it for each newcomer."
        )
    consumed.clear()
    again = list(_past_the_buffer_named(shuffle_buffer(source(), 50, random.Random(0))))
    if len(again) != 200:
        raise CheckFailed(
            f"a second call gave {len(again)} samples for 200: something outlived the first call "
            "(a buffer=[] default argument, or a buffer outside the function). Make the buffer "
            "inside the function."
        )
    if again != out:
        raise CheckFailed(
            "the same rng seed gave a different order: draw every random choice from rng, nothing "
            "else."
        )
    if list(_past_the_buffer_named(shuffle_buffer(iter(range(200)), 50, random.Random(5)))) == out:
        raise CheckFailed(
            "rng seeded 0 and rng seeded 5 gave the same order: the buffer never uses the rng it "
            "is given. Draw every random choice from rng (rng.randrange, rng.shuffle), not from a "
            "generator of your own."
        )
    small = list(_past_the_buffer_named(shuffle_buffer(iter(range(20)), 50, random.Random(1))))
    if sorted(small) != list(range(20)):
        raise CheckFailed(
            f"a stream shorter than the buffer (20 samples, buffer 50) came out as {small}."
        )
    if small == list(range(20)):
        raise CheckFailed(
            "a stream shorter than the buffer (20 samples, buffer 50) came out in the order it "
            "went in: "
            "the buffer never filled, so everything left in the final drain. Shuffle what is left "
            "with "
            "rng.shuffle before yielding it."
        )
    if list(shuffle_buffer(iter(range(20)), 50, random.Random(2))) == small:
        raise CheckFailed(
            "a stream shorter than the buffer (20 samples, buffer 50) came out in the same order "
            "from two seeds: the final drain ignores rng. Shuffle what is left with rng.shuffle "
            "before yielding it."
        )
    samples = _check_exactly_once(
        shards, "with your buffer.", shuffle=False, buffer_size=100, buffer=shuffle_buffer
    )
    passed(
        "fills first, keeps every sample, reproducible; 2 ranks × 3 workers streamed all "
        f"{samples:,} samples exactly "
        "once per epoch, in a new order in the next epoch."
    )


def _keys_by_rank(stream_class, shards, epoch, world_size=2, num_workers=3, seed=0):
    """The first field of every item that ``stream_class`` yields in ``epoch``, per rank, read
    by ``num_workers`` real, forked DataLoader workers (a class from a notebook reaches them so)."""
    import warnings

    from torch.utils.data import DataLoader

    keys = []
    for rank in range(world_size):
        dataset = stream_class(shards, rank=rank, world_size=world_size, seed=seed, buffer_size=100)
        dataset.set_epoch(epoch)
        fork = "fork" if num_workers else None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            loader = DataLoader(
                dataset, batch_size=None, num_workers=num_workers, multiprocessing_context=fork
            )
            keys.append([item[0] for item in loader])
    return keys


def _duplicates_explained(per_rank, expected):
    """Why samples arrived more than once or not at all, in words, or None."""
    within = [len(keys) - len(set(keys)) for keys in per_rank]
    everyone = [key for keys in per_rank for key in keys]
    missing, twice = expected - len(set(everyone)), len(everyone) - len(set(everyone))
    if all(set(Counter(keys).values()) == {3} for keys in per_rank):
        return (
            "every worker of a rank read all of that rank's shards (each sample 3 times per "
            "rank): split the shards between workers with get_worker_info()."
        )
    if any(within) and missing:
        return (
            f"within one rank, {max(within)} samples arrived twice, and {missing} of {expected} "
            "never arrived: the rank's workers shuffled the shard list differently (a seed from "
            "get_worker_info().seed, or none at all), or their slices are off. Shuffle it with the "
            "same seed and epoch in every worker and rank, then split: [worker::num_workers]."
        )
    if any(within):
        return (
            f"within one rank, {max(within)} samples arrived twice: the workers' parts overlap. "
            "Split the rank's shards with [worker::num_workers], after the split by rank."
        )
    if len(everyone) == 2 * expected and len(set(everyone)) == expected:
        return (
            "every rank read every shard (each sample once per rank, twice in all): split the "
            "shards between ranks first, with [rank::world_size]."
        )
    if missing and twice:
        return (
            f"{twice} samples arrived on both ranks, and {missing} of {expected} never arrived: "
            "the ranks' parts overlap and leave gaps. Either the ranks or workers shuffled the "
            "shard list differently (a seed with the rank or worker in it, or none at all), or "
            "the split's index is off: rank r's worker w takes [r::world_size][w::num_workers], "
            "or, dealt in one step, [r * num_workers + w :: world_size * num_workers]."
        )
    if missing:
        return (
            f"{missing} of {expected} samples never arrived: the ranks or "
            "workers shuffled the shard list differently. Shuffle it with the same seed and epoch "
            "everywhere (never the rank or the worker), then split."
        )
    if len(everyone) != expected:
        return (
            f"{len(everyone) - expected} samples arrived on both ranks: the ranks' parts "
            "overlap. Give each rank its own slice of the shuffled list, [rank::world_size]."
        )
    return None


def _shard_neighbours(keys, shards, window=3):
    """The share of items whose successor in their shard follows within ``window`` places (3
    workers take turns, so a worker's consecutive items lie 3 apart)."""
    from ..shardread import iter_shard_samples

    following, previous = {}, None
    for sample in iter_shard_samples(shards):
        if previous is not None and previous["__url__"] == sample["__url__"]:
            following[previous["__key__"]] = sample["__key__"]
        previous = sample
    close = sum(following.get(key) in keys[i + 1 : i + 1 + window] for i, key in enumerate(keys))
    return close / max(len(keys), 1)


def _check_shards_mix(keys, shards):
    """``CheckFailed`` when ``keys`` (one rank, no workers) bring every shard's samples together,
    one shard after another: shuffled within each shard, never across shards."""
    from ..shardread import iter_shard_samples

    shard_of = {sample["__key__"]: sample["__url__"] for sample in iter_shard_samples(shards)}
    runs = 1 + sum(shard_of[a] != shard_of[b] for a, b in zip(keys, keys[1:]))
    if len(set(shard_of.values())) > 1 and runs == len(set(shard_of.values())):
        raise CheckFailed(
            f"one rank, no workers: the samples of each of the {runs} shards came together, one "
            "shard after another: shuffled within each shard, never across them, so a batch "
            "holds the classes of one shard. Pass every shard's samples through one shuffle "
            "buffer, which mixes samples of several shards."
        )


def _alone_explained(alone, shards, expected):
    """Why one rank without workers did not stream every sample once: shards it never read while
    it read the others whole, or else where to start looking."""
    from ..shardread import iter_shard_samples

    arrived, keys_of = set(alone), {}
    for sample in iter_shard_samples(shards):
        keys_of.setdefault(sample["__url__"], set()).add(sample["__key__"])
    unread = sorted(shard for shard, keys in keys_of.items() if not keys & arrived)
    whole = all(keys <= arrived for keys in keys_of.values() if keys & arrived)
    counts = (
        f"one rank, no workers: {len(alone)} items, {len(arrived)} distinct, of {expected} samples."
    )
    if arrived and unread and whole and len(alone) == len(arrived):
        first = unread[0].rsplit("/", 1)[-1]
        return (
            f"{counts} No sample of {len(unread)} shard(s) arrived ({first} first), the others "
            "arrived whole: rank 0 of 1, worker 0 of 1, must read every shard. Look at where "
            "your slices start and end."
        )
    return (
        f"{counts} Start there: with no workers, get_worker_info() is None (worker 0 of 1); and "
        "when the shards run out, the buffer still holds samples to give."
    )


def _check_stream_seeding(stream_class, shards, alone):
    """The order of one rank, no workers, follows ``(seed, epoch)`` and nothing else: the same
    pair gives ``alone`` again, another seed another order, and seed 1's epoch 0 is not seed 0's
    epoch 1."""

    def order(seed, epoch):
        return _keys_by_rank(stream_class, shards, epoch, world_size=1, num_workers=0, seed=seed)[0]

    first_of_seed_1 = order(1, 0)
    if order(0, 0) != alone:
        raise CheckFailed(
            "the same seed and epoch streamed another order the second time: draw every random "
            "choice from generators seeded with self.seed and self.epoch, so that a run can be "
            "repeated."
        )
    if first_of_seed_1 == alone:
        raise CheckFailed(
            "seed=1 streamed epoch 0 in the same order as seed=0: mix self.seed into the shard "
            "shuffle and the buffer's rng, so that two runs can differ on purpose."
        )
    if first_of_seed_1 == order(0, 1):
        raise CheckFailed(
            "seed=1's epoch 0 came in the order of seed=0's epoch 1: seed + epoch makes them "
            'collide. Seed with the pair: random.Random(f"{seed}:{epoch}"), or '
            "np.random.default_rng([seed, epoch])."
        )


def _alone_keys(stream_class, shards):
    """The keys one rank without workers streams in epoch 0, iterating one dataset twice;
    ``CheckFailed`` naming what a first run shows: no worker info, no iterator, items that are not
    ``(key, label)``, a global generator touched, a second pass that differs."""
    dataset = stream_class(shards, rank=0, world_size=1, seed=0, buffer_size=100)
    dataset.set_epoch(0)
    before = _random_state()
    passes = [_items_of(dataset), _items_of(dataset)]
    if _random_state() != before:
        raise CheckFailed(
            "iterating the dataset reseeded or drew from a global random generator (random.seed, "
            "random.shuffle, np.random.permutation, torch.manual_seed): the model's own "
            "randomness changes with it. Draw from a generator of your own: "
            'random.Random(f"{seed}:{epoch}").'
        )
    if sorted(passes[1]) != sorted(passes[0]):
        raise CheckFailed(
            f"iterating the same dataset twice in one epoch gave {len(passes[0])} items, then "
            f"{len(passes[1])} ({len(set(passes[1]))} distinct): something outlived the first "
            "pass (a buffer or a generator made in __init__). Make them inside __iter__."
        )
    if passes[1] != passes[0]:
        raise CheckFailed(
            "iterating the same dataset twice in one epoch gave its samples in another order the "
            "second time: draw every random choice from generators made in __iter__ and seeded "
            "with self.seed and self.epoch, and shuffle a copy of the shard list (not self.shards "
            "in place), so that an epoch can be repeated, as a resumed job repeats it."
        )
    return [key for key, _ in passes[0]]


def _items_of(dataset):
    """Every item of one pass over ``dataset`` in this process, each checked to be a ``(key,
    label)`` pair; the usual first-run errors in words."""
    try:
        items = list(iter(dataset))
    except AttributeError as error:
        if "'NoneType'" not in str(error):
            raise
        raise CheckFailed(
            f"{error}: without DataLoader workers, get_worker_info() returns None. Take that as "
            "worker 0 of 1: (info.id, info.num_workers) if info else (0, 1)."
        ) from None
    except TypeError as error:
        if "non-iterator" not in str(error):
            raise
        raise CheckFailed(
            f"{error}: make __iter__ a generator (yield each sample), so that samples flow one "
            "at a time."
        ) from None
    for item in items[:1]:
        if not (isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str)):
            raise CheckFailed(
                f"an item is {item!r:.60}, not a (key, label) pair: yield the pairs that "
                "read_samples gives."
            )
    return [tuple(item) for item in items]


def _check_workers_read_their_shards(stream_class, shards):
    """One rank, 3 forked workers: ``CheckFailed`` when a worker reads more than its share of the
    shards (a split of the samples, not the shards), counted through ``read_samples`` where the
    class finds it."""
    import os
    import sys
    import tempfile

    module = sys.modules.get(stream_class.__module__)
    read = getattr(module, "read_samples", None)
    if not callable(read):
        return
    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:

        def counted(shard):
            with open(log.name, "a") as file:
                file.write(f"{os.getpid()}\t{shard}\n")
            return read(shard)

        module.read_samples = counted
        try:
            _keys_by_rank(stream_class, shards, epoch=0, world_size=1)
        finally:
            module.read_samples = read
        per_worker = Counter(line.split("\t")[0] for line in set(log.read().splitlines()))
    count = len(list(shards))
    if per_worker and max(per_worker.values()) > -(-count // 3):
        raise CheckFailed(
            f"one rank, 3 workers: a worker read {max(per_worker.values())} of the {count} shards "
            "and kept only some of their samples. Every sample arrived once, but every worker "
            "read (over a network: downloaded) nearly every shard. Split the shard list between "
            "workers, not the samples."
        )


def check_shard_stream(stream_class, shards):
    """Lesson 4: ``stream_class(shards, rank, world_size, seed, buffer_size)``, an
    ``IterableDataset`` with ``set_epoch``, streams every sample exactly once per epoch across 2
    ranks × 3 workers, in a new order each epoch, shuffled within shards too."""
    from ..layout import expand_shards
    from ..shardread import count_shard_samples

    expected = sum(count_shard_samples(shard) for shard in expand_shards(shards))
    alone = _alone_keys(stream_class, shards)
    if sorted(alone) != sorted(set(alone)) or len(alone) != expected:
        raise CheckFailed(_alone_explained(alone, shards, expected))
    epochs = [_keys_by_rank(stream_class, shards, epoch) for epoch in (0, 1)]
    for epoch, per_rank in enumerate(epochs):
        reason = _duplicates_explained(per_rank, expected)
        if reason:
            raise CheckFailed(f"epoch {epoch}, 2 ranks × 3 workers: {reason}")
    if epochs[0] == epochs[1]:
        raise CheckFailed(
            "every rank got the same samples in the same order in epochs 0 and 1: mix the epoch "
            "from set_epoch into the seed of the shard shuffle, so that each epoch deals the "
            "shards anew."
        )
    if [set(keys) for keys in epochs[0]] == [set(keys) for keys in epochs[1]]:
        raise CheckFailed(
            "every rank got the same shards in epochs 0 and 1, only in a new order. Shuffle the "
            "whole shard list, with a seed that mixes in the epoch, before splitting it by rank "
            "and worker: a shuffle of each part after the split, or a shard shuffle whose seed "
            "lacks the epoch, deals every rank the same shards each epoch."
        )
    _check_workers_read_their_shards(stream_class, shards)
    together = _shard_neighbours(epochs[0][0], shards)
    if together > 0.5:
        raise CheckFailed(
            f"{together:.0%} of the samples arrived right after their neighbour in the shard: the "
            "shuffle buffer is not mixing. Fill it first, then yield a random one for each new "
            "sample."
        )
    _check_shards_mix(alone, shards)
    _check_stream_seeding(stream_class, shards, alone)
    passed(
        f"2 ranks × 3 workers streamed all {expected:,} samples exactly once per epoch, in a new "
        f"order each epoch, {together:.0%} of neighbours still together."
    )


# --- lesson 5: webdataset -------------------------------------------------------------------------


def _dataset_of(loader):
    """What a ``DataLoader`` (or a ``WebLoader`` around one) sends to each worker process;
    ``CheckFailed`` when it starts fewer than the 2 workers the task asks for."""
    from torch.utils.data import DataLoader

    inner = loader if isinstance(loader, DataLoader) else _inner_loader(loader)
    if inner.num_workers < 2:
        raise CheckFailed(
            f"make_loader's loader starts {inner.num_workers} worker(s); the task asks for 2 "
            "(num_workers=2): with workers, each must get shards of its own, which is what "
            "this exercise is about."
        )
    return inner.dataset


def _inner_loader(loader):
    """The ``DataLoader`` inside a ``WebLoader``."""
    from torch.utils.data import DataLoader

    inner = [stage for stage in getattr(loader, "pipeline", ()) if isinstance(stage, DataLoader)]
    if not inner:
        raise CheckFailed(
            f"make_loader returned a {type(loader).__name__}: return a wds.WebLoader (or a "
            "DataLoader) with 2 workers."
        )
    return inner[0]


def _check_pickles(dataset):
    """Spawn and forkserver workers receive ``dataset`` pickled: fail early, with the cure."""
    import pickle

    try:
        pickle.dumps(dataset)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise CheckFailed(
            f"the pipeline does not pickle ({error}): spawn and forkserver workers would fail. "
            "Use functions defined in a module, or operator.itemgetter/methodcaller, not lambdas."
        ) from None


def _batch_keys(batch):
    """The keys of one ``(keys, labels)`` batch; a sample, a dict or uncollated samples are named
    as what they are."""
    if isinstance(batch, Mapping):
        raise CheckFailed(
            f"the loader yielded a dict with {sorted(batch)[:4]}: pick the fields with "
            '.to_tuple("__key__", "cls"), then .batched(32).'
        )
    if isinstance(batch[0], str):
        raise CheckFailed(
            f"the loader yielded one sample, {tuple(batch)!r:.80}, not a batch: end the pipeline "
            "with .batched(32), so that workers hand over batches."
        )
    if not all(isinstance(key, str) for key in batch[0]) and all(
        isinstance(key, str) for key in batch[-1]
    ):
        raise CheckFailed(
            f"a batch starts with {batch[0]!r:.60} and ends with the keys: pick the key first, "
            '.to_tuple("__key__", "cls"), so that a batch is (keys, labels).'
        )
    if not all(isinstance(key, str) for key in batch[0]):
        raise CheckFailed(
            f"a batch starts with {batch[0]!r:.80}, not a list of keys: let .batched(32) collate "
            "the samples (no collation_fn), so that a batch is (keys, labels)."
        )
    return batch[0]


def _webdataset_keys(make_loader, shards, epoch, rank):
    """``(keys, shard shuffle)``: the keys rank ``rank`` of 2 gets from
    ``make_loader(shards, epoch)``, under the variables torchrun would set, and its pipeline's
    ``_shard_order``."""
    from ..torchrunenv import environment

    try:
        with environment(RANK=rank, WORLD_SIZE=2):  # reaches forkserver workers too
            loader = make_loader(shards, epoch)
            dataset = _dataset_of(loader)
            _check_pickles(dataset)
            batches, keys = iter(loader), []
            try:
                for batch in batches:
                    keys += _batch_keys(batch)
            finally:  # stop the workers here, not when a later check's fork collects the iterator
                _stop(batches)
            return keys, _shard_order(dataset)
    except ValueError as error:
        if "nodesplitter" in str(error):
            raise CheckFailed(
                "webdataset refused to run on rank 0 of 2: give it a nodesplitter "
                "(nodesplitter=wds.split_by_node)."
            ) from None
        raise


class _ShardOrder(NamedTuple):
    """What decides a webdataset pipeline's shard order (``_shard_order``)."""

    listed: tuple  # the shard list as given, and its own seed: (urls, seed)
    size: int  # the shard shuffle's size: 0 (or False) shuffles nothing
    seed: object  # the shard shuffle's seed (detshuffle's: seed and epoch)


def _shard_order(dataset):
    """What decides a webdataset pipeline's shard order, from the stages before the one that opens
    the shards: a ``_ShardOrder``; None when the
    pipeline is laid out otherwise. The shard list comes as given, reshuffled when
    ``SimpleShardList`` has a seed; the shuffle is ``WebDataset(shardshuffle=..., seed=...)``'s
    (a size of 0, False or none at all shuffles nothing; ``detshuffle`` seeds with its seed and
    epoch). A loader made anew for each epoch, as here, starts all of them afresh: the same list,
    seeds and epoch give the same shard order."""
    from webdataset import cache, filters

    stages = getattr(dataset, "pipeline", [])
    opens = [
        isinstance(stage, (cache.StreamingOpen, cache.FileCache))
        or getattr(getattr(stage, "f", None), "__name__", "") in ("tarfile_samples", "url_opener")
        for stage in stages
    ]
    if True not in opens:
        return None
    before = stages[: opens.index(True)]
    given = next((stage for stage in before if hasattr(stage, "urls")), None)
    if given is None:
        return None
    size, seed = 0, None
    for stage in before:
        if isinstance(stage, filters.detshuffle):
            size, seed = stage.bufsize, (stage.seed, stage.epoch)
        elif isinstance(stage, filters.FilterFunction) and stage.f is filters._shuffle:
            size = (stage.args or (stage.kw.get("bufsize", 1000),))[0]
            seed = stage.kw.get("seed")
    return _ShardOrder((list(given.urls), getattr(given, "seed", None)), size, seed)


def _stop(batches):
    """Stop the worker processes behind ``batches``, a ``WebLoader``'s generator or a
    ``DataLoader``'s iterator, even when it was not read to its end."""
    stop = getattr(batches, "close", None) or getattr(batches, "_shutdown_workers", None)
    if stop:
        stop()


def _webdataset_epoch_explained(epoch, per_rank, expected):
    """Why one epoch of 2 ranks did not deliver every sample once, in words, or None."""
    everyone = per_rank[0] + per_rank[1]
    twice_within = [rank for rank, keys in enumerate(per_rank) if len(keys) != len(set(keys))]
    if twice_within and len(set(everyone)) == expected:
        return (
            f"epoch {epoch}: within rank {twice_within[0]}, samples arrived more than once: each "
            "of its 2 workers read all of the rank's shards. Leave workersplitter at its default "
            "(wds.split_by_worker)."
        )
    if len(everyone) == 2 * expected and len(set(everyone)) == expected:
        return (
            f"epoch {epoch}: both ranks read every shard. nodesplitter=wds.split_by_node gives "
            "each rank its own."
        )
    if len(everyone) == len(set(everyone)) < expected:
        missing = expected - len(everyone)
        cause = (
            "Does each worker drop its last, short batch (partial=False)? .batched(32) keeps it. "
            "Or is the epoch cut short (with_epoch)?"
            if missing < min(2 * 2 * 32, expected // 2)  # at most a batch short in each worker
            else "Are the shards split by rank twice (a slice of your own, then "
            "split_by_node), or the epoch cut short (with_epoch)?"
        )
        return f"epoch {epoch}: {missing} of {expected} samples never arrived. {cause}"
    if len(everyone) != expected or len(set(everyone)) != expected:
        return (
            f"epoch {epoch}: {len(everyone)} samples arrived, {len(set(everyone))} distinct, of "
            f"{expected}: some came more than once and others never. Shards drawn with "
            "replacement (resampled=True) do that, and so does a worker split where the split by "
            "node belongs (nodesplitter=wds.split_by_node)."
        )
    return None


def check_webdataset_loader(make_loader, shards):
    """Lesson 5: ``make_loader(shards, epoch)`` returns a ``WebLoader`` of ``(keys, labels)``
    batches that, as 2 ranks, delivers every sample once per epoch, in a new shard order."""
    from ..layout import expand_shards
    from ..shardread import count_shard_samples

    expected = sum(count_shard_samples(shard) for shard in expand_shards(shards))
    runs = [[_webdataset_keys(make_loader, shards, e, rank) for rank in (0, 1)] for e in (0, 1)]
    epochs = [[keys for keys, _ in per_rank] for per_rank in runs]
    for epoch, per_rank in enumerate(epochs):
        reason = _webdataset_epoch_explained(epoch, per_rank, expected)
        if reason:
            raise CheckFailed(reason)
    orders = [per_rank[0][1] for per_rank in runs]  # rank 0's, epochs 0 and 1
    # the same list, with the same seed of its own (or none), in both epochs
    same_list = None not in orders and orders[0].listed == orders[1].listed
    if epochs[0] == epochs[1] or (same_list and not orders[0].size):
        raise CheckFailed(
            "the shards came in the same order in epochs 0 and 1: shuffle them "
            "(shardshuffle=len(shards); False or leaving it out keeps their order; a buffer of "
            "samples, .shuffle(n), mixes only neighbours) and seed that shuffle from the epoch (a "
            "new WebDataset per epoch, seed=epoch)."
        )
    if same_list and orders[0].seed is not None and orders[0].seed == orders[1].seed:
        raise CheckFailed(
            f"the shard order repeats every epoch: the shard shuffle is seeded {orders[0].seed!r} "
            "in epochs 0 and 1, so it draws the same order each time (a buffer of samples, "
            ".shuffle(n), mixes only neighbours, and so the samples' order changed). Seed the "
            "shard shuffle from the epoch: seed=epoch, or your own base seed plus the epoch."
        )
    passed(f"2 ranks read all {expected:,} samples once per epoch, in a new order each epoch.")


# --- lesson 3: per-worker file handles ------------------------------------------------------------

CHECK_WORKERS = 3


def _audit_or_explain(dataset, manifest, what, **loader_kwargs):
    """``handles.audit_reads`` with ``CHECK_WORKERS`` workers; a loader that fails (e.g. the dataset
    does not pickle, or a worker dies) becomes ``CheckFailed`` naming ``what`` ran. The learner's
    ``NotImplementedError`` passes through, with the stub's own message when a worker raised it
    (not the worker's traceback, at whose end the hint would come)."""
    import warnings

    from ..audit import audit_reads, expected_checksums

    try:
        with warnings.catch_warnings():
            # 3 workers on purpose
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            return audit_reads(
                dataset,
                expected_checksums(dataset, manifest),
                num_workers=CHECK_WORKERS,
                **loader_kwargs,
            )
    except NotImplementedError as error:
        if not str(error).startswith("Caught NotImplementedError"):  # raised in this process
            raise
        stub_line = str(error).strip().splitlines()[-1]  # the worker's traceback ends with it
        raise NotImplementedError(stub_line.removeprefix("NotImplementedError: ")) from None
    except Exception as error:
        raise CheckFailed(f"{what} failed: {type(error).__name__}: {error}") from error


def _first_error(audit):
    index, kind = next(iter(audit.errors.items()))
    return f"e.g. sample {index}: {kind}"


class _HandleShared:
    """A one-item dataset whose item says, where it is read, whether
    ``dataset._get_file_handle()`` returns ``handle``, and whether a second call returns the same
    handle as the first."""

    def __init__(self, dataset, handle):
        self.dataset, self.handle = dataset, handle

    def __len__(self):
        return 1

    def __getitem__(self, index):
        first = self.dataset._get_file_handle()
        return first is self.handle, self.dataset._get_file_handle() is first


def _forked_worker_handles(dataset, handle):
    """``(inherited, kept)``: whether a DataLoader worker forked now gets ``handle``, the main
    process's open one, from ``dataset._get_file_handle()``, and whether it gets the same one
    twice."""
    from torch.utils.data import DataLoader

    shared = _HandleShared(dataset, handle)
    loader = DataLoader(shared, batch_size=None, num_workers=1, multiprocessing_context="fork")
    try:
        return next(iter(loader))
    except NotImplementedError:
        raise
    except Exception as error:
        raise CheckFailed(
            f"_get_file_handle() failed in a forked DataLoader worker: {type(error).__name__}: "
            f"{error}"
        ) from error


def check_per_process_handle(dataset_class, archive, manifest):
    """Lesson 3: ``dataset_class(archive)._get_file_handle()`` is one ``ZipFile`` per process,
    reused within it."""
    import zipfile

    try:
        dataset = dataset_class(archive)
    except NotImplementedError:
        raise
    except Exception as error:
        raise CheckFailed(
            f"{dataset_class.__name__}(archive) failed: {type(error).__name__}: {error}. "
            "Building the dataset already reads the ZIP's manifest through "
            "self._get_file_handle().read(name), so your method runs first there: it must return "
            "a zipfile.ZipFile of self.archive, whose read(name) gives a member's bytes."
        ) from error
    handle = dataset._get_file_handle()
    if not isinstance(handle, zipfile.ZipFile):
        raise CheckFailed(
            f"_get_file_handle() returned a {type(handle).__name__}; it should return a "
            "zipfile.ZipFile of self.archive."
        )
    if dataset._get_file_handle() is not handle:
        raise CheckFailed(
            "Two calls in the same process returned two different ZipFiles: you open the archive "
            "(and "
            "read its central directory) for every sample. Keep the ZipFile in self and return the "
            "same one until os.getpid() changes."
        )
    inherited, kept = _forked_worker_handles(dataset, handle)
    if inherited:
        raise CheckFailed(
            "A forked worker got the main process's ZipFile back, still open: it would share the "
            "file offset with every other worker (a lock around each read would not help: each "
            "process's buffered file keeps its own idea of that offset). Whether a handle exists "
            "or is open does not tell processes apart; compare os.getpid() with the pid that "
            "opened it."
        )
    if not kept:
        raise CheckFailed(
            "In a forked worker, two calls returned two different ZipFiles: the worker opens the "
            "archive for every sample. Store the handle it opens, with os.getpid(), and return it "
            "while the pid is the same."
        )
    # from now on, any process that still reads through the main process's handle fails at once
    handle.close()
    audit = _audit_or_explain(
        dataset,
        manifest,
        f"A DataLoader with {CHECK_WORKERS} forked workers",
        multiprocessing_context="fork",
        batch_size=4,
    )
    if audit.errors:
        raise CheckFailed(
            f"{len(audit.errors)} of {audit.samples:,} samples failed in {CHECK_WORKERS} forked "
            "workers "
            f"({_first_error(audit)}). This check closed the main process's ZipFile before "
            "starting them, so a "
            "worker that reads through the handle it inherited fails instead of racing the others. "
            "Remember "
            "which process opened the handle (os.getpid()) and open a new one when the caller is "
            "another process."
        )
    if audit.wrong:
        raise CheckFailed(
            f"{len(audit.wrong)} samples came back with the wrong bytes, e.g. sample "
            f"{audit.wrong[0]}: "
            "read the member named self.paths[index] through this process's handle."
        )
    passed(
        f"one ZipFile per process: {CHECK_WORKERS} forked workers opened their own and read all "
        f"{audit.samples:,} samples right."
    )


def check_worker_init_fn(worker_init_fn, archive, manifest):
    """Lesson 3: ``worker_init_fn`` gives each forked worker's copy of a ``ZipDataset`` a
    ``ZipFile`` of its own."""
    from ..datasets import ZipDataset

    dataset = ZipDataset(archive)
    # a worker still reading through the main process's handle now fails at once
    dataset.zip_file.close()
    audit = _audit_or_explain(
        dataset,
        manifest,
        f"A DataLoader with {CHECK_WORKERS} forked workers and your worker_init_fn",
        multiprocessing_context="fork",
        batch_size=4,
        worker_init_fn=worker_init_fn,
    )
    if audit.errors:
        raise CheckFailed(
            f"{len(audit.errors)} of {audit.samples:,} samples failed ({_first_error(audit)}). "
            "This check closed the "
            "main process's ZipFile before the workers started, so a worker that still reads "
            "through it fails. Does your worker_init_fn give the dataset that this worker "
            "reads from (get_worker_info() knows it) a handle of its own, stored where "
            "read_member looks for it?"
        )
    if audit.wrong:
        raise CheckFailed(
            f"{len(audit.wrong)} samples came back with the wrong bytes, e.g. sample "
            f"{audit.wrong[0]}: "
            "open the same archive, dataset.archive, in each worker."
        )
    passed(
        f"each of {CHECK_WORKERS} forked workers read through a ZipFile of its own: all "
        f"{audit.samples:,} samples "
        "right."
    )


def _classes_named_by(blob):
    """``(module, name)`` of every global a pickle would import when loaded."""
    import contextlib
    import io
    import pickle

    names = []

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            names.append((module, name))
            return super().find_class(module, name)

    # a recipe whose call fails: its names came before the call, and the recipe check says why
    with contextlib.suppress(TypeError, ValueError):
        Recorder(io.BytesIO(blob)).load()
    return names


def _unchanged(image):
    """The transform ``check_spawn_ready`` builds a dataset with (a spawned worker imports it)."""
    return image


def _check_recipe_keeps_arguments(cls, archive):
    """A ``cls`` built with arguments other than the defaults comes back from its pickle with the
    same ``archive``, ``transform`` and ``decoder``: a recipe that drops or shifts one passes the
    audit (it reads bytes only) but decodes differently in every worker."""
    import pickle

    built = cls(archive, transform=_unchanged, decoder="torchvision")
    order = "in ZipDataset's order (archive, transform, decoder)"
    try:
        copy = pickle.loads(pickle.dumps(built))
    except (TypeError, ValueError) as error:  # e.g. the decoder where the transform goes
        raise CheckFailed(
            f"{cls.__name__}(archive, transform={_unchanged.__name__}, decoder='torchvision') "
            f"could not be rebuilt from its pickle: {type(error).__name__}: {error}. The recipe "
            f"must give the three arguments {order}."
        ) from None
    for name in ("archive", "transform", "decoder"):
        got, expected = getattr(copy, name, None), getattr(built, name)
        if got != expected:
            raise CheckFailed(
                f"{cls.__name__}(archive, transform={_unchanged.__name__}, "
                f"decoder='torchvision') comes back from its pickle with {name}={got!r}, not "
                f"{expected!r}: the recipe must rebuild the dataset with all three arguments, "
                f"{order}."
            )


def check_spawn_ready(dataset, manifest):
    """Lesson 3: ``dataset`` (a ``ZipDataset`` that has been read from) pickles for ``spawn``, and
    ``CHECK_WORKERS`` spawned workers read every sample right."""
    import pickle

    dataset.read_bytes(0)  # used once: its handle is open, as it is after a first look at the data
    try:
        blob = pickle.dumps(dataset)
    except NotImplementedError:
        raise
    except Exception as error:
        if UNPICKLABLE_HANDLE.search(str(error)):
            raise CheckFailed(
                f"pickle.dumps(dataset) failed: {type(error).__name__}: {error}. A spawned worker "
                "receives the "
                "dataset pickled, and an open handle (a ZipFile's file and lock, a memory map "
                "(mmap), a socket) cannot be pickled. "
                "Pickle a recipe "
                "instead: __reduce__ returns a class and the arguments to build the dataset again, "
                "e.g. the archive "
                "path."
            ) from error
        raise CheckFailed(
            f"pickle.dumps(dataset) failed: {type(error).__name__}: {error}. __reduce__ must "
            "return a tuple of two "
            "things: the class to call, then a tuple of the arguments to call it with, such as "
            "(SomeClass, (path,)) "
            "(the comma makes a one-item tuple)."
        ) from error
    from_notebook = [
        f"{module}.{name}" for module, name in _classes_named_by(blob) if module == "__main__"
    ]
    if from_notebook:
        raise CheckFailed(
            f"The pickle names {from_notebook[0]}, defined in this notebook. A spawned worker is a "
            "fresh Python: it "
            "imports what the pickle names, and it cannot import a notebook. Rebuild with a class "
            "that lives in a "
            "module, such as packdata.datasets.ZipDataset."
        )
    _check_recipe_keeps_arguments(type(dataset), dataset.archive)
    audit = _audit_or_explain(
        dataset,
        manifest,
        f"A DataLoader with {CHECK_WORKERS} spawned workers",
        multiprocessing_context="spawn",
        batch_size=64,
    )
    if audit.corrupted:
        raise CheckFailed(
            f"{audit.corrupted} of {audit.samples:,} samples did not arrive intact in the spawned "
            f"workers ({audit}); rebuild the dataset from the same archive, with the same "
            "arguments."
        )
    passed(
        f"the dataset pickles to {len(blob):,} bytes with no open file inside; {CHECK_WORKERS} "
        "spawned workers "
        f"rebuilt it and read all {audit.samples:,} samples right."
    )
