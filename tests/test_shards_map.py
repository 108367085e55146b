"""``packdata shards map``: tarproc's map of a shell command (or a Python function) over every
sample, in parallel, into new shards written atomically; the sources' own example runs as it is."""

import io
import shutil

import pytest
from PIL import Image

from packdata import cli
from packdata.shardread import iter_shard_samples
from packdata.shardwrite import write_shards

# the sources' example: tarproc -p 5 -c '…' small.tar > out.tar
TARPROC_EXAMPLE = "ls; gm mogrify -size 256x256 *.jpg -resize 256x256"


@pytest.fixture(scope="module")
def shards(tiny_dataset, tmp_path_factory):
    """3 shards of 20 tiny (64×64) samples each."""
    written = write_shards(
        tiny_dataset, tmp_path_factory.mktemp("shards"), maxcount=20, progress=False
    )
    return [str(info.path) for info in written]


def samples_by_key(paths):
    """``{key: sample}`` of every sample in ``paths``; a key seen twice fails the test."""
    found = {}
    for sample in iter_shard_samples([str(path) for path in paths]):
        assert sample["__key__"] not in found, f"{sample['__key__']} is in the output twice"
        found[sample["__key__"]] = sample
    return found


def mapped(shards, out, *how):
    """``packdata shards map`` over ``shards`` into ``out``, in 2 processes: the output shards."""
    assert cli.main(["shards", "map", "-p", "2", *shards, "-o", str(out), *how]) == 0
    return sorted(out.iterdir())


needs_gm = pytest.mark.skipif(
    shutil.which("gm") is None,
    reason="the sources' example needs GraphicsMagick's gm: apt-get install graphicsmagick",
)


@needs_gm
def test_the_sources_tarproc_example_maps_every_sample_once(shards, tmp_path, capsys):
    written = mapped(shards, tmp_path / "out", "-c", TARPROC_EXAMPLE)
    assert [path.name for path in written] == [path.rpartition("/")[2] for path in shards]
    before, after = samples_by_key(shards), samples_by_key(written)
    assert after.keys() == before.keys()
    for key, sample in after.items():
        assert sample["jpg"] != before[key]["jpg"] and sample["cls"] == before[key]["cls"]
        Image.open(io.BytesIO(sample["jpg"])).verify()  # still a whole JPEG
    assert "train-000002.tar\t20 samples" in capsys.readouterr().out


@needs_gm
def test_the_example_resizes_once_its_options_come_before_the_files(shards, tmp_path):
    # GraphicsMagick applies mogrify's options to the files named after them: the example's
    # trailing -resize is never applied, so its images keep their size (or grow, from -size)
    written = mapped(shards, tmp_path / "out", "-c", "gm mogrify -resize 256x256 *.jpg")
    sizes = {Image.open(io.BytesIO(s["jpg"])).size for s in samples_by_key(written).values()}
    assert sizes == {(256, 256)}  # 64×64 images, made to fit 256×256


def test_files_the_command_adds_or_removes_are_the_new_sample(shards, tmp_path):
    command = "mv sample.cls sample.label.txt && wc -c < sample.jpg > sample.size"
    written = mapped(shards, tmp_path / "out", "-c", command)
    for key, sample in samples_by_key(written).items():
        assert sorted(sample) == ["__key__", "__url__", "jpg", "label.txt", "size"], key
        assert int(sample["size"]) == len(sample["jpg"])


def test_a_python_function_maps_too(shards, tmp_path):
    written = mapped(shards, tmp_path / "out", "-f", "packdata.mapshards:resize_sample")
    sizes = {Image.open(io.BytesIO(s["jpg"])).size for s in samples_by_key(written).values()}
    assert sizes == {(32, 32)}


def test_a_failing_command_names_the_sample_and_leaves_no_shard(shards, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["shards", "map", shards[0], "-o", str(out), "-p", "1"]
    with pytest.raises(SystemExit) as exit:
        cli.main([*argv, "-c", "echo no such tool >&2; exit 3"])
    error = capsys.readouterr().err
    assert exit.value.code == 2 and "exited with status 3: no such tool" in error
    assert f"{shards[0]}: sample " in error
    assert not out.exists() or list(out.iterdir()) == []  # no shard, no temporary file


def test_a_function_that_cannot_be_imported_is_a_clear_error(shards, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["shards", "map", shards[0], "-o", str(tmp_path), "-f", "packdata:nothing"])
    assert "cannot import 'packdata:nothing'" in capsys.readouterr().err
