"""Checks of lesson 6: the shard URLs the learner lists and presigns from a bucket of the
loopback S3 server.
"""

import time
from collections import Counter

from .feedback import (
    CheckFailed,
    passed,
)

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
