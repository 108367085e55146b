"""Shards in an S3 bucket: a real S3-protocol server on loopback (moto's server mode), and clients
that find any S3 endpoint through one setting.

    with S3Server():  # sets AWS_ENDPOINT_URL (and dummy keys) while it runs
        s3 = client()  # boto3, SigV4: the same line works against AWS, MinIO, Ceph...
        s3.create_bucket(Bucket="shapes")
        upload_files(["train-000000.tar"], "shapes")
        filesystem().cat("shapes/train-000000.tar")  # s3fs reads it back

The one setting is the endpoint URL: boto3, s3fs and the AWS command line all read
``AWS_ENDPOINT_URL`` (or take ``endpoint_url=``). Unset, they talk to Amazon S3 itself with your
usual credentials.

``python -m packdata.s3 s3://bucket/key`` writes one object to standard output, like
``aws s3 cp s3://bucket/key -``: what webdataset's ``pipe:`` URLs need.
"""

import logging
import os
import shlex
import shutil
import sys
from pathlib import Path

from .childserver import ChildServer, serve_until_told

ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL"
TEST_SETTINGS = {  # moto accepts any keys; these only stop boto3 from looking for real ones
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3Server:
    """moto's S3 server on ``host`` (loopback), a free port, in a process of its own, as a real
    store would be; ``endpoint_url`` says where.

    While it runs, ``AWS_ENDPOINT_URL`` and dummy credentials are set in ``os.environ``
    (``export=False`` leaves the environment alone), so code and subprocesses written for S3 talk to
    it unchanged. One server exports at a time: starting another (a notebook cell run twice) stops
    the one before, so that none is left running and stopping the new one restores the environment
    as it was before both.
    """

    exporting = None  # the server whose endpoint os.environ holds

    def __init__(self, host="127.0.0.1", export=True, verbose=False):
        self.host, self.export, self.verbose = host, export, verbose
        self.endpoint_url = None
        self._server, self._saved = None, {}

    def start(self):
        if self._server is not None:
            return self
        if self.export and S3Server.exporting is not None:
            S3Server.exporting.stop()
        command = [sys.executable, "-m", __name__, "--serve", self.host, str(self.verbose)]
        server = ChildServer(command, "S3Server")
        host, port = server.start()  # kept once it has started: a failed start can be tried again
        self._server = server
        self.endpoint_url = f"http://{host}:{port}"
        if self.export:
            settings = {**TEST_SETTINGS, ENDPOINT_VARIABLE: self.endpoint_url}
            self._saved = {name: os.environ.get(name) for name in settings}
            os.environ.update(settings)
            S3Server.exporting = self
        return self

    def stop(self):
        if self._server is None:
            return
        self._server.stop()  # moto's server stops at once
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._server, self._saved, self.endpoint_url = None, {}, None
        if S3Server.exporting is self:
            S3Server.exporting = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    def __repr__(self):
        return f"S3Server at {self.endpoint_url or 'stopped'}"


def client(endpoint_url=None):
    """A boto3 S3 client: at ``endpoint_url``, else wherever ``AWS_ENDPOINT_URL`` points, else
    Amazon S3. It signs with Signature Version 4, presigned URLs too: left to itself, boto3
    presigns with version 2 in the older regions that still take it (us-east-1 among them),
    which buckets made since June 2020 refuse."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url or os.environ.get(ENDPOINT_VARIABLE),
        config=Config(signature_version="s3v4"),
    )


def filesystem(endpoint_url=None):
    """An ``s3fs.S3FileSystem`` with the same rule as ``client`` (a fresh one: never a cached one
    for an old endpoint)."""
    import s3fs

    endpoint_url = endpoint_url or os.environ.get(ENDPOINT_VARIABLE)
    return s3fs.S3FileSystem(endpoint_url=endpoint_url, skip_instance_cache=True)


def split_url(url):
    """``("bucket", "key")`` of ``s3://bucket/key``."""
    if not url.startswith("s3://") or "/" not in url[5:]:
        raise ValueError(f"expected s3://bucket/key, got {url!r}")
    bucket, key = url[5:].split("/", 1)
    return bucket, key


def upload_files(paths, bucket, prefix="", s3=None, public=False):
    """Upload local files as ``s3://bucket/<prefix><file name>``; return their ``s3://`` URLs in
    order.

    ``public=True`` makes each object public-read, so plain HTTP GETs without credentials may read
    it.
    """
    s3 = s3 or client()
    extra = {"ACL": "public-read"} if public else {}
    urls = []
    for path in map(Path, paths):
        key = prefix + path.name
        s3.upload_file(str(path), bucket, key, ExtraArgs=extra)
        urls.append(f"s3://{bucket}/{key}")
    return urls


def http_url(url, endpoint_url=None):
    """The plain HTTP address of ``s3://bucket/key`` on the endpoint (path style): readable without
    credentials only when the object is public."""
    bucket, key = split_url(url)
    endpoint_url = endpoint_url or os.environ.get(ENDPOINT_VARIABLE) or "https://s3.amazonaws.com"
    return f"{endpoint_url.rstrip('/')}/{bucket}/{key}"


def pipe_url(url):
    """A webdataset ``pipe:`` URL that streams ``s3://bucket/key`` through this module's command
    line."""
    return f"pipe:{shlex.quote(sys.executable)} -m packdata.s3 {shlex.quote(url)}"


def serve(host, verbose):
    """The server process (``python -m packdata.s3 --serve HOST VERBOSE``): moto's S3 server on a
    free port until told to stop (``childserver``)."""
    from moto.server import ThreadedMotoServer

    if not verbose:  # the server logs every request through werkzeug's logger
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address=host, port=0, verbose=verbose)
    server.start()
    serve_until_told(server.get_host_and_port(), lambda timeout: server.stop() or True)
    return 0


def main(argv=None):
    """Copy each ``s3://bucket/key`` given to standard output; or, with ``--serve``, be the server
    process of an ``S3Server``."""
    urls = sys.argv[1:] if argv is None else argv
    if urls[:1] == ["--serve"]:
        return serve(urls[1], urls[2] == "True")
    if not urls:
        print("usage: python -m packdata.s3 s3://bucket/key ...", file=sys.stderr)
        return 2
    s3 = client()
    for url in urls:
        bucket, key = split_url(url)
        shutil.copyfileobj(s3.get_object(Bucket=bucket, Key=key)["Body"], sys.stdout.buffer)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
