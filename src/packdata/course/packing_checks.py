"""Checks of lesson 2: a folder packed into a ZIP, a ``Dataset`` that reads the ZIP, and an index
of a tar's members.
"""

import re
import time

from .. import imagefolder
from .feedback import (
    CheckFailed,
    passed,
)
from .folder_checks import compare_with_reference


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
        if not zipfile.is_zipfile(first) and _members_without_directory(first):
            raise CheckFailed(
                f"pack_zip wrote {first.name} with members but no central directory, the ZIP's "
                "table of contents: the ZipFile was never closed, and closing it is what writes "
                'the directory. Write the members in a block, with zipfile.ZipFile(archive, "w") '
                "as z:, which closes the archive at its end."
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


def _members_without_directory(path):
    """Whether the file at ``path`` starts as a ZIP does, with a member's local header, yet holds
    no end-of-central-directory record: what a ``ZipFile`` left open writes."""
    data = path.read_bytes()
    return data.startswith(b"PK\x03\x04") and b"PK\x05\x06" not in data


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


def _whole_blocks_tar(folder):
    """A tar whose members are 512 and 1,024 bytes long, of data that is not zeros: no padding
    to get wrong, and no all-zero block but those at its end."""
    from pathlib import Path

    from ..shardwrite import write_tar

    members = [("block", {"bin": b"x" * 512}), ("two", {"bin": b"x" * 1024})]
    return write_tar(Path(folder) / "whole-blocks.tar", members).path


# what int() says of a field of NULs or spaces only, stripped: "... with base 8: b''"
EMPTY_FIELD = re.compile(r"base \d+: b?''$")


def _walk_mistake(tar_index, error):
    """What a ``ValueError`` from ``tar_index`` says about the walk: the size field parsed with its
    NUL, or in decimal; a walk that read on past the end; else a position off by its padding."""
    import tempfile

    if "\\x00" in str(error):  # int(b"00000000012\0", 8): the field's NUL kept
        return "The size field ends in a NUL (or a space): strip b'\\0 ' before int(field, 8)."
    if "with base 10" in str(error):  # int(field): 1,000 bytes, 0o1750, read as 1,750
        return (
            "The size field is an octal number written in ASCII: int(field.strip(b'\\0 '), 8). "
            "Read in base 10 it is too large, and the walk lands inside a member's data."
        )
    with tempfile.TemporaryDirectory() as folder:
        try:
            tar_index(_whole_blocks_tar(folder))
        except ValueError as again:
            if EMPTY_FIELD.search(str(again)):  # no padding there: it read the zeros at the end
                return (
                    "You read past the end: a tar ends with an all-zero block "
                    "(block == bytes(512)); stop there, before reading it as a header."
                )
    return (
        "Past the first header, that means it read a header where there is data or padding: "
        f"{PADDING_RULE}."
    )


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
        raise CheckFailed(
            f"on {what}, tar_index raised ValueError: {error}. {_walk_mistake(tar_index, error)}"
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
