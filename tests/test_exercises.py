"""Exercises are generated from solutions (one source), and every check tells right from wrong."""

import importlib
import inspect
import json
import math
import multiprocessing
import os
import random
import re
import tarfile
import zipfile
from collections import Counter
from operator import methodcaller
from pathlib import Path

import boto3
import jupytext
import numpy as np
import pytest
import torch
import webdataset as wds
from botocore.config import Config
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info

from packdata import costmodel, imagefolder, packing, s3, tarindex
from packdata.course import (
    exercises,
    feedback,
    folder_checks,
    handle_checks,
    packing_checks,
    s3_checks,
    shard_checks,
    sizing_checks,
    torchrun_checks,
    webdataset_checks,
)
from packdata.datasets import FolderDataset, ZipDataset

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS, EXERCISES = ROOT / "solutions", ROOT / "exercises"

SOLUTION = '''\
def area(width, height):
    """Area of a rectangle."""
    ### HINT: multiply the two sides
    ### BEGIN SOLUTION
    return width * height
    ### END SOLUTION

print(area(2, 3))'''


def test_committed_exercises_are_in_sync_with_solutions():
    assert exercises.check_exercises(SOLUTIONS, EXERCISES) == [], "run 'make exercises'"


def test_every_solution_has_an_exercise_and_vice_versa():
    def names(folder):
        return sorted(p.name for p in exercises.solution_files(folder))

    assert names(SOLUTIONS) == names(EXERCISES) != []


def test_region_becomes_a_stub_with_the_hint():
    source, regions = exercises.strip_solutions(SOLUTION)
    assert regions == 1
    assert "return width * height" not in source
    assert "###" not in source
    assert (
        "    raise NotImplementedError('Your turn! Hint: multiply the two sides')"
        in source.splitlines()
    )
    assert source.endswith("print(area(2, 3))")


def test_stub_raises_not_implemented_with_the_hint():
    namespace = {}
    exec(exercises.strip_solutions(SOLUTION)[0].replace("print(area(2, 3))", ""), namespace)
    with pytest.raises(NotImplementedError, match="multiply the two sides"):
        namespace["area"](2, 3)


def test_a_long_hint_goes_over_lines_that_fit_a_slide():
    hint = "a hint " * 40 + "that ends here"
    source, _ = exercises.strip_solutions(
        f"def f():\n    ### HINT: {hint}\n    ### BEGIN SOLUTION\n    x = 1\n    ### END SOLUTION"
    )
    assert max(map(len, source.splitlines())) <= exercises.STUB_COLUMNS
    namespace = {}
    exec(source, namespace)
    with pytest.raises(NotImplementedError) as raised:
        namespace["f"]()
    assert str(raised.value) == f"Your turn! Hint: {hint}"


def test_hint_with_quotes_stays_valid_python():
    source, _ = exercises.strip_solutions(
        "### HINT: use \"bytes\" and 'str'\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION"
    )
    compile(source, "cell", "exec")


@pytest.mark.parametrize(
    "bad, message",
    [
        ("### BEGIN SOLUTION\nx = 1", "without ### END"),
        ("x = 1\n### END SOLUTION", "without ### BEGIN"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "nested"),
        ("### HINT: orphan\nx = 1", "right before"),
    ],
)
def test_unpaired_markers_are_reported_with_their_line(bad, message):
    with pytest.raises(exercises.ExerciseSourceError, match=message):
        exercises.strip_solutions(bad)


def test_generated_exercise_tags_stubs_and_drops_solution_only_cells(tmp_path):
    text = (
        "# Sheet\n\n```python\n" + SOLUTION + "\n```\n\n"
        '<!-- #region tags=["solution-only"] -->\nThe answer is width times height.\n<!-- '
        "#endregion -->\n"
    )
    (tmp_path / "01_demo.md").write_text(text)
    generated = jupytext.reads(exercises.exercise_text(tmp_path / "01_demo.md"), fmt="md")
    code = [c for c in generated.cells if c.cell_type == "code"]
    assert code[0].metadata["tags"] == ["raises-exception"]
    assert not any("width times height" in c.source for c in generated.cells)


def test_solution_without_any_region_is_refused(tmp_path):
    (tmp_path / "01_empty.md").write_text("# Nothing to do\n\n```python\nx = 1\n```\n")
    with pytest.raises(exercises.ExerciseSourceError, match="nothing to exercise"):
        exercises.exercise_text(tmp_path / "01_empty.md")


def test_drift_is_detected(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "01_demo.md").write_text("```python\n" + SOLUTION + "\n```\n")
    exercises.write_exercises(tmp_path / "s", tmp_path / "e")
    assert exercises.check_exercises(tmp_path / "s", tmp_path / "e") == []
    (tmp_path / "e" / "01_demo.md").write_text("edited by hand")
    (tmp_path / "e" / "02_orphan.md").write_text("no solution behind me")
    assert [p.name for p in exercises.check_exercises(tmp_path / "s", tmp_path / "e")] == [
        "01_demo.md",
        "02_orphan.md",
    ]


@pytest.mark.parametrize("path", sorted(EXERCISES.glob("[0-9][0-9]_*.md")), ids=lambda p: p.name)
def test_exactly_the_stub_cells_expect_an_exception(path):
    """nbval accepts a tagged cell whether or not it raises, so the stub itself is checked here."""
    for cell in jupytext.read(path).cells:
        tagged = "raises-exception" in cell.metadata.get("tags", [])
        assert tagged == ("raise NotImplementedError(" in cell.source), cell.source


# --- every check_* fails on a stub and on a wrong answer, and passes on a right one -------------


def stub(*args, **kwargs):
    raise NotImplementedError("Your turn!")


def count_per_class_right(root):
    return {d.name: len(list(d.glob("*.jpg"))) for d in Path(root).iterdir() if d.is_dir()}


class StubDataset(FolderDataset):
    __getitem__ = stub


class ShiftedLabels(FolderDataset):
    def __getitem__(self, index):
        image, label = super().__getitem__(index)
        return image, (label + 1) % len(self.classes)


class WrongFile(FolderDataset):
    def __getitem__(self, index):
        return super().__getitem__((index + 1) % len(self))


class PilImages(FolderDataset):
    def __getitem__(self, index):
        return Image.open(Path(self.root) / self.paths[index]), self.labels[index]


def predict_right(n, mean_bytes, latency, bandwidth, workers):
    return costmodel.predict_time(
        n, n * mean_bytes, latency, workers * bandwidth, concurrency=workers
    )


def predict_with_a_shared_link(n, mean_bytes, latency, bandwidth, workers):
    return costmodel.predict_time(n, n * mean_bytes, latency, bandwidth, concurrency=workers)


def archive(root, kind):
    """The tiny dataset packed as a ZIP or tar next to it (packed once per session)."""
    path = Path(root).parent / f"{Path(root).name}.{kind}"
    if not path.exists():
        (packing.pack_zip if kind == "zip" else packing.pack_tar)(root, path, progress=False)
    return path


def pack_zip_right(
    root, target, compression=zipfile.ZIP_STORED, labels=True, stamp=lambda name: name
):
    samples = imagefolder.load_manifest(root)["samples"]
    with zipfile.ZipFile(target, "w", compression) as z:
        for s in samples:
            z.writestr(stamp(f"{s['key']}.jpg"), (Path(root) / s["path"]).read_bytes())
        if labels:
            z.writestr(stamp("labels.json"), json.dumps({s["key"]: s["label"] for s in samples}))


def pack_with_labels(root, target, labels_json):
    """The JPEGs of ``root`` in a ZIP, with ``labels_json(samples)`` as its labels.json."""
    samples = imagefolder.load_manifest(root)["samples"]
    with zipfile.ZipFile(target, "w") as z:
        for s in samples:
            z.writestr(fixed_time(f"{s['key']}.jpg"), (Path(root) / s["path"]).read_bytes())
        z.writestr(fixed_time("labels.json"), json.dumps(labels_json(samples)))


def pack_with_file_times(root, target):
    """zipfile's write(path, name): each member stamped with its file's modification time."""
    samples = imagefolder.load_manifest(root)["samples"]
    with zipfile.ZipFile(target, "w") as z:
        for s in samples:
            z.write(Path(root) / s["path"], f"{s['key']}.jpg")
        z.writestr(fixed_time("labels.json"), json.dumps({s["key"]: s["label"] for s in samples}))


def pack_in_reverse(root, target):
    samples = imagefolder.load_manifest(root)["samples"][::-1]
    with zipfile.ZipFile(target, "w") as z:
        for s in samples:
            z.writestr(fixed_time(f"{s['key']}.jpg"), (Path(root) / s["path"]).read_bytes())
        z.writestr(fixed_time("labels.json"), json.dumps({s["key"]: s["label"] for s in samples}))


def pack_labels_as_a_list(root, target):
    pack_with_labels(root, target, lambda samples: [s["label"] for s in samples])


def pack_labels_as_floats(root, target):
    pack_with_labels(root, target, lambda samples: {s["key"]: float(s["label"]) for s in samples})


def pack_labels_as_text(root, target):
    pack_with_labels(root, target, lambda samples: {s["key"]: str(s["label"]) for s in samples})


def pack_labels_by_path(root, target):
    pack_with_labels(root, target, lambda samples: {s["path"]: s["label"] for s in samples})


def fixed_time(name):
    return zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))


class ZipLabelsOffByOne(ZipDataset):
    def __getitem__(self, index):
        image, label = super().__getitem__(index)
        return image, label + 1


class StubZipDataset(ZipDataset):
    __getitem__ = stub


def tar_index_right(path):
    with open(path, "rb") as file:
        return tarindex.index_members(file)


def tar_index_with_padded_names(path):
    return {name.ljust(100, "\0"): place for name, place in tar_index_right(path).items()}


def tar_index_with_bytes_names(path):
    return {name.encode(): place for name, place in tar_index_right(path).items()}


def walked_tar_index(padding, base=8, end=bytes(512)):
    """A learner's walk over the headers, skipping ``padding(size)`` bytes after each member,
    reading the size field in ``base`` and stopping at a short block or at ``end``."""

    def tar_index(path):
        index, position = {}, 0
        with open(path, "rb") as file:
            while True:
                file.seek(position)
                block = file.read(512)
                if len(block) < 512 or block == end:
                    return index
                size = int(block[124:136].strip(b"\0 "), base)
                index[block[:100].rstrip(b"\0").decode()] = (position + 512, size)
                position += 512 + padding(size)

    return tar_index


