"""Writing shards (from the folder or a torchvision dataset, by count and size, in parallel,
atomically), splitting and concatenating them, and the ``packdata shards`` verbs."""

import array
import io
import shutil
import tarfile
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
import torchvision
import webdataset

from packdata import cli, imagefolder, layout, samples, shardwrite
from packdata.mapshards import map_shards, resize_sample
from packdata.packing import TAR_MANIFEST, pack_tar
from packdata.shardread import describe_shard, iter_shard_samples
from packdata.shardwrite import ShardWriter, cat_shards, split_tar, write_shards
from packdata.streaming import ShardDataset
from packdata.tario import TarFormatError, member_header
from packdata.transfer import stage


def samples_of(paths):
    return {s["__key__"]: layout.members_of(s) for s in iter_shard_samples([str(p) for p in paths])}


@pytest.fixture(scope="module")
def manifest(tiny_dataset):
    return imagefolder.load_manifest(tiny_dataset)


@pytest.fixture(scope="module")
def written(tiny_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("written")
    return out, write_shards(tiny_dataset, out, maxcount=8, progress=False)


def test_every_sample_lands_in_exactly_one_shard_with_its_bytes_and_label(
    written, manifest, tiny_dataset
):
    out, infos = written
    assert [i.samples for i in infos] == [8] * 7 + [4]
    assert [i.path.name for i in infos] == [f"train-{n:06d}.tar" for n in range(8)]
    assert [i.bytes for i in infos] == [i.path.stat().st_size for i in infos]
    got = samples_of(i.path for i in infos)
    assert set(got) == {s["key"] for s in manifest["samples"]}
    for s in manifest["samples"]:
        assert got[s["key"]] == {
            "jpg": (tiny_dataset / s["path"]).read_bytes(),
            "cls": str(s["label"]).encode(),
        }


def test_members_follow_pack_tar_conventions(written):
    with tarfile.open(written[1][0].path) as tar:
        members = tar.getmembers()
    assert [m.name.split(".")[1] for m in members[:4]] == ["jpg", "cls", "jpg", "cls"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.mode) for m in members} == {
        (1_577_836_800, 0, 0, "", 0o644)
    }


