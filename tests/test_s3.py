"""The S3 path: moto's server on loopback, boto3 and s3fs pointed at it by one setting, shards read
back."""

import os
import re
import subprocess
import sys
import traceback
import urllib.error
import urllib.parse
import urllib.request
import warnings

import pytest
from torch.utils.data import DataLoader

from packdata import cli, imagefolder, mapshards, s3, shardread, shardwrite, tarscan, transfer
from packdata.datasets import IndexedTarDataset
from packdata.httpclient import file_name
from packdata.presigned import unsigned, withheld, withhold_secrets
from packdata.shardcache import HIT, MISS, ShardCache
from packdata.streaming import ShardDataset


@pytest.fixture(scope="module")
def server():
    with s3.S3Server() as running:
        yield running


@pytest.fixture(scope="module")
def shard_paths(tiny_dataset, tmp_path_factory):
    written = shardwrite.write_shards(
        tiny_dataset, tmp_path_factory.mktemp("shards"), maxcount=25, progress=False
    )
    return [info.path for info in written]


def test_serves_on_loopback_and_sets_the_endpoint_only_while_running(monkeypatch):
    monkeypatch.delenv(s3.ENDPOINT_VARIABLE, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "mine")
    with s3.S3Server() as running:
        assert urllib.parse.urlsplit(running.endpoint_url).hostname == "127.0.0.1"
        assert os.environ[s3.ENDPOINT_VARIABLE] == running.endpoint_url
        assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
    assert s3.ENDPOINT_VARIABLE not in os.environ
    assert os.environ["AWS_ACCESS_KEY_ID"] == "mine"


def test_a_second_server_stops_the_first_and_restores_the_environment_at_the_end(monkeypatch):
    assert s3.S3Server.exporting is None, (
        "this test must run before the module's server starts: it would stop it"
    )
    monkeypatch.delenv(s3.ENDPOINT_VARIABLE, raising=False)
    with s3.S3Server() as first, s3.S3Server() as second:  # a notebook cell run twice
        assert (
            first.endpoint_url is None and os.environ[s3.ENDPOINT_VARIABLE] == second.endpoint_url
        )
    # restored by the second server (the first was stopped already)
    assert s3.ENDPOINT_VARIABLE not in os.environ


def test_boto3_and_s3fs_read_back_every_shard_and_sample(server, shard_paths, tiny_dataset):
    s3.client().create_bucket(Bucket="roundtrip")
    urls = s3.upload_files(shard_paths, "roundtrip", prefix="train/")
    assert urls == [f"s3://roundtrip/train/{path.name}" for path in shard_paths]
    fs = s3.filesystem()
    assert sorted(fs.ls("roundtrip/train")) == [
        f"roundtrip/train/{path.name}" for path in shard_paths
    ]
    keys = []
    for url, path in zip(urls, shard_paths):
        body = fs.cat(url)
        assert body == path.read_bytes()
        keys += [
            name.split(".")[0] for name, _ in tarscan.iter_buffer(body) if name.endswith(".jpg")
        ]
    assert sorted(keys) == sorted(
        s["key"] for s in imagefolder.load_manifest(tiny_dataset)["samples"]
    )


def test_an_explicit_endpoint_is_the_same_single_setting(server, monkeypatch):
    monkeypatch.delenv(s3.ENDPOINT_VARIABLE)
    s3.client(server.endpoint_url).create_bucket(Bucket="explicit")
    assert "explicit" in [
        b["Name"] for b in s3.client(server.endpoint_url).list_buckets()["Buckets"]
    ]


def test_anonymous_http_reads_need_public_objects(server, shard_paths):
    s3.client().create_bucket(Bucket="anon")
    public = s3.upload_files(shard_paths[:1], "anon", prefix="public/", public=True)[0]
    private = s3.upload_files(shard_paths[:1], "anon", prefix="private/")[0]
    assert urllib.request.urlopen(s3.http_url(public)).read() == shard_paths[0].read_bytes()
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(s3.http_url(private))
    assert error.value.code == 403