class ZipOpenedPerSample(ZipDataset):
    def read_member(self, name):
        with zipfile.ZipFile(self.archive) as archive:
            return archive.read(name)


def tar_index_keeping_the_nul(path):
    with open(path, "rb") as file:
        return {"first": (512, int(file.read(512)[124:136], 8))}


class ZipOpenedLazily(ZipDataset):
    """Opens the archive on its first sample, once: right."""

    def __init__(self, archive):
        super().__init__(archive)
        self.zip_file.close()
        self.zip_file = None

    def read_member(self, name):
        if self.zip_file is None:
            self.zip_file = zipfile.ZipFile(self.archive)
        return self.zip_file.read(name)


def test_a_zip_file_never_closed_is_named(tiny_dataset):
    left_open = []

    def pack_left_open(root, target):
        """Every member written, but the ZipFile outlives the call (kept, as a global would be)."""
        archive = zipfile.ZipFile(target, "w")
        left_open.append(archive)
        for s in imagefolder.load_manifest(root)["samples"]:
            archive.writestr(fixed_time(f"{s['key']}.jpg"), (Path(root) / s["path"]).read_bytes())

    try:
        with pytest.raises(feedback.CheckFailed, match="no central directory.* never closed"):
            packing_checks.check_pack_zip(pack_left_open, tiny_dataset)
    finally:
        for archive in left_open:
            archive.close()


def test_a_zip_dataset_that_opens_its_archive_lazily_passes(tiny_dataset, capsys):
    path = archive(tiny_dataset, "zip")
    packing_checks.check_zip_dataset(ZipOpenedLazily(path), path)
    assert capsys.readouterr().out.startswith("✓")


class SwappedPair(FolderDataset):
    def __getitem__(self, index):
        image, label = super().__getitem__(index)
        return label, image


def relabelled(dataset_class, convert):
    """``dataset_class`` whose labels come out through ``convert``."""

    class Relabelled(dataset_class):
        def __getitem__(self, index):
            image, label = super().__getitem__(index)
            return image, convert(label)

    return Relabelled


TextLabels = relabelled(FolderDataset, str)
FloatLabels = relabelled(FolderDataset, float)
FloatTensorLabels = relabelled(
    FolderDataset, lambda label: torch.tensor(label, dtype=torch.float32)
)
TensorLabels = relabelled(FolderDataset, torch.tensor)
ZipFloatLabels = relabelled(ZipDataset, float)


class OneBefore(FolderDataset):
    """``self.samples[index - 1]``: sample 0 reads the last one."""

    def __getitem__(self, index):
        return super().__getitem__(index - 1)


class ImageOneAfter(FolderDataset):
    """The image of the next sample with this sample's label."""

    def __getitem__(self, index):
        return super().__getitem__((index + 1) % len(self))[0], self.labels[index]


def test_a_dataset_one_off_is_named_with_the_sample_it_read(tiny_dataset):
    with pytest.raises(feedback.CheckFailed, match=r"dataset\[0\] is sample 59 of the manifest"):
        folder_checks.check_folder_dataset(OneBefore(tiny_dataset), tiny_dataset)
    with pytest.raises(feedback.CheckFailed, match=r"dataset\[0\] is sample 1 .*, one off"):
        folder_checks.check_folder_dataset(ImageOneAfter(tiny_dataset), tiny_dataset)


# name: (how to call the check with an implementation and the dataset root, right answer, wrong
# answers)
CASES = {
    "check_count_per_class": (
        lambda check, impl, root: check(impl, root),
        count_per_class_right,
        [lambda root: {**count_per_class_right(root), "manifest.json": 1}, lambda root: 42],
    ),
    "check_folder_dataset": (
        lambda check, impl, root: check(impl(root), root),
        FolderDataset,
        [ShiftedLabels, WrongFile, PilImages],
    ),
    "check_predict_epoch_seconds": (
        lambda check, impl, root: check(impl),
        predict_right,
        [
            lambda n, b, lat, bw, w: n * lat / w,
            lambda n, b, lat, bw, w: n * lat + n * b / bw,
            predict_with_a_shared_link,
        ],
    ),
    "check_workers_needed": (
        lambda check, impl, root: check(impl),
        costmodel.workers_needed,
        [lambda t, lat, s: t * (lat + s), lambda t, lat, s: int(t * (lat + s))],
    ),
    "check_pack_zip": (
        lambda check, impl, root: check(impl, root),
        lambda root, target: pack_zip_right(root, target, stamp=fixed_time),
        [
            lambda root, target: pack_zip_right(
                root, target, zipfile.ZIP_DEFLATED
            ),  # str names take this
            lambda root, target: pack_zip_right(root, target, labels=False, stamp=fixed_time),
            pack_zip_right,  # members stamped with the clock: two packs differ
        ],
    ),
    "check_zip_dataset": (
        lambda check, impl, root: check(impl(archive(root, "zip")), archive(root, "zip")),
        ZipDataset,
        [ZipLabelsOffByOne],
    ),
    "check_tar_index": (
        lambda check, impl, root: check(impl, archive(root, "tar")),
        tar_index_right,
        [
            lambda path: {
                name: (offset - 512, size) for name, (offset, size) in tar_index_right(path).items()
            },
            lambda path: {
                name: (offset, size + 1) for name, (offset, size) in tar_index_right(path).items()
            },
            lambda path: dict(list(tar_index_right(path).items())[:-1]),
            tar_index_with_padded_names,
        ],
    ),
}
STUBS = {"check_folder_dataset": StubDataset, "check_zip_dataset": StubZipDataset}


# --- lesson 4 -------------------------------------------------------------------------------------


def tiny_shards(root):
    """The tiny dataset as 8 shards next to it (written once per session)."""
    from packdata.shardwrite import write_shards

    folder = Path(root).parent / f"{Path(root).name}-shards"
    if not folder.exists():
        write_shards(root, folder, maxcount=8, progress=False)
    return sorted(str(path) for path in folder.glob("train-*.tar"))


def buffer_right(samples, size, rng):
    from packdata.streaming import shuffle_buffer

    return shuffle_buffer(samples, size, rng)


def shuffled(rest, rng):
    rng.shuffle(rest)
    return rest


def mistaken_buffer(
    drain=shuffled,
    pick=lambda rng, size: rng.randrange(size),
    beside=False,
    kept=False,
    replaced_first=False,
):
    """A learner's shuffle buffer, right but for what is given: what is left goes out through
    ``drain(rest, rng)``, the sample to yield is at ``pick(rng, size)``, with ``beside`` the
    newcomer goes beside it instead of into its place, with ``kept`` one buffer serves every
    call (as a ``buffer=[]`` default would), and with ``replaced_first`` the newcomer takes its
    place before it is yielded."""
    every_call = []

    def buffer_fn(samples, size, rng):
        buffer = every_call if kept else []
        for sample in samples:
            if len(buffer) < size:
                buffer.append(sample)
                continue
            index = pick(rng, size)
            if replaced_first:
                buffer[index] = sample
            yield buffer[index]
            if beside:
                buffer.append(sample)
            else:
                buffer[index] = sample
        yield from drain(buffer, rng)

    return buffer_fn


buffer_without_drain = mistaken_buffer(drain=lambda rest, rng: ())  # what is left is lost
# what is left comes out in the order it went in, or reversed
buffer_with_unshuffled_drain = mistaken_buffer(drain=lambda rest, rng: rest)
buffer_with_a_reversed_drain = mistaken_buffer(drain=lambda rest, rng: reversed(rest))
buffer_past_its_end = mistaken_buffer(pick=lambda rng, size: rng.randint(0, size))
buffer_never_picking_its_last_slot = mistaken_buffer(pick=lambda rng, size: rng.randrange(size - 1))
buffer_beside_the_newcomer = mistaken_buffer(beside=True)
buffer_replacing_before_yielding = mistaken_buffer(replaced_first=True)


def buffer_first_in_first_out(samples, size, rng):
    buffer = []
    for sample in samples:
        buffer.append(sample)
        if len(buffer) > size:
            yield buffer.pop(0)
    rng.shuffle(buffer)
    yield from buffer


def buffer_that_yields_at_once(samples, size, rng):
    buffer = []
    for sample in samples:
        buffer.append(sample)
        yield buffer.pop(rng.randrange(len(buffer)))
    yield from buffer


def buffer_with_its_own_random(samples, size, rng):
    import random

    return buffer_right(samples, size, random.Random())


def buffer_with_a_fixed_generator(samples, size, rng):
    import random

    return buffer_right(samples, size, random.Random(0))


def split_after_a_shuffle(shards, rank, world_size, worker, workers):
    shards = list(shards)
    random.shuffle(shards)
    return shards[rank::world_size][worker::workers]


def split_by_shard_number(shards, rank, world_size, worker, workers):
    me, every = rank * workers + worker, world_size * workers
    return [shard for shard in shards if int(shard[-10:-4]) % every == me]


def split_in_chunks(shards, rank, world_size, worker, workers):
    parts, me = world_size * workers, rank * workers + worker
    per = len(shards) // parts
    return list(shards)[me * per : (me + 1) * per]


def split_in_place(shards, rank, world_size, worker, workers):
    shards.reverse()
    shards.reverse()
    shards.append(shards.pop(0))
    return shards[rank::world_size][worker::workers]


def buffer_by_blocks(samples, size, rng):
    buffer = []
    for sample in samples:
        buffer.append(sample)
        if len(buffer) == size:
            rng.shuffle(buffer)
            yield from buffer
            buffer = []
    rng.shuffle(buffer)
    yield from buffer


