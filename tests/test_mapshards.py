"""A map over shards: one task per shard, every sample once in the output, each output written
whole or not at all, and a run again after a crash maps only what is missing."""

import io
import json
import multiprocessing
import os
import tarfile

import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from packdata import layout
from packdata.mapshards import map_shards, resize_sample, resize_shard
from packdata.shardread import iter_shard_samples
from packdata.shardwrite import write_shards, write_tar


@pytest.fixture(scope="module")
def shards(tiny_dataset, tmp_path_factory):
    written = write_shards(
        tiny_dataset, tmp_path_factory.mktemp("shards"), maxcount=16, progress=False
    )
    return [info.path for info in written]


def labels_by_key(paths):
    """``{key: label bytes}`` of every sample in ``paths``; a key seen twice fails the test."""
    found = {}
    for sample in iter_shard_samples([str(path) for path in paths]):
        assert sample["__key__"] not in found, f"{sample['__key__']} is in the output twice"
        found[sample["__key__"]] = sample["cls"]
    return found


def image_size(sample):
    return Image.open(io.BytesIO(sample["jpg"])).size


def test_resize_shard_writes_every_sample_once_resized_in_a_pool(shards, tmp_path):
    jobs = [(path, tmp_path / path.name) for path in shards]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        done = dict(pool.imap_unordered(resize_shard, jobs))
    assert sorted(done) == sorted(target for _, target in jobs)
    assert sum(done.values()) == len(labels_by_key(shards))
    assert labels_by_key(done) == labels_by_key(shards)
    assert {image_size(s) for s in iter_shard_samples([str(p) for p in done])} == {(32, 32)}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in shards)


def test_resize_shard_leaves_nothing_under_the_target_name_when_it_fails(tmp_path):
    raw = tmp_path / "raw.tar"  # decoded pixels, which resize_sample refuses
    write_tar(raw, [("000000", {"npy": b"\x93NUMPY", "cls": b"1"})])
    with pytest.raises(ValueError, match="holds decoded pixels"):
        resize_shard((raw, tmp_path / "out.tar"))
    assert list(tmp_path.iterdir()) == [raw]  # neither the shard nor its temporary file


def test_resize_shard_writes_the_same_bytes_every_run(shards, tmp_path):
    first, second = (resize_shard((shards[0], tmp_path / name))[0] for name in ("a.tar", "b.tar"))
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as tar:  # not the clock's time, which would differ a second later
        assert {member.mtime for member in tar} == {0}


@pytest.mark.parametrize(
    ("size", "resized"), [((64, 40), (51, 32)), ((40, 47), (32, 37)), ((16, 16), (32, 32))]
)
def test_resize_sample_keeps_the_aspect_ratio_as_torchvision_does(size, resized):
    image = io.BytesIO()
    Image.new("RGB", size, "navy").save(image, format="JPEG")
    sample = resize_sample({"__key__": "w", "jpg": image.getvalue(), "cls": b"3"}, size=32)
    assert image_size(sample) == resized and sample["cls"] == b"3"
    height, width = v2.Resize(32)(torch.zeros(3, size[1], size[0])).shape[1:]
    assert resized == (width, height)  # what torchvision's Resize(32) gives


def test_resize_sample_names_the_shard_and_sample_it_cannot_resize():
    sample = {"__url__": "shards/a.tar", "__key__": "k7", "jpg": b"not a jpeg", "cls": b"1"}
    with pytest.raises(ValueError, match=r"shards/a.tar: sample 'k7': its .jpg cannot be resized"):
        resize_sample(sample)
    image = io.BytesIO()
    Image.new("RGB", (8, 8)).save(image, format="JPEG")
    with pytest.raises(ValueError, match="at least 1 pixel, got 0"):
        resize_sample({**sample, "jpg": image.getvalue()}, size=0)


def test_map_shards_keeps_outputs_already_there_and_maps_only_the_missing(shards, tmp_path):
    out = tmp_path / "out"
    first = map_shards(resize_sample, shards, out, processes=1, progress=False)
    assert labels_by_key(p for p, _ in first) == labels_by_key(shards)
    kept, lost = first[0][0], first[1][0]
    kept_time = kept.stat().st_mtime_ns
    lost.unlink()  # as if its task had crashed before the rename
    again = map_shards(resize_sample, shards, out, processes=1, progress=False)
    assert again == first  # the same paths and sample counts, in input order
    assert kept.stat().st_mtime_ns == kept_time and lost.exists()
    assert labels_by_key(p for p, _ in again) == labels_by_key(shards)


def test_progress_off_a_terminal_is_a_line_each_tenth_of_the_shards(tiny_dataset, tmp_path, capsys):
    # a notebook's or a log's saved output glues carriage-return progress into one line
    written = write_shards(tiny_dataset, tmp_path / "in", maxcount=4, progress=False)
    shards = [info.path for info in written]  # 15: a line every second shard, and the last
    map_shards(resize_sample, shards, tmp_path / "out", processes=1)
    lines = capsys.readouterr().out.splitlines()
    step = -(-len(shards) // 10)
    done = [*range(step, len(shards), step), len(shards)]
    assert [line.split()[1] for line in lines] == [f"{n}/{len(shards)}" for n in done]
    assert not any("\r" in line for line in lines)


def test_a_map_into_the_shards_own_folder_is_refused(shards):
    with pytest.raises(ValueError, match="would be its own output: map into another folder"):
        map_shards(resize_sample, shards, shards[0].parent, processes=1, progress=False)


def parse_json(sample):
    return {"w": str(json.loads(sample["json"])["w"]).encode()}


def members_or_nothing(sample):
    return {} if sample["__key__"] == "k1" else {"txt": sample["txt"]}


def whole_sample(sample):
    return sample  # its __key__ and __url__ are no members


@pytest.mark.parametrize(
    "function, said",
    [
        (parse_json, "parse_json: JSONDecodeError"),
        (members_or_nothing, "members_or_nothing: ValueError: sample 'k1': got {}"),
        (whole_sample, "whole_sample: ValueError: .*'__key__' is no member"),
    ],
)
def test_an_error_in_the_mapped_function_names_the_shard_and_sample(function, said, tmp_path):
    shard = tmp_path / "in.tar"
    samples = [("k0", {"json": b'{"w": 1}', "txt": b"a"}), ("k1", {"json": b"{bad", "txt": b"b"})]
    write_tar(shard, samples)
    with pytest.raises(ValueError, match=f"{shard}: sample '(k0|k1)': {said}"):
        map_shards(function, [shard], tmp_path / "out", processes=1, progress=False)
    assert not list((tmp_path / "out").glob("*"))


def dies_on_its_third_sample(sample, seen=[]):  # noqa: B006 (counts this process's samples)
    seen.append(sample["__key__"])
    if len(seen) == 3:
        os._exit(137)  # as the out-of-memory killer would end it
    return layout.members_of(sample)


def test_an_output_that_cannot_be_written_is_said_as_it_is_from_a_pool(shards, tmp_path):
    (tmp_path / "afile").write_text("a file, not a folder")
    with pytest.raises(NotADirectoryError, match="afile"):
        map_shards(layout.members_of, shards[:2], tmp_path / "afile" / "out", processes=2)


def test_a_task_whose_process_dies_is_named_and_leaves_nothing_behind(shards, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match=r"train-0000\d\d\.tar: its task did not finish"):
        map_shards(dies_on_its_third_sample, shards[:2], out, processes=2, progress=False)
    assert not [path for path in out.iterdir() if ".partial-" in path.name]
