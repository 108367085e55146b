"""Presigned URLs: one name per object however often it is signed, and its secrets kept out of
messages.

    unsigned("http://host/b/train-000000.tar?X-Amz-Signature=ab12&versionId=7")
    # 'http://host/b/train-000000.tar?versionId=7': the cache's and the shard list's name
    withheld("GET http://host/b/train-000000.tar?X-Amz-Signature=ab12 failed")
    # 'GET http://host/b/train-000000.tar?X-Amz-Signature=(withheld) failed'

A presigned URL is a credential until it expires: whoever holds it reads the object. packdata's
errors and warnings name a shard by its URL, so the entry points that take shard URLs
(``secrets_withheld``) show it ``withheld``: host, key, date and expiry stay, to tell which object
failed and whether its URL had expired.
"""

import functools
import inspect
import re
import urllib.parse
from contextlib import suppress

# query parameters that only sign a URL (S3's signature versions 4 and 2): the same object
# presigned again, for a later job, gets new ones
SIGNING_PREFIX = "x-amz-"
SIGNING_PARAMETERS = frozenset({"awsaccesskeyid", "signature", "expires"})


def unsigned(url):
    """``url`` without the query parameters that sign it, so that one object presigned twice has
    one name; the others (an S3 ``versionId``, say) stay, as they choose what is read. A local
    path, which has no query (a ``?`` in it is part of a name), comes back as it is."""
    parts = urllib.parse.urlsplit(str(url))
    if parts.scheme not in ("http", "https"):
        return url
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    kept = [(name, value) for name, value in query if not _signs(name.lower())]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(kept)))


def _signs(parameter):
    return parameter.startswith(SIGNING_PREFIX) or parameter in SIGNING_PARAMETERS


URLS = re.compile(r"https?://[^\s'\"<>]+", re.IGNORECASE)
# the values that grant access (the signature, the key that made it, a session's token); they are
# hex, or %-escaped base64, so a value ends at any punctuation a message puts after a URL
SECRETS = re.compile(
    r"(?i)([?&](?:x-amz-signature|x-amz-credential|x-amz-security-token|signature|awsaccesskeyid)=)"
    r"[^&#\s'\"(),;:]+"
)
WITHHELD = "(withheld)"


def withheld(text):
    """``text`` with the secret values of every ``http(s)://`` URL in it replaced by ``WITHHELD``
    (local paths are left as they are)."""
    return URLS.sub(lambda url: SECRETS.sub(rf"\g<1>{WITHHELD}", url[0]), text)


# where exceptions keep text that their message shows, beside ``args``: OSError's, urllib's,
# UnicodeError's, subprocess's
TEXT_ATTRIBUTES = ("strerror", "filename", "filename2", "msg", "reason", "cmd", "url")


def withhold_secrets(error):
    """Withhold presigned URLs' secrets (``withheld``) from ``error``'s message and notes, and from
    those of the errors it was raised from or while handling, and of an exception group's; returns
    ``error``. Text an exception builds by itself (a custom ``__str__``) is beyond reach."""
    pending, done = [error], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in done:
            continue
        done.add(id(current))
        current.args = tuple(withheld(a) if isinstance(a, str) else a for a in current.args)
        for name in TEXT_ATTRIBUTES:
            if isinstance(getattr(current, name, None), str):
                with suppress(AttributeError, TypeError):  # read-only: it keeps its text
                    setattr(current, name, withheld(getattr(current, name)))
        if isinstance(getattr(current, "__notes__", None), list):
            current.__notes__[:] = [withheld(note) for note in current.__notes__]
        pending += [current.__cause__, current.__context__, *getattr(current, "exceptions", ())]
    return error


def secrets_withheld(function):
    """``function`` (a generator function too) whose errors show presigned URLs ``withheld``."""
    if inspect.isgeneratorfunction(function):

        @functools.wraps(function)
        def generator(*args, **kwargs):
            return iter_secrets_withheld(function(*args, **kwargs))

        return generator

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as error:
            withhold_secrets(error)
            raise

    return call


def iter_secrets_withheld(items):
    """Iterate over ``items``; an error on the way shows presigned URLs ``withheld``."""
    try:
        yield from items
    except Exception as error:
        withhold_secrets(error)
        raise