CASES.update(
    {
        "check_shard_split": (
            lambda check, impl, root: check(impl, tiny_shards(root)),
            lambda shards, rank, world_size, worker, workers: list(shards)[rank::world_size][
                worker::workers
            ],
            [
                lambda shards, rank, world_size, worker, workers: list(shards)[worker::workers],
                lambda shards, rank, world_size, worker, workers: list(shards)[rank::world_size],
                lambda shards, rank, world_size, worker, workers: list(shards)[
                    rank * workers + worker :: world_size * workers
                ][:1],
            ],
        ),
        "check_shuffle_buffer": (
            lambda check, impl, root: check(impl, tiny_shards(root)),
            buffer_right,
            [
                lambda samples, size, rng: iter(samples),
                buffer_without_drain,
                buffer_with_unshuffled_drain,
                buffer_that_yields_at_once,
                buffer_with_its_own_random,
            ],
        ),
    }
)


def cut(keys, per_shard):
    return [list(keys[start : start + per_shard]) for start in range(0, len(keys), per_shard)]


def assign_right(keys, per_shard, seed):
    order = np.random.default_rng(seed).permutation(len(keys))
    return cut([keys[index] for index in order], per_shard)


def assign_in_key_order(keys, per_shard, seed):
    return cut(keys, per_shard)


def assign_shuffled_inside_each_shard(keys, per_shard, seed):
    rng = random.Random(seed)
    return [rng.sample(shard, len(shard)) for shard in cut(keys, per_shard)]


def assign_shuffled_in_place(keys, per_shard, seed):
    random.Random(seed).shuffle(keys)
    return cut(keys, per_shard)


def assign_with_the_global_seed(keys, per_shard, seed):
    random.seed(seed)
    return cut(random.sample(keys, len(keys)), per_shard)


def assign_unseeded(keys, per_shard, seed):
    return assign_right(keys, per_shard, None)


def assign_ignoring_the_seed(keys, per_shard, seed):
    return assign_right(keys, per_shard, 0)


def assign_full_shards_only(keys, per_shard, seed):
    return [shard for shard in assign_right(keys, per_shard, seed) if len(shard) == per_shard]


def assign_overlapping(keys, per_shard, seed):
    shuffled = [key for shard in assign_right(keys, len(keys), seed) for key in shard]
    return [shuffled[start : start + per_shard + 1] for start in range(0, len(keys), per_shard)]


def assign_sorted_within(keys, per_shard, seed):
    return [sorted(shard) for shard in assign_right(keys, per_shard, seed)]