def test_presigned_urls_are_signature_version_4_and_shard_dataset_reads_them(
    server, shard_paths, tiny_dataset
):
    client = s3.client()
    client.create_bucket(Bucket="presigned")
    s3.upload_files(shard_paths, "presigned", prefix="train/")
    urls = [
        client.generate_presigned_url(
            "get_object", Params={"Bucket": "presigned", "Key": f"train/{path.name}"}
        )
        for path in shard_paths
    ]
    # boto3 left to itself presigns with version 2 in the older regions, which new buckets refuse
    assert all("X-Amz-Algorithm=AWS4-HMAC-SHA256" in url for url in urls)
    keys = [key for key, _ in ShardDataset(urls, keys=("__key__", "cls"), decode=False)]
    assert sorted(keys) == sorted(
        s["key"] for s in imagefolder.load_manifest(tiny_dataset)["samples"]
    )


def test_shards_presigned_anew_are_the_same_shards_to_a_cache_and_to_a_saved_state(
    server, shard_paths, tmp_path
):
    client = s3.client()
    client.create_bucket(Bucket="resigned")
    s3.upload_files(shard_paths[:2], "resigned")

    def presigned(expires_s):
        return [
            client.generate_presigned_url(
                "get_object", Params={"Bucket": "resigned", "Key": path.name}, ExpiresIn=expires_s
            )
            for path in shard_paths[:2]
        ]

    today, tomorrow = presigned(3600), presigned(7200)  # a job restarted with new URLs
    assert today != tomorrow
    cache = ShardCache(tmp_path / "cache", max_bytes=10**9)
    outcomes = []
    for url in today + tomorrow:
        pin = cache.pin(url)
        outcomes.append(pin.outcome)
        pin.release()
    assert outcomes == [MISS, MISS, HIT, HIT]
    saved = ShardDataset(today, decode=False).state_dict()
    ShardDataset(tomorrow, decode=False).load_state_dict(saved)  # refused if the names differ


def test_only_the_signature_is_left_out_of_a_presigned_url():
    signed = (
        "http://127.0.0.1:9000/b/train-000001.tar?versionId=7&X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=k%2F20261128%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Expires=3600"
        "&X-Amz-SignedHeaders=host&X-Amz-Signature=ab12&X-Amz-Date=20261128T010000Z"
    )
    version_2 = "http://127.0.0.1:9000/b/train-000001.tar?AWSAccessKeyId=k&Signature=x&Expires=9"
    assert unsigned(signed) == "http://127.0.0.1:9000/b/train-000001.tar?versionId=7"
    assert unsigned(version_2) == "http://127.0.0.1:9000/b/train-000001.tar"
    assert file_name(signed) == file_name(version_2) == "train-000001.tar"
    assert unsigned("/scratch/run?expires=1/a.tar") == "/scratch/run?expires=1/a.tar"  # a path


def test_errors_show_a_presigned_url_without_its_secrets():
    token = "&X-Amz-Security-Token=t0k3n"
    signed = "http://h/b/a.tar?X-Amz-Credential=k%2F1&X-Amz-Date=D&X-Amz-Signature=ab12" + token
    shown = withheld(f"GET {signed} failed")
    assert shown == (
        "GET http://h/b/a.tar?X-Amz-Credential=(withheld)&X-Amz-Date=D"
        "&X-Amz-Signature=(withheld)&X-Amz-Security-Token=(withheld) failed"
    )
    assert withheld(shown) == shown  # withheld twice, as an error passes two entry points
    assert withheld("(http://h/a.tar?AWSAccessKeyId=k&Signature=x%2B&Expires=9): cut") == (
        "(http://h/a.tar?AWSAccessKeyId=(withheld)&Signature=(withheld)&Expires=9): cut"
    )
    local = "/scratch/run?signature=1/a.tar is missing"  # a path's '?' is part of a name
    assert withheld(local) == local
    try:
        try:
            raise FileNotFoundError(2, "gone", signed)
        except OSError as cause:
            raise ValueError(f"cannot read {signed!r}") from cause
    except ValueError as error:
        text = "".join(traceback.format_exception(withhold_secrets(error)))
    assert "ab12" not in text and "t0k3n" not in text and text.count("(withheld)") == 6