def test_samples_are_shuffled_before_sharding_unless_asked_not_to(tiny_dataset, written, tmp_path):
    first = list(samples_of([written[1][0].path]))
    assert first != sorted(first)
    assert len({int(k) // 6 for k in first}) > 1  # the synthetic keys go class by class, 6 each
    ordered = write_shards(tiny_dataset, tmp_path, maxcount=8, shuffle_seed=None, progress=False)
    assert list(samples_of(i.path for i in ordered)) == sorted(
        first + list(samples_of(i.path for i in written[1][1:]))
    )


def test_the_same_input_gives_the_same_bytes_with_any_number_of_processes(
    tiny_dataset, written, tmp_path
):
    parallel = write_shards(tiny_dataset, tmp_path, maxcount=8, processes=2, progress=False)
    assert [p.path.read_bytes() for p in parallel] == [w.path.read_bytes() for w in written[1]]


def test_a_pool_started_once_serves_several_writes_with_the_same_bytes(
    tiny_dataset, written, tmp_path
):
    expected = [w.path.read_bytes() for w in written[1]]
    with ProcessPoolExecutor(2) as pool:
        for run in range(2):
            out = tmp_path / str(run)
            infos = write_shards(
                tiny_dataset, out, maxcount=8, processes=2, executor=pool, progress=False
            )
            assert [info.path.read_bytes() for info in infos] == expected


def test_maxsize_bounds_every_shard(tiny_dataset, tmp_path):
    infos = write_shards(tiny_dataset, tmp_path, maxcount=1000, maxsize=20_000, progress=False)
    assert len(infos) > 3 and all(i.bytes <= 20_000 for i in infos)
    assert sum(i.samples for i in infos) == 60


def test_a_map_style_torchvision_dataset_can_be_sharded(tmp_path):
    fake = torchvision.datasets.FakeData(size=12, image_size=(3, 16, 16), num_classes=3)
    infos = write_shards(fake, tmp_path, maxcount=5, payload="raw", progress=False)
    assert [i.samples for i in infos] == [5, 5, 2]
    got = {
        key: (image.shape, label)
        for image, label, key in ShardDataset(
            [str(i.path) for i in infos], keys=("npy", "cls", "__key__")
        )
    }
    assert got == {f"{n:06d}": ((3, 16, 16), fake[n][1]) for n in range(12)}


def contents(folder):
    """``{name: bytes}`` of everything in ``folder``, hidden files and folders included."""
    return {p.name: p.read_bytes() if p.is_file() else "folder" for p in folder.iterdir()}


@pytest.mark.parametrize("before", ["nothing", "an older set"])
def test_an_interrupted_run_leaves_the_folder_as_it_was(
    tiny_dataset, tmp_path, monkeypatch, before
):
    if before == "an older set":
        write_shards(tiny_dataset, tmp_path, maxcount=8, shuffle_seed=1, progress=False)
    expected = contents(tmp_path)
    calls = []

    def failing(*args):
        calls.append(1)
        if len(calls) == 40:  # in the 2nd shard of 30
            raise KeyboardInterrupt
        return args[0]

    monkeypatch.setattr(samples, "encode_payload", failing)
    with pytest.raises(KeyboardInterrupt):
        write_shards(tiny_dataset, tmp_path, maxcount=30, progress=False)
    assert contents(tmp_path) == expected


def test_rewriting_with_fewer_shards_removes_the_stale_ones(tiny_dataset, tmp_path):
    write_shards(tiny_dataset, tmp_path, maxcount=8, progress=False)
    write_shards(tiny_dataset, tmp_path, maxcount=30, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train-000000.tar", "train-000001.tar"]


@pytest.mark.parametrize(
    "limits",
    [{"maxcount": 0}, {"maxcount": float("nan")}, {"maxsize": 0}, {"maxsize": float("nan")}],
)
def test_bad_limits_are_refused(tmp_path, limits):
    with pytest.raises(ValueError, match="maxcount must be at least 1 and maxsize positive"):
        ShardWriter(tmp_path, **limits)


@pytest.mark.parametrize("processes", [0, 1.5])
def test_a_count_of_processes_that_is_no_whole_number_of_one_or_more_is_named(
    tiny_dataset, tmp_path, processes
):
    with pytest.raises(ValueError, match=f"processes must be .* got {processes}"):
        write_shards(tiny_dataset, tmp_path, processes=processes, progress=False)


def test_webdataset_sees_the_same_keys_and_labels(written, manifest):
    urls = [str(i.path) for i in written[1]]
    got = {
        key: int(label)
        for key, label in webdataset.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "cls")
    }
    assert got == {s["key"]: s["label"] for s in manifest["samples"]}


# --- split and cat --------------------------------------------------------------------------------


def test_split_keeps_samples_whole_and_leaves_the_manifest_out(tiny_dataset, tmp_path):
    archive = pack_tar(tiny_dataset, tmp_path / "all.tar", progress=False)
    infos = split_tar(archive, tmp_path / "split", maxcount=25)
    assert [i.samples for i in infos] == [25, 25, 10]
    got = samples_of(i.path for i in infos)
    assert TAR_MANIFEST not in got and list(got) == sorted(got)
    assert all(set(members) == {"jpg", "cls"} for members in got.values())


def test_splitting_an_empty_tar_is_refused_and_removes_nothing(written, tmp_path):
    empty = tmp_path / "empty.tar"
    tarfile.open(empty, "w").close()
    out = tmp_path / "out"
    split_tar(written[1][0].path, out, maxcount=3)
    expected = contents(out)
    with pytest.raises(ValueError, match=f"{empty} holds no samples"):
        split_tar(empty, out, maxcount=3)
    with pytest.raises(ValueError, match="no samples to write into"):
        ShardWriter(out, maxcount=3).close()
    assert contents(out) == expected and len(expected) == 3


def test_a_split_that_fails_part_way_leaves_the_old_shards_as_they_were(written, tmp_path):
    bad = tmp_path / "bad.tar"
    samples = list(iter_shard_samples([str(i.path) for i in written[1]]))
    with bad.open("wb") as file:  # 31 samples, the last one's key already used by the 4th
        for sample in [*samples[:30], samples[3]]:
            file.write(shardwrite.sample_bytes(sample["__key__"], layout.members_of(sample)))
        file.write(bytes(1024))
    out = tmp_path / "out"
    split_tar(written[1][-1].path, out, maxcount=1)
    expected = contents(out)
    with pytest.raises(ValueError, match=f"{bad}: duplicate key {samples[3]['__key__']!r}"):
        split_tar(bad, out, maxcount=8)  # fails in its 4th shard
    assert contents(out) == expected and len(expected) == 4


def test_a_split_into_the_set_it_belongs_to_is_refused_and_removes_nothing(written, tmp_path):
    out = tmp_path / "set"
    infos = split_tar(written[1][0].path, out, maxcount=3)
    expected = contents(out)
    with pytest.raises(ValueError, match="is one of the train-NNNNNN.tar shards of .*replaces"):
        split_tar(infos[1].path, out, maxcount=1)
    assert contents(out) == expected


@pytest.mark.parametrize(
    "key, members, said",
    [
        ("img.001", {"jpg": b"1"}, "last part has no dot"),  # would read back as key 'img'
        ("/abs", {"jpg": b"1"}, "relative path without '..'"),
        ("../up", {"jpg": b"1"}, "relative path without '..'"),
        ("a/..", {"jpg": b"1"}, "relative path without '..'"),
        ("k", {"masks/0.png": b"1"}, "without '/'"),  # would read back as another sample
        ("k", {"__key__": "k", "jpg": b"1"}, "leave out its __key__"),
        ("k", {}, "non-empty"),  # would be counted, and no member written
        ("k", {"txt": "text"}, r"got str.*\.encode\(\)"),
        ("k", {"f32": array.array("f", [1.0])}, "got array"),
        ("a\0b", {"jpg": b"1"}, "a NUL ends a name"),  # tarfile would read key 'a'
        ("k", {"JPG": b"1"}, "webdataset lowers when it reads: write 'jpg'"),
        ("k", {"npy": memoryview(np.zeros((2, 3), order="F"))}, "not in C order"),
    ],
)
def test_a_sample_that_would_not_read_back_as_written_is_refused_by_key(
    key, members, said, tmp_path
):
    with pytest.raises((ValueError, TypeError), match=said), ShardWriter(tmp_path / "out") as out:
        out.write(key, members)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.tar"))


def test_a_memoryview_of_wider_items_is_written_as_its_bytes(tmp_path):
    floats = memoryview(array.array("f", [1.0] * 200))  # len 200, 800 bytes
    info = shardwrite.write_tar(tmp_path / "a.tar", [("a", {"f32": floats}), ("b", {"t": b"x"})])
    with tarfile.open(info.path) as tar:
        assert [(m.name, m.size) for m in tar] == [("a.f32", 800), ("b.t", 1)]
    assert [s["__key__"] for s in iter_shard_samples([str(info.path)])] == ["a", "b"]


@pytest.mark.parametrize("key", ["x" * 120, "a" * 160 + "/b", "é" * 70])
def test_names_ustar_cannot_hold_get_pax_headers_that_every_reader_reads(key, tmp_path):
    info = shardwrite.write_tar(tmp_path / "long.tar", [(key, {"txt": b"1"}), ("k", {"txt": b"2"})])
    with tarfile.open(info.path) as tar:
        assert tar.getnames() == [f"{key}.txt", "k.txt"]
    assert [s["__key__"] for s in iter_shard_samples([str(info.path)])] == [key, "k"]
    found = webdataset.WebDataset(str(info.path), shardshuffle=False)
    assert [s["__key__"] for s in found] == [key, "k"]


def test_a_size_ustar_cannot_hold_gets_a_pax_header():
    header = member_header("video.mkv", 8 << 30)  # 8 GiB: past ustar's 11 octal digits
    with tarfile.open(fileobj=io.BytesIO(header + bytes(1024)), mode="r|") as tar:
        member = next(iter(tar))
    assert (member.name, member.size) == ("video.mkv", 8 << 30)


def test_cat_into_a_folder_is_refused_before_writing_anything(written, tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match=f"{folder} is a folder"):
        cat_shards([str(written[1][0].path)], folder)
    assert contents(tmp_path) == {"folder": "folder"} and contents(folder) == {}


def test_cat_then_split_gives_the_shards_back(written, tmp_path):
    joined = cat_shards([str(i.path) for i in written[1]], tmp_path / "all.tar")
    assert joined.samples == 60 and joined.bytes == joined.path.stat().st_size
    again = split_tar(joined.path, tmp_path / "again", maxcount=8)
    assert [a.path.read_bytes() for a in again] == [w.path.read_bytes() for w in written[1]]


def test_cat_refuses_duplicate_keys_and_writes_nothing(written, tmp_path):
    first = written[1][0].path
    copy = tmp_path / "copy.tar"
    copy.write_bytes(first.read_bytes())
    with pytest.raises(
        ValueError, match="duplicate key .* in .*train-000000.tar and in .*copy.tar"
    ):
        cat_shards([first, copy], tmp_path / "twice.tar")
    assert list(tmp_path.iterdir()) == [copy]


def test_describe_shard_counts_samples_and_lists_every_member(written):
    path = written[1][-1].path
    with tarfile.open(path) as tar:
        expected = [(member.name, member.size) for member in tar.getmembers()]
    info = describe_shard(str(path))
    assert (info["samples"], info["members"], info["bytes"]) == (4, 8, path.stat().st_size)
    assert info["extensions"] == {"cls": 4, "jpg": 4} and info["member_sizes"] == expected


def test_a_truncated_shard_is_named(written, tmp_path):
    cut = tmp_path / "cut.tar"
    cut.write_bytes(written[1][0].path.read_bytes()[:3000])
    with pytest.raises(TarFormatError, match="cut.tar is truncated"):
        describe_shard(str(cut))


def test_staging_keeps_each_shards_file_name(written, tmp_path):
    sources = [str(i.path) for i in written[1][:2]]
    staged = stage(sources, tmp_path / "scratch", threads=2, progress=False)
    assert [p.name for p in staged] == ["train-000000.tar", "train-000001.tar"]
    assert [p.read_bytes() for p in staged] == [i.path.read_bytes() for i in written[1][:2]]


def test_a_local_folder_name_is_not_read_as_a_url(written, tmp_path):
    folder = tmp_path / "run#1"
    folder.mkdir()
    source = folder / "train-000000.tar"
    source.write_bytes(written[1][0].path.read_bytes())
    assert [p.name for p in stage([str(source)], tmp_path / "scratch", progress=False)] == [
        "train-000000.tar"
    ]


def test_resizing_decoded_pixels_is_refused_by_name():
    with pytest.raises(ValueError, match="sample 'a' holds decoded pixels"):
        resize_sample({"__key__": "a", "__url__": "raw.tar", "npy": b"", "cls": b"1"})


def test_two_shards_of_the_same_file_name_are_refused_not_merged(written, tmp_path):
    sources = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        sources.append(tmp_path / folder / "train-000000.tar")
        sources[-1].write_bytes(written[1][len(sources)].path.read_bytes())
    expected = (
        f"{sources[0]} and {sources[1]} would both become {tmp_path / 'out' / 'train-000000.tar'}"
    )
    with pytest.raises(ValueError, match=expected):
        stage(sources, tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match=expected):
        map_shards(resize_sample, sources, tmp_path / "out", processes=1, progress=False)
    assert not (tmp_path / "out").exists()


# --- the command line -----------------------------------------------------------------------------


def run(capsys, *argv):
    code = cli.main(["shards", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_list_counts_samples_and_members(written, capsys):
    code, out, _ = run(capsys, "list", str(written[0] / "train-{000000..000001}.tar"))
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert "train-000000.tar\t8 samples\t16 members" in lines[0] and ".cls×8 .jpg×8" in lines[0]
    code, out, _ = run(capsys, "list", "--members", str(written[1][-1].path))
    assert len(out.splitlines()) == 1 + 8 and out.splitlines()[1].strip().endswith("bytes")


def test_cli_show_prints_keys_members_and_labels(written, manifest, capsys):
    code, out, _ = run(capsys, "show", "-n", "3", str(written[1][0].path))
    keys = list(samples_of([written[1][0].path]))[:3]
    labels = {s["key"]: s["label"] for s in manifest["samples"]}
    assert [line.split()[0] for line in out.splitlines()] == keys
    assert all(line.endswith(f"label {labels[key]}") for line, key in zip(out.splitlines(), keys))


def test_cli_split_and_cat(tiny_dataset, written, tmp_path, capsys):
    code, out, _ = run(
        capsys, "cat", *[str(i.path) for i in written[1]], "-o", str(tmp_path / "all.tar")
    )
    assert code == 0 and out.split("\t")[1] == "60 samples"
    code, out, _ = run(
        capsys,
        "split",
        str(tmp_path / "all.tar"),
        str(tmp_path / "parts"),
        "--maxcount",
        "8",
        "--prefix",
        "part",
    )
    assert code == 0 and len(out.splitlines()) == 8
    assert samples_of(sorted((tmp_path / "parts").glob("part-*.tar"))) == samples_of(
        i.path for i in written[1]
    )


def test_cli_writes_a_dataset_folder_as_shards(tiny_dataset, written, tmp_path, capsys):
    code, out, _ = run(
        capsys, "write", str(tiny_dataset), str(tmp_path / "out"), "--maxcount", "25", "-p", "2"
    )
    assert code == 0 and [line.split("\t")[1] for line in out.splitlines()] == [
        "25 samples",
        "25 samples",
        "10 samples",
    ]
    again = write_shards(tiny_dataset, tmp_path / "python", maxcount=25, progress=False)
    assert samples_of(sorted((tmp_path / "out").glob("*.tar"))) == samples_of(
        info.path for info in again
    )


def test_cli_write_from_a_folder_without_a_manifest_points_to_export(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(capsys, "write", str(tmp_path), str(tmp_path / "out"))
    assert exit_info.value.code == 2
    assert f"run 'packdata export FOLDER {tmp_path}' first" in capsys.readouterr().err


def test_cli_errors_are_one_line_naming_the_shard(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(capsys, "list", str(tmp_path / "nothere.tar"))
    assert exit_info.value.code == 2
    assert "nothere.tar" in capsys.readouterr().err


def test_cli_names_a_tar_with_a_negative_member_size(tmp_path, capsys):
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a.jpg")
        # once read a.jpg twice (and -1536 went round in circles)
        info.pax_headers = {"size": "-512"}
        tar.addfile(info)
    for argv in (
        ["list", str(path)],
        ["list", "--members", str(path)],
        ["split", str(path), str(tmp_path / "out")],
    ):
        with pytest.raises(SystemExit) as exit_info:
            run(capsys, *argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1
        assert f"{path}: member 'a.jpg' at offset 1024 has a negative size (-512)" in err


def test_an_image_that_cannot_be_resized_is_named_by_key_and_file(tiny_dataset, tmp_path):
    copy = shutil.copytree(tiny_dataset, tmp_path / "copy")
    sample = imagefolder.load_manifest(copy)["samples"][3]
    path = copy / sample["path"]
    path.write_bytes(path.read_bytes()[:-100])  # cut short, as a copy that stopped half-way
    with pytest.raises(
        ValueError, match=rf"sample '{sample['key']}' \(.*{path.name}\): .*truncated"
    ):
        write_shards(copy, tmp_path / "out", resize=8, progress=False)
