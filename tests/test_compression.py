"""Compressed shards: gzip, bzip2 and xz stream like plain tars (locally and over HTTP, and as
webdataset reads them); other compressions and damaged streams are refused by name."""

import bz2
import gzip
import io
import lzma
import tarfile
from pathlib import Path

import pytest
import webdataset

from packdata import s3
from packdata.compression import CompressionError, compression_of, decompressed
from packdata.datasets import IndexedTarDataset
from packdata.netstore import NetworkStore
from packdata.shardread import describe_shard, iter_shard_samples
from packdata.shardwrite import write_shards
from packdata.streaming import ShardDataset
from packdata.tario import TarFormatError
from packdata.transfer import stage

COMPRESSORS = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}
ZSTD_FRAME = b"\x28\xb5\x2f\xfd" + bytes(
    20
)  # the magic of a zstd frame is all it takes to be named


@pytest.fixture(scope="module")
def plain(tiny_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("plain")
    return [str(info.path) for info in write_shards(tiny_dataset, out, maxcount=20, progress=False)]


@pytest.fixture(scope="module", params=sorted(COMPRESSORS))
def compressed(request, plain, tmp_path_factory):
    """The same shards, compressed with one of the standard library's compressors."""
    out = tmp_path_factory.mktemp(request.param)
    paths = []
    for shard in plain:
        path = out / f"{shard.rsplit('/', 1)[-1]}.{request.param}"
        path.write_bytes(COMPRESSORS[request.param](Path(shard).read_bytes()))
        paths.append(str(path))
    return paths


def keys_and_labels(shards, **options):
    dataset = ShardDataset(shards, keys=("__key__", "cls"), decode=False, shuffle=False, **options)
    return list(dataset)


def test_compressed_shards_stream_the_same_samples(plain, compressed):
    assert keys_and_labels(compressed) == keys_and_labels(plain)
    assert len(ShardDataset(compressed)) == len(ShardDataset(plain))


def test_compressed_shards_stream_over_http(plain, compressed):
    folder = compressed[0].rsplit("/", 1)[0]
    with NetworkStore(folder) as store:
        urls = [store.url_for(path.rsplit("/", 1)[-1]) for path in compressed]
        assert keys_and_labels(urls) == keys_and_labels(plain)


def test_webdataset_reads_the_same_compressed_shards(plain, compressed):
    ours = [(key, label) for key, label in keys_and_labels(compressed)]
    theirs = [
        (sample["__key__"], sample["cls"])
        for sample in webdataset.WebDataset(compressed, shardshuffle=False, empty_check=False)
    ]
    assert ours == theirs


def test_tools_read_compressed_shards(plain, compressed):
    assert [s["__key__"] for s in iter_shard_samples(compressed)] == [
        s["__key__"] for s in iter_shard_samples(plain)
    ]
    assert describe_shard(compressed[0])["samples"] == describe_shard(plain[0])["samples"]


def test_staging_keeps_the_file_as_stored(compressed, tmp_path):
    staged = stage(compressed, tmp_path / "scratch", progress=False)
    assert [path.read_bytes() for path in staged] == [Path(p).read_bytes() for p in compressed]


def test_an_unsupported_compression_is_named(tmp_path):
    shard = tmp_path / "train-000000.tar.zst"
    shard.write_bytes(ZSTD_FRAME)
    assert compression_of(ZSTD_FRAME) == "zstd"
    with pytest.raises(CompressionError, match=r"000\.tar\.zst is zstd-compressed: not sup"):
        list(ShardDataset([str(shard)], decode=False))


def test_a_damaged_gzip_stream_names_the_shard(plain, tmp_path):
    shard = tmp_path / "cut.tar.gz"
    shard.write_bytes(gzip.compress(Path(plain[0]).read_bytes())[:300])
    with pytest.raises(CompressionError, match=r"cut\.tar\.gz: damaged gzip stream"):
        list(ShardDataset([str(shard)], decode=False))


def test_skipping_counts_an_unreadable_compressed_shard(plain, tmp_path):
    shard = tmp_path / "bad.tar.zst"
    shard.write_bytes(ZSTD_FRAME)
    dataset = ShardDataset([plain[0], str(shard)], decode=False, errors="skip", shuffle=False)
    with pytest.warns(UserWarning, match=r"skipped 1 shard\(s\) and 0 sample\(s\).*zstd"):
        assert len(list(dataset)) == 20


def test_random_access_needs_a_plain_tar_and_says_so(compressed):
    name = {".gz": "gzip", "bz2": "bzip2", ".xz": "xz"}[compressed[0][-3:]]
    with pytest.raises(TarFormatError, match=f"is {name}-compressed; .* decompress it first"):
        IndexedTarDataset(compressed[0])


def test_plain_bytes_pass_through_unchanged():
    assert decompressed(b"ustar and more", "x") == b"ustar and more"


@pytest.mark.parametrize("tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT])
def test_a_tar_whose_first_name_looks_compressed_is_read_as_a_tar(tmp_path, tar_format):
    first = "BZh0000"  # bzip2's magic, then a digit: bytes that start a bzip2 stream
    shard = tmp_path / "looks-compressed.tar"
    with tarfile.open(shard, "w", format=tar_format) as tar:
        for key in (first, "0001"):
            for extension, payload in (("jpg", b"x" * 100), ("cls", b"3")):
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    assert compression_of(shard.read_bytes()) is None
    assert [s["__key__"] for s in iter_shard_samples([str(shard)])] == [first, "0001"]


def test_gzip_shards_stream_from_s3_over_http_and_through_a_pipe(plain, tmp_path):
    gz = []
    for shard in plain:
        target = tmp_path / f"{Path(shard).name}.gz"
        target.write_bytes(gzip.compress(Path(shard).read_bytes()))
        gz.append(target)
    with s3.S3Server():
        s3.client().create_bucket(Bucket="gzipped")
        urls = s3.upload_files(gz, "gzipped", public=True)
        assert keys_and_labels([s3.http_url(url) for url in urls]) == keys_and_labels(plain)
        piped = webdataset.WebDataset([s3.pipe_url(url) for url in urls], shardshuffle=False)
        assert [s["__key__"] for s in piped] == [key for key, _ in keys_and_labels(plain)]