@pytest.fixture(scope="module")
def presigned(server, shard_paths, tmp_path_factory):
    """``{name: presigned URL}`` in a bucket of its own: a good shard, a missing one, one cut in a
    member, one cut right after a member (no end-of-archive blocks); ``"again"``: the good shard
    presigned once more."""
    client = s3.client()
    client.create_bucket(Bucket="secret")
    folder = tmp_path_factory.mktemp("damaged")
    data = shard_paths[0].read_bytes()
    (folder / "cut.tar").write_bytes(data[:3000])
    first_two = tarscan.scan_buffer(data, "first")[1]  # (name, start, size) of member 1
    (folder / "noend.tar").write_bytes(data[: first_two[1] + first_two[2] + -first_two[2] % 512])
    s3.upload_files([shard_paths[0], folder / "cut.tar", folder / "noend.tar"], "secret")

    def sign(key, expires_s=3600):
        return client.generate_presigned_url(
            "get_object", Params={"Bucket": "secret", "Key": key}, ExpiresIn=expires_s
        )

    names = {"good": shard_paths[0].name, "missing": "missing.tar", "cut": "cut.tar"}
    urls = {name: sign(key) for name, key in names.items()} | {"noend": sign("noend.tar")}
    return urls | {"again": sign(shard_paths[0].name, expires_s=60)}


def assert_withheld(text, url):
    secrets = re.findall(r"(?:Signature|Credential)=([^&]+)", url)
    assert file_name(url) in text and "X-Amz-Signature=(withheld)" in text
    assert not any(secret in text for secret in secrets), text


def shown_errors(urls, **options):
    """What a user sees of each way ``urls`` can fail: errors raised here and by a DataLoader
    worker, and the warning of a skip."""
    shown = []
    for workers in (0, 1):
        dataset = ShardDataset(urls, keys=("__key__",), decode=False, **options)
        with pytest.raises(Exception) as raised:
            list(DataLoader(dataset, batch_size=None, num_workers=workers))
        shown.append("".join(traceback.format_exception(raised.value)))
    dataset = ShardDataset(urls, keys=("__key__",), decode=False, errors="skip", **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(dataset)
    return shown + [str(warning.message) for warning in caught]


@pytest.mark.parametrize("cached", [False, True])
def test_a_shard_that_fails_is_named_without_its_signature(presigned, tmp_path, cached):
    options = {"cache": ShardCache(tmp_path / "cache", max_bytes=10**9)} if cached else {}
    for bad in (presigned["missing"], presigned["cut"]):
        for text in shown_errors([presigned["good"], bad], **options):
            assert_withheld(text, bad)
    with pytest.raises(ValueError, match="more than once") as raised:  # it names both URLs
        ShardDataset([presigned["good"], presigned["again"]], decode=False)
    assert_withheld(str(raised.value), presigned["again"])


def test_other_entry_points_name_a_shard_without_its_signature(presigned, tmp_path, capsys):
    with pytest.warns(UserWarning, match="without its end-of-archive blocks") as caught:
        shardread.count_shard_samples(presigned["noend"])
    assert_withheld(str(caught[0].message), presigned["noend"])
    with pytest.raises(FileNotFoundError) as raised:
        transfer.stage([presigned["missing"]], tmp_path / "scratch", progress=False)
    assert_withheld(str(raised.value), presigned["missing"])
    with pytest.raises(FileNotFoundError) as raised:  # the task's own error, not a wrapper's
        mapshards.map_shards(print, [presigned["missing"]], tmp_path / "mapped", progress=False)
    assert_withheld(str(raised.value), presigned["missing"])
    with pytest.raises(SystemExit):
        cli.main(["shards", "list", presigned["cut"]])
    assert_withheld(capsys.readouterr().err, presigned["cut"])


def test_range_reads_refuse_a_presigned_url_by_name(server, shard_paths):
    client = s3.client()
    client.create_bucket(Bucket="ranged")
    s3.upload_files(shard_paths[:1], "ranged")
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": "ranged", "Key": shard_paths[0].name}
    )
    with pytest.raises(ValueError, match=f"{shard_paths[0].name}.*presigned.*s3fs"):
        IndexedTarDataset(url)


def test_the_pipe_command_streams_an_object(server, shard_paths, tmp_path, monkeypatch):
    s3.client().create_bucket(Bucket="piped")
    url = s3.upload_files(shard_paths[:1], "piped")[0]
    # an interpreter whose path has a space, as under /Users/Jane Doe/
    python = tmp_path / "a folder" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    command = s3.pipe_url(url).removeprefix("pipe:")  # webdataset runs it through a shell
    assert (
        subprocess.run(command, shell=True, capture_output=True, check=True).stdout
        == shard_paths[0].read_bytes()
    )


@pytest.mark.parametrize("url", ["bucket/key", "s3://bucket", "http://x/y"])
def test_malformed_s3_urls_are_refused(url):
    with pytest.raises(ValueError, match="s3://bucket/key"):
        s3.split_url(url)