def assign_round_robin(keys, per_shard, seed):
    count = -(-len(keys) // per_shard)
    return [list(keys[index::count]) for index in range(count)]


def assign_with_torch_seed(keys, per_shard, seed):
    torch.manual_seed(seed)
    return cut([keys[index] for index in torch.randperm(len(keys)).tolist()], per_shard)


def assign_with_replacement(keys, per_shard, seed):
    drawn = np.random.default_rng(seed).choice(len(keys), len(keys))
    return cut([keys[index] for index in drawn], per_shard)


def assign_by_str_hash(keys, per_shard, seed):  # whole in itself: a fresh process runs it
    order = sorted(keys, key=lambda key: hash((seed, key)))
    return [order[start : start + per_shard] for start in range(0, len(order), per_shard)]


def assign_one_short(keys, per_shard, seed):
    shuffled = [key for shard in assign_right(keys, len(keys), seed) for key in shard]
    return [shuffled[start : start + per_shard - 1] for start in range(0, len(keys), per_shard)]


ASSIGN_MISTAKES = {
    assign_in_key_order: "you cut the keys in the order given",
    assign_shuffled_inside_each_shard: "you shuffled inside each shard",
    assign_shuffled_in_place: "reordered the list it was given",
    assign_with_the_global_seed: "global random generator",
    assign_unseeded: "gave other shards when called again with the same seed",
    assign_ignoring_the_seed: "the seed must choose the shuffle",
    assign_full_shards_only: "24 of 600 keys are in no shard",
    assign_overlapping: "would come twice an epoch",
    assign_sorted_within: "Keep the shuffled order within each shard",
    assign_round_robin: "Keep the shuffled order within each shard",
    assign_with_torch_seed: "torch.manual_seed",
    assign_with_replacement: "drawing with replacement",
    assign_one_short: "look at where each slice starts and ends",
    assign_by_str_hash: "cut other shards in another Python process",
}


@pytest.mark.parametrize(
    "wrong", list(ASSIGN_MISTAKES), ids=[wrong.__name__ for wrong in ASSIGN_MISTAKES]
)
def test_each_shard_assignment_mistake_is_named(wrong, tiny_dataset):
    with pytest.raises(feedback.CheckFailed, match=ASSIGN_MISTAKES[wrong]):
        shard_checks.check_assign_shards(wrong, tiny_dataset)


def test_a_numpy_key_is_shown_as_the_str_it_holds(tiny_dataset):
    def assign_numpy_keys_with_replacement(keys, per_shard, seed):
        return cut(list(np.random.default_rng(seed).choice(keys, len(keys))), per_shard)

    with pytest.raises(feedback.CheckFailed, match=r"key '\d{6}' is") as failed:
        shard_checks.check_assign_shards(assign_numpy_keys_with_replacement, tiny_dataset)
    assert "np.str_" not in str(failed.value)


CASES.update(
    {
        "check_assign_shards": (
            lambda check, impl, root: check(impl, root),
            assign_right,
            [assign_in_key_order, assign_unseeded, assign_full_shards_only],
        ),
    }
)


# --- lesson 6 -------------------------------------------------------------------------------------


def samples_per_shard_right(latency, bandwidth, mean_bytes, efficiency):
    return math.ceil(costmodel.size_for_efficiency(latency, bandwidth, efficiency) / mean_bytes)


def test_a_numpy_integer_is_a_whole_number_of_samples(capsys):
    sizing_checks.check_samples_per_shard(
        lambda lat, bw, b, e: np.int64(samples_per_shard_right(lat, bw, b, e))
    )
    assert capsys.readouterr().out.startswith("✓")


def stage_or_stream_right(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch, size):
    if size > scratch:
        return "stream"
    return "stage" if copy_s + epochs * local_epoch_s < epochs * remote_epoch_s else "stream"


def stage_without_the_copy(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch, size):
    return stage_or_stream_right(0, remote_epoch_s, local_epoch_s, epochs, scratch, size)


def stage_whenever_it_fits(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch, size):
    return "stage" if size <= scratch else "stream"


def stage_for_one_epoch(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch, size):
    return stage_or_stream_right(copy_s, remote_epoch_s, local_epoch_s, 1, scratch, size)


def stage_even_when_it_does_not_fit(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch, size):
    return stage_or_stream_right(copy_s, remote_epoch_s, local_epoch_s, epochs, size, size)


def stage_or_stream_swapped(*case):
    return {"stage": "stream", "stream": "stage"}[stage_or_stream_right(*case)]


def stage_as_a_bool(*case):
    return stage_or_stream_right(*case) == "stage"


def stage_on_a_tie(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch, size):
    if size > scratch:
        return "stream"
    return "stage" if copy_s + epochs * local_epoch_s <= epochs * remote_epoch_s else "stream"


def stage_with_the_copy_as_an_epoch(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch, size):
    if size > scratch:
        return "stream"
    staged = copy_s + (epochs - 1) * local_epoch_s
    return "stage" if staged < epochs * remote_epoch_s else "stream"


def stage_past_the_break_even(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch, size):
    if size > scratch or remote_epoch_s == local_epoch_s:
        return "stream"
    return "stage" if epochs > copy_s / (remote_epoch_s - local_epoch_s) else "stream"


def stage_from_the_break_even(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch, size):
    if size > scratch or remote_epoch_s == local_epoch_s:
        return "stream"
    return "stage" if epochs >= copy_s / (remote_epoch_s - local_epoch_s) else "stream"


def stream_when_it_just_fits(*case):
    *_, scratch, size = case
    return "stream" if size >= scratch else stage_or_stream_right(*case)


def full_steps_right(samples_per_worker, batch_size):
    return min(sum(n // batch_size for n in rank) for rank in samples_per_worker)


def full_steps_of_the_largest_rank(samples_per_worker, batch_size):
    return max(sum(n // batch_size for n in rank) for rank in samples_per_worker)


def full_steps_of_rank_0(samples_per_worker, batch_size):
    return sum(n // batch_size for n in samples_per_worker[0])


def full_steps_pooled_per_rank(samples_per_worker, batch_size):
    return min(sum(rank) // batch_size for rank in samples_per_worker)


def full_steps_with_short_batches(samples_per_worker, batch_size):
    return min(sum(math.ceil(n / batch_size) for n in rank) for rank in samples_per_worker)


def full_steps_shared_out(samples_per_worker, batch_size):
    return sum(map(sum, samples_per_worker)) // (batch_size * len(samples_per_worker))


def full_steps_as_a_float(samples_per_worker, batch_size):
    return float(full_steps_right(samples_per_worker, batch_size))


CASES.update(
    {
        "check_samples_per_shard": (
            lambda check, impl, root: check(impl),
            samples_per_shard_right,
            [
                lambda lat, bw, b, e: int(costmodel.size_for_efficiency(lat, bw, e) / b),
                lambda lat, bw, b, e: math.ceil(costmodel.size_for_efficiency(lat, bw, 1 - e) / b),
                lambda lat, bw, b, e: costmodel.size_for_efficiency(lat, bw, e) / b,
            ],
        ),
        "check_stage_or_stream": (
            lambda check, impl, root: check(impl),
            stage_or_stream_right,
            [
                stage_without_the_copy,
                stage_whenever_it_fits,
                stage_for_one_epoch,
                stage_even_when_it_does_not_fit,
                stage_or_stream_swapped,
                stage_as_a_bool,
                lambda *case: "stream",
                lambda *case: "stage",
            ],
        ),
        "check_common_full_steps": (
            lambda check, impl, root: check(impl),
            full_steps_right,
            [
                full_steps_of_the_largest_rank,
                full_steps_of_rank_0,
                full_steps_pooled_per_rank,
                full_steps_with_short_batches,
                full_steps_shared_out,
                full_steps_as_a_float,
            ],
        ),
    }
)


# --- lesson 6: shards in an S3 bucket, and torchrun's variables ----------------------------------

_S3 = {}  # the loopback S3 server of this module's checks, and a client of it


def s3_shards(root):
    """A boto3 client of a loopback S3 server (started once for this module, environment left
    alone) whose bucket ``shapes`` holds the tiny dataset's shards under ``train/``, beside a
    manifest; private objects."""
    if not _S3:
        server = s3.S3Server(export=False).start()
        client = boto3.client(
            "s3", endpoint_url=server.endpoint_url, config=SIGV4, **S3_CREDENTIALS
        )
        client.create_bucket(Bucket="shapes")
        for path in tiny_shards(root):
            client.upload_file(path, "shapes", f"train/{Path(path).name}")
        client.put_object(Bucket="shapes", Key="train/manifest.json", Body=b"{}")
        _S3.update(server=server, client=client)
    return _S3["client"]


SIGV4 = Config(signature_version="s3v4")  # as s3.client() signs
S3_CREDENTIALS = {
    "region_name": "us-east-1",
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
}


@pytest.fixture(scope="module", autouse=True)
def stop_the_s3_server():
    yield
    if _S3:
        _S3.pop("server").stop()
        _S3.clear()


def s3_case(check, impl, root):
    return check(impl, s3_shards(root), "shapes", "train/")


def shard_keys(client, bucket, prefix, paginate=True):
    if paginate:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    else:
        pages = [client.list_objects_v2(Bucket=bucket, Prefix=prefix)]
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def presign(client, bucket, key, expires_s=None):
    lifetime = {} if expires_s is None else {"ExpiresIn": expires_s}
    return client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, **lifetime
    )


def urls_right(client, bucket, prefix, expires_s):
    keys = shard_keys(client, bucket, prefix)
    return [presign(client, bucket, key, expires_s) for key in keys if key.endswith(".tar")]


def urls_of_the_first_page(client, bucket, prefix, expires_s):
    keys = shard_keys(client, bucket, prefix, paginate=False)
    return [presign(client, bucket, key, expires_s) for key in keys if key.endswith(".tar")]


def urls_with_the_manifest(client, bucket, prefix, expires_s):
    return [presign(client, bucket, key, expires_s) for key in shard_keys(client, bucket, prefix)]


def urls_of_every_page_s_contents(client, bucket, prefix, expires_s):
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    keys = [item["Key"] for page in pages for item in page["Contents"]]
    return [presign(client, bucket, key, expires_s) for key in keys if key.endswith(".tar")]


def urls_of_the_whole_bucket(client, bucket, prefix, expires_s):
    return urls_right(client, bucket, "", expires_s)


def urls_of_s3(client, bucket, prefix, expires_s):
    keys = shard_keys(client, bucket, prefix)
    return [f"s3://{bucket}/{key}" for key in keys if key.endswith(".tar")]


def urls_unsigned(client, bucket, prefix, expires_s):
    keys = shard_keys(client, bucket, prefix)
    endpoint = client.meta.endpoint_url
    return [f"{endpoint}/{bucket}/{key}" for key in keys if key.endswith(".tar")]


def urls_for_an_hour(client, bucket, prefix, expires_s):
    keys = shard_keys(client, bucket, prefix)
    return [presign(client, bucket, key) for key in keys if key.endswith(".tar")]


def urls_signed_with_version_2(client, bucket, prefix, expires_s):
    # a client made without a config: boto3 presigns with version 2 in us-east-1
    client = boto3.client("s3", endpoint_url=client.meta.endpoint_url, **S3_CREDENTIALS)
    return urls_right(client, bucket, prefix, expires_s)


def urls_signed_for_a_put(client, bucket, prefix, expires_s):
    keys = [key for key in shard_keys(client, bucket, prefix) if key.endswith(".tar")]
    return [
        client.generate_presigned_url(
            "put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_s
        )
        for key in keys
    ]


def urls_newest_first(client, bucket, prefix, expires_s):
    return urls_right(client, bucket, prefix, expires_s)[::-1]


def urls_of_the_file_names(client, bucket, prefix, expires_s):
    keys = shard_keys(client, bucket, prefix)
    names = [key.rpartition("/")[2] for key in keys if key.endswith(".tar")]
    return [presign(client, bucket, name, expires_s) for name in names]


def urls_asking_for_more_keys(client, bucket, prefix, expires_s):
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=5000)
    keys = [item["Key"] for item in listed.get("Contents", [])]
    return [presign(client, bucket, key, expires_s) for key in keys if key.endswith(".tar")]


def urls_with_the_prefix_twice(client, bucket, prefix, expires_s):
    keys = [key for key in shard_keys(client, bucket, prefix) if key.endswith(".tar")]
    return [presign(client, bucket, prefix + key, expires_s) for key in keys]


def urls_of_another_bucket(client, bucket, prefix, expires_s):
    keys = shard_keys(client, bucket, prefix)
    return [presign(client, "shapes", key, expires_s) for key in keys if key.endswith(".tar")]


URL_MISTAKES = {
    urls_of_the_first_page: "at most 1,000 keys",
    urls_with_the_manifest: "train/manifest.json is no shard",
    urls_of_every_page_s_contents: r"no key has no 'Contents': page.get\('Contents', \[\]\)",
    urls_of_the_whole_bucket: "val/val-000000.tar is not under train/",
    urls_of_s3: "has no credentials",
    urls_unsigned: "carries no signature",
    urls_for_an_hour: r"expire after 3,600 s \(an hour: ExpiresIn's default\), not 86,400 s",
    urls_signed_with_version_2: "signed with Signature Version 2",
    urls_signed_for_a_put: "is signed for a PUT, not a GET",
    urls_newest_first: "not in key order",
    urls_of_the_file_names: "sign each object's whole key",
    urls_asking_for_more_keys: "at most 1,000 keys",
    urls_with_the_prefix_twice: "already start with train/",
    urls_of_another_bucket: "names the bucket 'shapes', not 'check-listing'",
}


@pytest.mark.parametrize("wrong", list(URL_MISTAKES), ids=[w.__name__ for w in URL_MISTAKES])
def test_each_shard_url_mistake_is_named(wrong, tiny_dataset):
    with pytest.raises(feedback.CheckFailed, match=URL_MISTAKES[wrong]):
        s3_case(s3_checks.check_shard_urls, wrong, tiny_dataset)


def where_right(environ=os.environ):
    return (
        int(environ.get("RANK", 0)),
        int(environ.get("WORLD_SIZE", 1)),
        int(environ.get("LOCAL_RANK", 0)),
    )


def where_as_strings(environ=os.environ):
    return environ.get("RANK", "0"), environ.get("WORLD_SIZE", "1"), environ.get("LOCAL_RANK", "0")


def where_without_defaults(environ=os.environ):
    return int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ["LOCAL_RANK"])


def where_from_os_environ(environ=os.environ):
    return where_right(os.environ)


def where_local_rank_as_rank(environ=os.environ):
    rank, world_size, local_rank = where_right(environ)
    return local_rank, world_size, local_rank


def where_machine_as_rank(environ=os.environ):
    return where_right({**environ, "RANK": environ.get("GROUP_RANK", 0)})


def where_local_world(environ=os.environ):
    return where_right({**environ, "WORLD_SIZE": environ.get("LOCAL_WORLD_SIZE", 1)})


def where_rank_as_local_rank(environ=os.environ):
    rank, world_size, _ = where_right(environ)
    return rank, world_size, rank


def where_from_torch_distributed(environ=os.environ):
    import torch.distributed

    return torch.distributed.get_rank(), torch.distributed.get_world_size(), 0


def where_alone_in_a_world_of_0(environ=os.environ):
    rank, world_size, local_rank = where_right(environ)
    return rank, int(environ.get("WORLD_SIZE", 0)), local_rank


def where_as_floats(environ=os.environ):
    return tuple(float(value) for value in where_right(environ))


def where_without_a_default(environ=os.environ):
    return int(environ.get("RANK")), int(environ.get("WORLD_SIZE")), int(environ.get("LOCAL_RANK"))


def where_from_the_machines(environ=os.environ):
    rank, _, local_rank = where_right(environ)
    machines = int(environ.get("GROUP_RANK", 0)) + 1
    return rank, int(environ.get("LOCAL_WORLD_SIZE", 1)) * machines, local_rank


def where_as_a_list(environ=os.environ):
    names = {"RANK": 0, "WORLD_SIZE": 1, "LOCAL_RANK": 0}
    return [int(environ.get(name, default)) for name, default in names.items()]


def where_for_two(environ=os.environ):
    rank, _, local_rank = where_right(environ)
    return rank, 2, local_rank


WHERE_MISTAKES = {
    where_as_strings: "the environment holds strings",
    where_without_defaults: "raised KeyError",
    where_from_os_environ: "you read os.environ",
    where_local_rank_as_rank: "With LOCAL_RANK as the rank",
    where_machine_as_rank: "GROUP_RANK is the machine's number",
    where_local_world: "LOCAL_WORLD_SIZE counts the processes of one machine",
    where_rank_as_local_rank: "has no cuda:3",
    where_from_torch_distributed: "only after init_process_group",
    where_for_two: r"returned \(0, 2, 0\), expected \(0, 1, 0\)",
    where_as_floats: "only ints",
    where_alone_in_a_world_of_0: "a world of 1, not 0",
    where_without_a_default: "give each a default",
    where_from_the_machines: r"returned \(1, 2, 1\), expected \(1, 4, 1\)",
}


@pytest.mark.parametrize("wrong", list(WHERE_MISTAKES), ids=[w.__name__ for w in WHERE_MISTAKES])
def test_each_torchrun_variable_mistake_is_named(wrong):
    with pytest.raises(feedback.CheckFailed, match=WHERE_MISTAKES[wrong]):
        torchrun_checks.check_where_am_i(wrong)


def where_through_a_helper(environ=os.environ):
    return where_right(environ)  # right, but where_right is not in the script torchrun runs


def test_numpy_integers_are_a_right_number_of_steps(capsys):
    sizing_checks.check_common_full_steps(
        lambda ranks, b: np.min([sum(n // b for n in r) for r in ranks])
    )
    assert capsys.readouterr().out.startswith("✓")


def test_torchrun_runs_the_function_for_real_and_names_what_it_raised():
    with pytest.raises(feedback.CheckFailed, match="NameError: name 'where_right' is not defined"):
        torchrun_checks.check_where_am_i(where_through_a_helper)


def where_as_numpy_integers(environ=os.environ):
    import numpy as np  # inside: the script that torchrun runs holds this function alone

    names = {"RANK": 0, "WORLD_SIZE": 1, "LOCAL_RANK": 0}
    return tuple(np.int64(environ.get(name, default)) for name, default in names.items())


def test_numpy_integers_are_a_right_answer_under_torchrun_too(capsys):
    torchrun_checks.check_where_am_i(where_as_numpy_integers)  # JSON cannot hold numpy's
    assert capsys.readouterr().out.startswith("✓")


def test_a_failed_torchrun_shows_what_its_processes_printed_not_its_own_traceback():
    rank = "Traceback (most recent call last):\n  File where_am_i.py\nRuntimeError: gloo\n"
    agent = "Traceback (most recent call last):\n  File run.py\nChildFailedError:\n"
    assert torchrun_checks._before_torchruns_traceback(rank + agent) == rank
    assert torchrun_checks._before_torchruns_traceback(agent) == agent  # nothing else to show


CASES.update(
    {
        "check_shard_urls": (s3_case, urls_right, [urls_of_the_first_page, urls_for_an_hour]),
        "check_where_am_i": (
            lambda check, impl, root: check(impl),
            where_as_a_list,  # a right answer too; the worked sheet returns a tuple
            [where_local_rank_as_rank, where_without_defaults],
        ),
    }
)


# --- lesson 3 -------------------------------------------------------------------------------------


class PerProcessZip(ZipDataset):
    def __init__(self, archive):
        self._handle, self._pid = None, None
        super().__init__(archive)

    def _get_file_handle(self):
        if self._pid != os.getpid():
            self._handle, self._pid = zipfile.ZipFile(self.archive), os.getpid()
        return self._handle

    def read_member(self, name):
        return self._get_file_handle().read(name)


class StubPerProcessZip(PerProcessZip):
    _get_file_handle = stub


class InheritedZip(PerProcessZip):
    def _get_file_handle(self):
        return self.zip_file  # the one ZipDataset opened in __init__, shared by every forked worker


class OpenedOnceWithoutPid(PerProcessZip):
    def _get_file_handle(self):
        if self._handle is None:
            self._handle = zipfile.ZipFile(self.archive)
        return self._handle


class ReopenedWhenClosed(PerProcessZip):
    def _get_file_handle(self):
        if self._handle is None or self._handle.fp is None:
            self._handle = zipfile.ZipFile(self.archive)
        return self._handle


class OpenedEveryCall(PerProcessZip):
    def _get_file_handle(self):
        return zipfile.ZipFile(self.archive)


class OpenedAsAPlainFile(PerProcessZip):
    def _get_file_handle(self):
        if self._pid != os.getpid():
            self._handle, self._pid = open(self.archive, "rb"), os.getpid()  # noqa: SIM115
        return self._handle


class OpenedEveryCallInWorkers(PerProcessZip):
    def __init__(self, archive):
        super().__init__(archive)
        self._handle, self._pid = zipfile.ZipFile(archive), os.getpid()

    def _get_file_handle(self):
        if self._pid != os.getpid():  # the pid is checked, but the new handle is not kept
            return zipfile.ZipFile(self.archive)
        return self._handle


class FailingInWorkers(PerProcessZip):
    def _get_file_handle(self):
        if self._pid is not None and self._pid != os.getpid():
            raise OSError("no handle for this worker")
        return super()._get_file_handle()


def test_a_handle_failing_in_a_worker_leaves_no_worker_behind(tiny_dataset):
    before = set(multiprocessing.active_children())
    with pytest.raises(feedback.CheckFailed, match="(?s)worker: OSError: .*no handle") as failed:
        lesson3_case(handle_checks.check_per_process_handle, FailingInWorkers, tiny_dataset)
    # the failure is kept, as a notebook keeps the last one: its worker must be gone all the same
    assert set(multiprocessing.active_children()) <= before
    assert failed.value.__cause__ is None


def test_a_worker_that_opens_a_handle_per_call_is_named(tiny_dataset):
    with pytest.raises(feedback.CheckFailed, match="two calls returned two different ZipFiles"):
        lesson3_case(handle_checks.check_per_process_handle, OpenedEveryCallInWorkers, tiny_dataset)


def test_a_handle_reopened_only_when_closed_is_named(tiny_dataset):
    """The check closes the main process's handle before its audit: it must first see that a
    worker forked while that handle is open gets it back."""
    with pytest.raises(feedback.CheckFailed, match="compare os.getpid"):
        lesson3_case(handle_checks.check_per_process_handle, ReopenedWhenClosed, tiny_dataset)


def reopen_right(worker_id):
    dataset = get_worker_info().dataset
    dataset.zip_file = zipfile.ZipFile(dataset.archive)


def reopen_into_a_local(worker_id):
    zipfile.ZipFile(get_worker_info().dataset.archive)


def reopen_in_a_with_block(worker_id):
    dataset = get_worker_info().dataset
    with zipfile.ZipFile(dataset.archive) as handle:
        dataset.zip_file = handle


class RecipeZip(ZipDataset):
    def __reduce__(self):
        return ZipDataset, (self.archive, self.transform, self.decoder)


class StubRecipeZip(ZipDataset):
    __reduce__ = stub


class RecipeWithTheHandle(ZipDataset):
    def __reduce__(self):
        return ZipDataset, (self.archive,), self.__dict__


class RecipeOfTheHandle(ZipDataset):
    def __reduce__(self):
        return ZipDataset, (self.zip_file,)


class RecipeArgumentsNotATuple(ZipDataset):
    def __reduce__(self):
        return ZipDataset, self.archive  # the arguments must be a tuple: (self.archive,)


class RecipeShiftedArguments(ZipDataset):
    def __reduce__(self):
        return ZipDataset, (self.archive, self.decoder)  # the decoder lands in transform


class RecipeSwappedArguments(ZipDataset):
    def __reduce__(self):
        return ZipDataset, (self.archive, self.decoder, self.transform)  # transform and decoder


class RecipeWithoutTransform(ZipDataset):
    def __reduce__(self):
        return ZipDataset, (self.archive,)


def lesson3_case(check, impl, root):
    return check(impl, archive(root, "zip"), imagefolder.load_manifest(root))


CASES.update(
    {
        "check_per_process_handle": (
            lesson3_case,
            PerProcessZip,
            [
                InheritedZip,
                OpenedOnceWithoutPid,
                ReopenedWhenClosed,
                OpenedEveryCall,
                OpenedAsAPlainFile,
            ],
        ),
        "check_worker_init_fn": (
            lesson3_case,
            reopen_right,
            [lambda worker_id: None, reopen_into_a_local, reopen_in_a_with_block],
        ),
        "check_spawn_ready": (
            lambda check, impl, root: check(
                impl(archive(root, "zip")), imagefolder.load_manifest(root)
            ),
            RecipeZip,
            [
                RecipeWithTheHandle,
                RecipeOfTheHandle,
                RecipeArgumentsNotATuple,
                RecipeShiftedArguments,
                RecipeWithoutTransform,
            ],
        ),
    }
)
STUBS.update({"check_per_process_handle": StubPerProcessZip, "check_spawn_ready": StubRecipeZip})


@pytest.mark.parametrize(
    "name, wrong, hint",
    [
        (
            "check_workers_needed",
            lambda t, lat, s: costmodel.workers_needed(t, lat, 0.0),
            "include the work time",
        ),
        (
            "check_predict_epoch_seconds",
            predict_with_a_shared_link,
            "paces each connection on its own",
        ),
        (
            "check_predict_epoch_seconds",
            lambda n, m, lat, b, w: n * lat + n * m / (b * w),
            "divide the latency term",
        ),
        (
            "check_predict_epoch_seconds",
            lambda n, m, lat, b, w: 1000 * n * (lat + m / b) / w,
            "in milliseconds",
        ),
        ("check_zip_dataset", ZipOpenedPerSample, "opened the ZIP 3 more time"),
        ("check_tar_index", tar_index_with_padded_names, "strip the NUL padding"),
        ("check_tar_index", walked_tar_index(lambda size: 0), "raised ValueError"),
        (
            "check_tar_index",
            walked_tar_index(lambda size: -(-size // 512) * 512, base=10),
            "with base 10: .* The size field is an octal number written in ASCII",
        ),
        (
            "check_tar_index",
            walked_tar_index(lambda size: -(-size // 512) * 512, end=None),
            "with base 8: b''. You read past the end: a tar ends with an all-zero block",
        ),
        (  # lands in the zeros of a padding, as a walk past the end does: padding is the cause
            "check_tar_index",
            walked_tar_index(lambda size: size),
            "with base 8: b''. Past the first header, .* skip to the next multiple of 512",
        ),
        ("check_tar_index", tar_index_keeping_the_nul, "strip b'\\\\0 ' before int"),
        (
            "check_tar_index",
            walked_tar_index(lambda size: 512 * (size // 512 + 1)),
            "none after a member of 0 or 512 bytes",
        ),
        ("check_tar_index", tar_index_with_bytes_names, "names are bytes"),
        ("check_workers_needed", lambda t, lat, s: int(t * (lat + s)) + 1, "one worker too many"),
        (
            "check_workers_needed",
            lambda t, lat, s: float(costmodel.workers_needed(t, lat, s)),
            "the number is right; return it as an int",
        ),
        (
            "check_count_per_class",
            lambda root: {
                d.name: len(list(d.iterdir())) for d in Path(root).iterdir() if d.is_dir()
            },
            "count only the .jpg files",
        ),
        (
            "check_count_per_class",
            lambda root: {
                d.name: str(len(list(d.glob("*.jpg")))) for d in Path(root).iterdir() if d.is_dir()
            },
            "return each count as an int",
        ),
        (
            "check_count_per_class",
            lambda root: Counter(
                s["path"].split("/")[0] for s in imagefolder.load_manifest(root)["samples"]
            ),
            "read manifest.json",
        ),
        ("check_workers_needed", lambda t, lat, s: int(t * (lat + s)), "round up, not down"),
        (
            "check_workers_needed",
            lambda t, lat, s: math.ceil(t * (lat + s)),
            "the docstring asks for at least 1",
        ),
        (
            "check_workers_needed",
            lambda t, lat, s: max(1, math.ceil(t / (1 / (lat + s)))),
            "divided by zero: with no latency and no work",
        ),
        ("check_workers_needed", lambda t, lat, s: math.ceil(t * lat), "include the work time"),
        (
            "check_workers_needed",
            lambda t, lat, s: max(1, math.floor(t * (lat + s))),
            "round up, not down",
        ),
        (
            "check_workers_needed",
            lambda t, lat, s: max(1, math.ceil(t * lat + s)),
            "paid for every sample",
        ),
        ("check_pack_zip", pack_labels_as_a_list, "labels.json holds a list"),
        ("check_pack_zip", pack_with_file_times, "write\\(path\\) with the file's"),
        ("check_pack_zip", pack_in_reverse, "another order than the manifest's"),
        ("check_pack_zip", pack_labels_as_floats, "a float: a class number is an int"),
        ("check_pack_zip", pack_labels_as_text, "a str: a class number is an int"),
        ("check_pack_zip", pack_labels_by_path, "has no key '000000'"),
        (
            "check_pack_zip",
            lambda root, target: Path(target).write_bytes(b"images"),
            "not a ZIP archive",
        ),
        ("check_folder_dataset", SwappedPair, "the image first"),
        ("check_folder_dataset", TextLabels, "label '0', a str: return the manifest's label as"),
        (
            "check_folder_dataset",
            FloatLabels,
            r"label 0.0, a float: return the manifest's label as it is, an int \(cross_entropy",
        ),
        (
            "check_folder_dataset",
            FloatTensorLabels,
            r"label tensor\(0.\), a tensor of torch.float32",
        ),
        ("check_folder_dataset", TensorLabels, "a tensor of torch.int64: return the manifest's"),
        ("check_zip_dataset", ZipFloatLabels, "label 0.0, a float: return the manifest's label"),
        ("check_folder_dataset", WrongFile, r"dataset\[0\] is sample 1 of the manifest, one off"),
        ("check_folder_dataset", ShiftedLabels, "take the label from the same manifest entry"),
        (
            "check_worker_init_fn",
            reopen_in_a_with_block,
            "the ZipFile your worker_init_fn stored in the dataset is closed before the worker",
        ),
        ("check_worker_init_fn", lambda worker_id: None, "a handle of its own"),
        (
            "check_shard_split",
            lambda shards, rank, world_size, worker, workers: sorted(shards)[rank::world_size][
                worker::workers
            ],
            "Keep the order you are given",
        ),
        ("check_shard_split", split_after_a_shuffle, "called again with the same arguments"),
        ("check_shard_split", split_by_shard_number, "goes by the shards' names"),
        ("check_shard_split", split_in_place, "reordered the list it was given"),
        (
            "check_shard_split",
            split_in_chunks,
            r"nobody reads train-000018.tar \(2 of 20 shards left out\): chunks of "
            r"len\(shards\) // parts leave the remainder out. Deal the shards like cards: "
            r"shards\[rank::world_size\]\[worker::num_workers\]",
        ),
        ("check_shuffle_buffer", buffer_by_blocks, "block by block"),
        (
            "check_shuffle_buffer",
            buffer_first_in_first_out,
            r"first in, first out, .* \(rng.randrange\(len\(buffer\)\)\)",
        ),
        (
            "check_shuffle_buffer",
            buffer_replacing_before_yielding,
            r"You replaced buffer\[i\] before yielding it: yield it first, then put the newcomer",
        ),
        ("check_shuffle_buffer", buffer_never_picking_its_last_slot, "leaves out the last one"),
        ("check_shuffle_buffer", buffer_past_its_end, "it indexed past the buffer"),
        ("check_shuffle_buffer", buffer_beside_the_newcomer, "more than once.*not beside it"),
        ("check_shuffle_buffer", mistaken_buffer(kept=True), "outlived the first call"),
        ("check_shuffle_buffer", buffer_with_a_reversed_drain, "the final drain ignores rng"),
        ("check_shuffle_buffer", buffer_with_a_fixed_generator, "never uses the rng it is given"),
        (
            "check_shuffle_buffer",
            lambda samples, size, rng: sorted(samples, key=lambda _: rng.random()),
            "write a generator",
        ),
        (
            "check_shuffle_buffer",
            lambda samples, size, rng: iter(sorted(samples, key=lambda _: rng.random())),
            "never reads more than 50 ahead",
        ),
        (
            "check_samples_per_shard",
            lambda lat, bw, b, e: float(samples_per_shard_right(lat, bw, b, e)),
            "a float",
        ),
        (
            "check_predict_epoch_seconds",
            lambda n, m, lat, bw, w: (n * lat + m / bw) / w,
            "the transfer is for every file",
        ),
        ("check_predict_epoch_seconds", lambda *args: None, "return the seconds, a number"),
        (
            "check_predict_epoch_seconds",
            lambda n, m, lat, b, w: n * (lat / 1000) / w + n * m / (b * w),
            "latency is already in seconds",
        ),
        (
            "check_predict_epoch_seconds",
            lambda n, m, lat, b, w: (lat + m / b) / w,
            "that is one file's time: the epoch reads n_files",
        ),
        (
            "check_predict_epoch_seconds",
            lambda n, m, lat, b, w: max(n * lat / w, n * m / (b * w)),
            "take their sum, not the larger",
        ),
        (
            "check_predict_epoch_seconds",
            lambda n, m, lat, b, w: n * lat / w + n * m * 8 / (b * w),
            "no factor of 8",
        ),
        ("check_stage_or_stream", stage_without_the_copy, "you left out the copy"),
        ("check_stage_or_stream", stage_whenever_it_fits, "fitting on scratch is not enough"),
        ("check_stage_or_stream", stage_for_one_epoch, "the copy is paid once"),
        ("check_stage_or_stream", stage_even_when_it_does_not_fit, "staging needs room"),
        ("check_stage_or_stream", stage_or_stream_swapped, "the other way round"),
        ("check_stage_or_stream", stage_as_a_bool, "return the string 'stage'"),
        ("check_stage_or_stream", stage_on_a_tie, "on a tie, stream"),
        ("check_stage_or_stream", stage_with_the_copy_as_an_epoch, "stand in for an epoch"),
        ("check_stage_or_stream", stage_past_the_break_even, "staging never pays back"),
        ("check_stage_or_stream", stream_when_it_just_fits, "exactly as big as the free space"),
        ("check_stage_or_stream", stage_from_the_break_even, "you stage from the break-even on"),
        (
            "check_samples_per_shard",
            lambda lat, bw, b, e: int(costmodel.size_for_efficiency(lat, bw, e) / b) + 1,
            "one too many",
        ),
        ("check_common_full_steps", full_steps_of_the_largest_rank, "Take the fewest"),
        ("check_common_full_steps", full_steps_of_rank_0, "rank 0's own count"),
        ("check_common_full_steps", full_steps_pooled_per_rank, "worker by worker"),
        ("check_common_full_steps", full_steps_with_short_batches, "short last batch"),
        ("check_common_full_steps", full_steps_shared_out, "its own workers deliver"),
        ("check_common_full_steps", full_steps_as_a_float, "an int"),
        (
            "check_common_full_steps",
            lambda ranks, b: sum(sum(n // b for n in rank) for rank in ranks),
            "you added up the steps of every rank",
        ),
        (
            "check_common_full_steps",
            lambda ranks, b: min(sum(round(n / b) for n in rank) for rank in ranks),
            "counts a short last batch when it is at least half full",
        ),
        (
            "check_common_full_steps",
            lambda ranks, b: full_steps_right(ranks, b) - 1,
            "one step fewer than every rank can run",
        ),
        (
            "check_samples_per_shard",
            lambda lat, bw, b, e: math.ceil(costmodel.size_for_efficiency(lat, bw, e)),
            "that is the shard's size in bytes",
        ),
        (
            "check_samples_per_shard",
            lambda lat, bw, b, e: math.ceil(costmodel.size_for_efficiency(lat / 1000, bw, e) / b),
            "about 1,000 times off",
        ),
    ],
)
def test_check_names_the_mistake(name, wrong, hint, tiny_dataset):
    run, _, _ = CASES[name]
    with pytest.raises(feedback.CheckFailed, match=hint):
        run(check_named(name), wrong, tiny_dataset)


def test_a_walk_over_the_headers_passes_the_tar_index_check(tiny_dataset, capsys):
    walk = walked_tar_index(lambda size: -(-size // 512) * 512)
    packing_checks.check_tar_index(walk, archive(tiny_dataset, "tar"))
    assert capsys.readouterr().out.startswith("✓")


# --- lessons 4 and 5: a streaming dataset and a webdataset loader, written whole -----------------


def read_samples(shard):
    with tarfile.open(shard) as tar:
        for member in tar:
            if member.name.endswith(".cls"):
                yield member.name[:-4], int(tar.extractfile(member).read())


def stream_class(mistake=None):
    """A learner's ShardStream, right or with one ``mistake``."""

    class Stream(IterableDataset):
        def __init__(self, shards, rank=0, world_size=1, seed=0, buffer_size=100):
            self.shards, self.rank, self.world_size = list(shards), rank, world_size
            self.seed, self.buffer_size, self.plain_epoch = seed, buffer_size, 0
            self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

        def set_epoch(self, epoch):
            self.plain_epoch = epoch
            self._epoch.fill_(epoch)

        @property
        def epoch(self):  # an attribute reaches only workers started afresh
            return self.plain_epoch if mistake == "epoch in an attribute" else int(self._epoch)

        def __iter__(self):
            info = get_worker_info()
            worker, workers = (info.id, info.num_workers) if info else (0, 1)
            epoch = 0 if mistake == "epoch ignored" else self.epoch
            rank_salt = self.rank if mistake == "rank in the shard seed" else ""
            seed = 0 if mistake == "seed ignored" else self.seed
            pair = seed + epoch if mistake == "seed plus epoch" else f"{seed}:{epoch}"
            order = self.shards if mistake == "shards shuffled in place" else list(self.shards)
            worker_salt = worker if mistake == "worker in the shard seed" else ""
            if mistake != "shuffle after the split":
                random.Random(f"{pair}:{rank_salt}:{worker_salt}").shuffle(order)
            if mistake == "global shuffle":
                random.seed(f"{pair}")
                random.shuffle(order)
            if mistake == "worker info always there":
                worker, workers = info.id, info.num_workers
            mine = order if mistake == "no rank split" else order[self.rank :: self.world_size]
            if mistake == "ranks overlap":  # one shard too many for each rank
                per = len(order) // self.world_size
                mine = order[self.rank * per : (self.rank + 1) * per + 1]
            if mistake == "last shard lost":  # an end one short
                mine = order[self.rank : len(order) - 1 : self.world_size]
            if mistake != "no worker split":
                mine = mine[worker::workers]
            if mistake == "shuffle after the split":
                random.Random(pair).shuffle(mine)
            if mistake == "dealt off by one":
                every = self.world_size * workers
                mine = order[self.rank * self.world_size + worker :: every]
            samples = (sample for shard in mine for sample in read_samples(shard))
            if mistake == "samples split":
                every, me = self.world_size * workers, self.rank * workers + worker
                everything = (sample for shard in order for sample in read_samples(shard))
                samples = (s for i, s in enumerate(everything) if i % every == me)
            if mistake == "keys only":
                samples = (key for key, _ in samples)
            if mistake == "fails in a worker" and info is not None:
                raise KeyError("a worker's own error")
            if mistake == "shuffled within shards":
                rng = random.Random(f"{pair}:{self.rank}:{worker}")
                for shard in mine:
                    in_shard = list(read_samples(shard))
                    rng.shuffle(in_shard)
                    yield from in_shard
                return
            if mistake == "no buffer":
                yield from samples
                return
            rng = random.Random(f"{pair}:{self.rank}:{worker}")
            if mistake == "whole part buffered":
                yield from shuffled(list(samples), rng)
                return
            if mistake == "first in, first out":
                yield from buffer_first_in_first_out(samples, self.buffer_size, rng)
                return
            if mistake == "unseeded buffer":
                rng = random.Random()
            if mistake == "buffer seed without the epoch":
                rng = random.Random(f"{seed}:{self.rank}:{worker}")
            if mistake == "the loader's worker seed" and info is not None:
                rng = random.Random(info.seed)  # another in every loader
            buffer = self.__dict__.setdefault("kept", []) if mistake == "buffer on self" else []
            size = 4 if mistake == "buffer_size ignored" else self.buffer_size
            for sample in samples:
                if len(buffer) < size:
                    buffer.append(sample)
                    continue
                index = rng.randrange(size)
                yield buffer[index]
                buffer[index] = sample
            if mistake != "buffer kept":
                rng.shuffle(buffer)
                yield from buffer

    return Stream


def test_a_right_stream_passes(tiny_dataset, capsys):
    shard_checks.check_shard_stream(stream_class(), tiny_shards(tiny_dataset))
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    ("mistake", "named"),
    [
        ("no worker split", "get_worker_info"),
        ("no rank split", "[rank::world_size]"),
        ("rank in the shard seed", "(a seed with the rank or worker in it"),
        ("worker in the shard seed", "shuffled the shard list differently"),
        ("shuffle after the split", "only in a new order. Shuffle the whole shard list"),
        ("dealt off by one", "[r * num_workers + w :: world_size * num_workers]"),
        ("epoch ignored", "set_epoch"),
        ("no buffer", "shuffle buffer is not mixing"),
        ("ranks overlap", "the ranks' parts overlap"),
        ("last shard lost", "No sample of 1 shard(s) arrived (train-"),
        ("buffer kept", "Exactly buffer_size (here 10) samples never arrived: those the buffer"),
        ("whole part buffered", "your stream read 60 samples before it yielded its first"),
        ("buffer_size ignored", "yielded its first sample after reading 5, though buffer_size"),
        ("seed ignored", "mix self.seed"),
        ("seed plus epoch", "seed + epoch makes them collide"),
        ("unseeded buffer", "in another order the second time"),
        ("shards shuffled in place", "not self.shards in place"),
        ("samples split", "Split the shard list between workers, not the samples"),
        ("global shuffle", "global random generator"),
        ("worker info always there", "get_worker_info() returns None"),
        ("keys only", "not a (key, label) pair"),
        ("buffer on self", "something outlived the first pass"),
        ("shuffled within shards", "shuffled within each shard, never across them"),
        ("epoch in an attribute", "workers that stay (persistent_workers=True), epoch 1 repeated"),
        ("the loader's worker seed", "not get_worker_info().seed"),
        ("buffer seed without the epoch", "the buffer made the same random choices both"),
    ],
)
def test_each_stream_mistake_is_named(tiny_dataset, mistake, named):
    with pytest.raises(feedback.CheckFailed) as failed:
        shard_checks.check_shard_stream(stream_class(mistake), tiny_shards(tiny_dataset))
    assert named in str(failed.value)


def test_a_drain_left_out_is_named_without_the_worker_info(tiny_dataset):
    with pytest.raises(feedback.CheckFailed) as failed:
        shard_checks.check_shard_stream(stream_class("buffer kept"), tiny_shards(tiny_dataset))
    assert "50 items, 50 distinct, of 60 samples" in str(failed.value)
    assert "get_worker_info" not in str(failed.value)


@pytest.fixture(scope="module")
def small_shards(tmp_path_factory):
    """The course's small dataset, 500 samples in 20 shards of 25 as lesson 4 writes them: a
    worker's share, about 83 samples, outgrows the stream check's buffer."""
    from packdata import synthetic
    from packdata.shardwrite import write_shards

    root = synthetic.make_dataset(
        tmp_path_factory.mktemp("data") / "synthetic-500", size=500, progress=False
    )
    written = write_shards(root, tmp_path_factory.mktemp("shards"), maxcount=25, progress=False)
    return [str(info.path) for info in written]


def test_a_right_stream_passes_at_the_small_size(small_shards, capsys):
    shard_checks.check_shard_stream(stream_class(), small_shards)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    ("mistake", "named"),
    [
        ("first in, first out", "the shuffle buffer is not mixing"),
        ("whole part buffered", "your stream read 500 samples before it yielded its first"),
    ],
)
def test_a_buffer_that_does_not_mix_fails_at_the_small_size(small_shards, mistake, named):
    with pytest.raises(feedback.CheckFailed, match=re.escape(named)):
        shard_checks.check_shard_stream(stream_class(mistake), small_shards)


def test_an_error_in_a_stream_s_worker_leaves_no_worker_behind(tiny_dataset):
    before = set(multiprocessing.active_children())
    with pytest.raises(KeyError, match="a worker's own error") as failed:
        shard_checks.check_shard_stream(
            stream_class("fails in a worker"), tiny_shards(tiny_dataset)
        )
    assert failed.value.__traceback__  # kept, as a notebook keeps the last error
    assert set(multiprocessing.active_children()) <= before


def test_twice_within_a_rank_and_missing_blames_the_workers_shuffles():
    # the workers of rank 0 dealt from lists shuffled differently: "a" twice, "d" and "e" never
    reason = shard_checks._duplicates_explained([["a", "a", "b"], ["c"]], expected=5)
    assert reason.startswith("within one rank, 1 samples arrived twice, and 2 of 5 never")
    assert "the rank's workers shuffled the shard list differently" in reason


def pipeline_loader(shard_stages):
    """A loader built as a ``DataPipeline`` whose shard stages are ``shard_stages(shards,
    epoch)``: right answers written without ``WebDataset``."""

    def make_loader(shards, epoch):
        dataset = wds.DataPipeline(
            *shard_stages(shards, epoch),
            wds.tarfile_to_samples(),
            wds.shuffle(100, seed=0),  # the samples' buffer: its seed is not the shards'
            wds.to_tuple("__key__", "cls"),
            wds.batched(4),
        )
        return wds.WebLoader(dataset, batch_size=None, num_workers=2)

    return make_loader


def list_seeded(shards, epoch):
    """The shard list reshuffled by its own seed, the epoch."""
    return wds.SimpleShardList(shards, seed=epoch), wds.split_by_node, wds.split_by_worker


def detshuffled(shards, epoch):
    """detshuffle with a fixed seed, counting the epoch itself."""
    return (
        wds.SimpleShardList(shards),
        wds.split_by_node,
        wds.split_by_worker,
        wds.detshuffle(len(shards), seed=0, epoch=epoch - 1),
    )


def every_shard(urls):
    """A node splitter that gives every rank every shard: the mistake to catch."""
    return urls


def split_when_made(shards):
    """Rank $RANK's shards, read from the environment when the loader is made (a right answer)."""
    return shards[int(os.environ["RANK"]) :: int(os.environ["WORLD_SIZE"])]


def loader_maker(
    seed_from_epoch=True,
    splitter=wds.split_by_node,
    select=None,
    batch=4,
    fields=("__key__", "cls"),
    split_first=False,
    options=(),
    workers=2,
    buffer=0,
    own_shuffle=False,
    with_epoch=0,
    **batching,
):
    def make_loader(shards, epoch):
        if splitter is split_when_made or split_first:
            shards = split_when_made(shards)
        if own_shuffle:  # the same on every rank, new each epoch; webdataset then keeps it
            shards = random.Random(epoch).sample(shards, len(shards))
        settings = {
            "shardshuffle": len(shards),
            "seed": epoch if seed_from_epoch else 0,
            "nodesplitter": every_shard if splitter is split_when_made else splitter,
            "empty_check": False,
            **({"select_files": select} if select else {}),
            **dict(options),
        }
        dataset = wds.WebDataset(shards, **settings)
        dataset = dataset.shuffle(buffer) if buffer else dataset
        dataset = dataset.to_tuple(*fields)
        dataset = dataset.batched(batch, **batching) if batch else dataset
        dataset = dataset.with_epoch(with_epoch) if with_epoch else dataset
        return wds.WebLoader(dataset, batch_size=None, num_workers=workers)

    return make_loader


def shuffled_in_place(make_loader):
    """``make_loader`` after shuffling the list it is given in place with the epoch: each epoch's
    order then builds on the last one's."""

    def make(shards, epoch):
        random.Random(epoch).shuffle(shards)
        return make_loader(shards, epoch)

    return make


@pytest.mark.parametrize(
    "maker",
    [
        loader_maker(select=methodcaller("endswith", ".cls")),
        loader_maker(splitter=split_when_made),
        loader_maker(buffer=100),
        loader_maker(own_shuffle=True, options={"shardshuffle": False}.items(), buffer=100),
        pipeline_loader(list_seeded),
        pipeline_loader(detshuffled),
    ],
    ids=[
        "selects files",
        "splits by RANK when made",
        "buffers",
        "shuffles the list itself",
        "a pipeline whose shard list has a seed",
        "a pipeline with detshuffle",
    ],
)
def test_a_right_webdataset_loader_passes(tiny_dataset, capsys, maker):
    webdataset_checks.check_webdataset_loader(maker, tiny_shards(tiny_dataset))
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    ("maker", "named"),
    [
        (loader_maker(splitter=wds.single_node_only), "nodesplitter=wds.split_by_node"),
        (loader_maker(splitter=every_shard), "both ranks read every shard"),
        (loader_maker(batch=None), ".batched(32)"),
        (loader_maker(batch=7, partial=False), "partial=False"),
        (loader_maker(collation_fn=None), "no collation_fn"),
        (loader_maker(seed_from_epoch=False), "seed that shuffle from the epoch"),
        (loader_maker(select=lambda name: name.endswith(".cls")), "does not pickle"),
        (
            loader_maker(options={"workersplitter": None}.items()),
            "every sample arrived twice: each of its 2 workers read all of the rank's shards. "
            "Leave workersplitter",
        ),
        (loader_maker(with_epoch=100), "with_epoch and resampled=True repeat samples"),
        (
            loader_maker(with_epoch=100, options={"resampled": True}.items()),
            "An exact epoch needs neither",
        ),
        (loader_maker(options={"shardshuffle": False}.items()), "shardshuffle=len(shards)"),
        (loader_maker(seed_from_epoch=False, buffer=100), "seeded 0 in epochs 0 and 1"),
        (
            loader_maker(options={"shardshuffle": None}.items(), buffer=100),
            "the shards came in the same order",
        ),
        (
            loader_maker(options={"shardshuffle": False}.items(), buffer=100),
            "the shards came in the same order",
        ),
        (loader_maker(fields=("cls", "__key__")), "pick the key first"),
        (loader_maker(split_first=True), "split by rank twice"),
        (loader_maker(splitter=wds.split_by_worker), "some came more than once and others"),
        (loader_maker(workers=0), "starts 0 worker(s); the task asks for 2"),
        (
            shuffled_in_place(loader_maker(options={"shardshuffle": False}.items())),
            "reordered the shard list it was given",
        ),
    ],
)
def test_each_webdataset_mistake_is_named(tiny_dataset, maker, named):
    with pytest.raises(feedback.CheckFailed) as failed:
        webdataset_checks.check_webdataset_loader(maker, tiny_shards(tiny_dataset))
    assert named in str(failed.value)


def test_a_webdataset_error_in_a_worker_leaves_no_worker_behind(tiny_dataset):
    before = set(multiprocessing.active_children())
    with pytest.raises(feedback.CheckFailed, match="give it a nodesplitter") as failed:
        webdataset_checks.check_webdataset_loader(
            loader_maker(splitter=wds.single_node_only), tiny_shards(tiny_dataset)
        )
    assert failed.value.__context__.__traceback__  # the worker's error, kept with the check's
    assert set(multiprocessing.active_children()) <= before


CASES.update(
    {
        "check_shard_stream": (
            lambda check, impl, root: check(impl, tiny_shards(root)),
            stream_class(),
            [stream_class("no worker split"), stream_class("no buffer")],
        ),
        "check_webdataset_loader": (
            lambda check, impl, root: check(impl, tiny_shards(root)),
            loader_maker(),
            [loader_maker(seed_from_epoch=False), loader_maker(splitter=every_shard)],
        ),
    }
)


def lesson_check_modules():
    """The checks modules that the worked sheets of lessons 0 to 6 import (those of lessons 7 and 8
    have tests of their own)."""
    names = set()
    for path in sorted((ROOT / "solutions").glob("0[0-6]_*.md")):
        for line in re.findall(r"^from packdata\.course import (.+)$", path.read_text(), re.M):
            names.update(name.strip() for name in line.split(","))
    return [importlib.import_module(f"packdata.course.{name}") for name in sorted(names)]


LESSON_CHECKS = lesson_check_modules()


def check_named(name):
    (check,) = (getattr(module, name) for module in LESSON_CHECKS if hasattr(module, name))
    return check


def test_every_check_has_cases():
    defined = {
        name
        for module in LESSON_CHECKS
        for name, f in inspect.getmembers(module, inspect.isfunction)
        if name.startswith("check_") and f.__module__ == module.__name__
    }
    assert defined == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_check_passes_right_and_fails_wrong(name, tiny_dataset, capsys):
    check = check_named(name)
    run, right, wrongs = CASES[name]
    run(check, right, tiny_dataset)
    assert capsys.readouterr().out.startswith("✓")
    with pytest.raises(NotImplementedError):
        run(check, STUBS.get(name, stub), tiny_dataset)
    for wrong in wrongs:
        with pytest.raises(feedback.CheckFailed):
            run(check, wrong, tiny_dataset)


def test_a_stub_run_in_a_worker_shows_its_hint_alone(tiny_dataset):
    def init_stub(worker_id):
        raise NotImplementedError("Your turn! Hint: which copy of the dataset does a worker read?")

    with pytest.raises(NotImplementedError) as raised:
        lesson3_case(handle_checks.check_worker_init_fn, init_stub, tiny_dataset)
    assert str(raised.value) == "Your turn! Hint: which copy of the dataset does a worker read?"


def test_an_unshuffled_drain_is_named_before_the_epochs_compare(tiny_dataset):
    with pytest.raises(feedback.CheckFailed, match="rng.shuffle"):
        shard_checks.check_shuffle_buffer(buffer_with_unshuffled_drain, tiny_shards(tiny_dataset))


def test_the_spawn_check_blames_an_open_file_only_when_one_was_pickled(tiny_dataset):
    manifest, path = imagefolder.load_manifest(tiny_dataset), archive(tiny_dataset, "zip")
    with pytest.raises(feedback.CheckFailed) as not_a_tuple:
        handle_checks.check_spawn_ready(RecipeArgumentsNotATuple(path), manifest)
    assert "tuple of the arguments" in str(not_a_tuple.value) and "ZipFile" not in str(
        not_a_tuple.value
    )
    with pytest.raises(feedback.CheckFailed, match="an open handle"):
        handle_checks.check_spawn_ready(RecipeOfTheHandle(path), manifest)


@pytest.mark.parametrize(
    "message",
    [
        "cannot pickle '_io.BufferedReader' object",  # up to Python 3.11
        "cannot pickle 'BufferedReader' instances",  # from Python 3.12
        "cannot pickle '_thread.RLock' object",
        "cannot pickle '_thread.lock' object",
        "cannot pickle 'mmap.mmap' object",
        "cannot pickle 'socket' object",
        "cannot pickle '_thread._local' object",
        "cannot pickle 'sqlite3.Connection' object",
        "cannot pickle 'sqlite3.Cursor' object",
    ],
)
def test_an_open_handle_is_recognised_in_what_any_python_says(message):
    assert handle_checks.UNPICKLABLE_HANDLE.search(message)


def test_the_handle_check_names_a_handle_that_breaks_building_the_dataset(tiny_dataset):
    with pytest.raises(feedback.CheckFailed, match="must return a zipfile.ZipFile"):
        lesson3_case(handle_checks.check_per_process_handle, OpenedAsAPlainFile, tiny_dataset)


@pytest.mark.parametrize(
    "recipe, named",
    [
        (RecipeShiftedArguments, "transform='torchcodec'"),
        (RecipeWithoutTransform, "transform=None"),
        (RecipeSwappedArguments, r"could not be rebuilt .* in ZipDataset's order"),
    ],
)
def test_the_spawn_check_names_a_recipe_that_changes_an_argument(tiny_dataset, recipe, named):
    manifest, path = imagefolder.load_manifest(tiny_dataset), archive(tiny_dataset, "zip")
    with pytest.raises(feedback.CheckFailed, match=named):
        handle_checks.check_spawn_ready(recipe(path), manifest)


# --- numeric checks say how far off a near miss is ----------------------------------------------


@pytest.mark.parametrize(
    "got, expected, tolerance, shown",
    [
        (20.24, 20.19, 1e-6, "returned 20.24 s, expected 20.19 s (0.25% off; the check allows "),
        (20.2401, 20.2399, 1e-6, "returned 20.2401 s, expected 20.2399 s (0.00099% off;"),
        (20.24, 20.19, 1e-3, "(0.25% off; the check allows 0.1%)"),
        (5, 6, 0, "returned 5 s, expected 6 s (17% off; the check wants it exact)"),
    ],
)
def test_mismatch_shows_digits_that_differ_and_the_relative_error(got, expected, tolerance, shown):
    assert shown in feedback.mismatch(got, expected, "s", tolerance)


@pytest.mark.parametrize(
    "factor, off", [(1.003, "0.3% off"), (0.9999, "0.01% off"), (1 + 3e-6, "0.0003% off")]
)
def test_a_near_miss_in_the_cost_model_prints_two_different_numbers(factor, off):
    def almost(*args):
        return predict_right(*args) * factor

    with pytest.raises(feedback.CheckFailed) as failure:
        folder_checks.check_predict_epoch_seconds(almost)
    message = str(failure.value)
    got, expected = re.search(r"returned ([\d.]+) s, expected ([\d.]+) s", message).groups()
    assert got != expected
    assert f"({off}; the check allows 0.0001%)" in message


def test_a_near_miss_in_a_count_says_how_far_off_it_is():
    def one_more(samples_per_worker, batch_size):
        return full_steps_right(samples_per_worker, batch_size) + 1

    with pytest.raises(feedback.CheckFailed, match=r"returned 6, expected 5 \(20% off; the check"):
        sizing_checks.check_common_full_steps(one_more)
    with pytest.raises(feedback.CheckFailed, match=r"% off; the check wants it exact"):
        folder_checks.check_workers_needed(
            lambda t, lat, s: costmodel.workers_needed(t, lat, s) + 2
        )
    with pytest.raises(feedback.CheckFailed, match=r"% off; the check wants it exact"):
        sizing_checks.check_samples_per_shard(lambda *args: samples_per_shard_right(*args) * 2)
