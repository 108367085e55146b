"""Checks for lesson 8's shuffle exercises: the scatter pass's bucket of a sample, and the gather
pass's shuffle of one bucket.

Each check runs the learner's function for real (the bucket function on keys shaped as the
dataset's, and also in fresh interpreters with other hash seeds, as the tasks of a cluster would
run it), builds the two-pass order of a
class-by-class input with it, compares the class mix per batch with a full shuffle's, and names the
mistake it sees.
"""

import subprocess
from collections import Counter

import numpy as np

from .. import shufflebench, twopass
from . import fresh
from .feedback import CheckFailed, passed

CLASSES, PER_CLASS, BUCKETS, BATCH = 10, 400, 8, 64
# class by class, as a tar of tars comes, named as its inner tars name them: n01440764_0, ...
WNIDS = [f"n{1440764 + 1000 * label:08d}" for label in range(CLASSES)]
KEYS = [f"{wnid}_{i}" for wnid in WNIDS for i in range(PER_CLASS)]
LABELS = np.repeat(np.arange(CLASSES), PER_CLASS)


def _mix_gap(order):
    """How many fewer classes a batch of the ``order`` holds than a full shuffle's batch."""
    full = shufflebench.quality(shufflebench.full_shuffle(len(KEYS)), LABELS, BATCH).classes
    return full - shufflebench.quality(order, LABELS, BATCH).classes, full


def _two_pass_order(bucket_for, shuffle):
    """Input positions in the order two passes write them, with these two functions."""
    buckets = [[] for _ in range(BUCKETS)]
    for position, key in enumerate(KEYS):
        buckets[bucket_for(key, 0, BUCKETS)].append(position)
    return np.concatenate([shuffle(list(b), 0, i) for i, b in enumerate(buckets) if b]).astype(int)


def _in_fresh_interpreter(function, keys, hash_seed):
    """``[function(key, 0, BUCKETS) for key in keys]`` computed by another Python process from the
    function's source, with ``PYTHONHASHSEED=hash_seed``; ``CheckFailed`` when it cannot be."""
    try:
        return fresh.run(
            function, keys, f"[int({{name}}(k, 0, {BUCKETS})) for k in args]", hash_seed
        )
    except fresh.Unreadable:
        raise CheckFailed(
            f"the check cannot read the source of {function!r}, so it cannot run it in another "
            "process as a cluster's tasks would: define bucket_for with def, in a cell"
        ) from None
    except subprocess.TimeoutExpired:
        raise CheckFailed(
            f"bucket_for took over 60 s for {len(keys)} keys in a fresh Python process: "
            "hash each key once, nothing more"
        ) from None
    except fresh.Failed as error:
        raise CheckFailed(
            f"bucket_for failed in a fresh Python process, as a scatter task on another machine "
            f"runs it: {error}. Use only its arguments, and modules or functions you import "
            "(hashlib, hashlib.blake2b): nothing else defined in the notebook"
        ) from None


def _still_together(got, other_seed):
    """The share of the pairs of keys in one bucket with seed 0 that share one with seed 1 too
    (1 / BUCKETS when seed 1 deals the keys anew)."""

    def pairs(counts):
        return sum(n * (n - 1) // 2 for n in counts.values())

    return pairs(Counter(zip(got, other_seed))) / max(pairs(Counter(got)), 1)


def _buckets(bucket_for, seed):
    """``bucket_for(key, seed, BUCKETS)`` of every key, each checked to be a bucket."""
    try:
        got = [bucket_for(key, seed, BUCKETS) for key in KEYS]
    except (ValueError, TypeError) as error:
        raise CheckFailed(
            f"bucket_for({KEYS[0]!r}, {seed}, {BUCKETS}) raised {type(error).__name__}: {error}. "
            "Keys are strings such as the dataset's, not numbers: hash their bytes"
        ) from None
    wrong = [b for b in got if not isinstance(b, (int, np.integer)) or not 0 <= b < BUCKETS]
    if wrong:
        raise CheckFailed(
            f"bucket_for returned {wrong[0]!r}: a bucket is an int in 0..{BUCKETS - 1}"
        )
    return got


def _check_seeded(got, other_seed):
    """Seed 1's buckets (``other_seed``) group the keys otherwise than seed 0's (``got``)."""
    if got == other_seed:
        raise CheckFailed(
            "seed 0 and seed 1 give the same buckets: mix the seed into the hash, or every epoch's "
            "conversion shuffles alike"
        )
    share = _still_together(got, other_seed)
    if share > 0.3:
        raise CheckFailed(
            f"{share:.0%} of the keys that share a bucket with seed 0 share one with seed 1 too, "
            f"where a new seed leaves about 1 in {BUCKETS} together: adding the seed to a bucket "
            "only renames it, and a checksum such as zlib.crc32 is linear, so a seed beside the "
            "key only shifts it. Hash seed and key together with hashlib (blake2b, sha256)"
        )


def _check_even(buckets, seed):
    """The ``buckets`` of the keys with ``seed`` are about the same size."""
    sizes = [buckets.count(bucket) for bucket in range(BUCKETS)]
    if max(sizes) > 1.3 * len(KEYS) / BUCKETS:
        raise CheckFailed(
            f"with seed {seed}, bucket sizes run from {min(sizes)} to {max(sizes)} for "
            f"{len(KEYS) // BUCKETS} on average: the largest bucket sets the memory"
        )


def _check_bucket_count(bucket_for, buckets=5):
    """With another number of ``buckets``, every key lands in one of them and all are used."""
    got = [bucket_for(key, 0, buckets) for key in KEYS]
    outside = [b for b in got if not 0 <= b < buckets]
    if outside or len(set(got)) < buckets:
        found = f"returned {outside[0]!r}" if outside else f"used only {sorted(set(got))}"
        raise CheckFailed(
            f"bucket_for(key, 0, {buckets}) {found}: take the number of buckets from the "
            "argument (hash % buckets), not a number of your own"
        )


def check_bucket_for(bucket_for):
    """``bucket_for(key, seed, buckets)``: an int in range, the same in every process, changed by
    the seed, spread evenly, and mixing a class-by-class input as well as a full shuffle."""
    got = _buckets(bucket_for, 0)
    if got != _buckets(bucket_for, 0):
        raise CheckFailed("bucket_for gave another bucket the second time: draw nothing unseeded")
    other_seed = _buckets(bucket_for, 1)
    _check_even(got, 0)
    _check_even(other_seed, 1)
    _check_bucket_count(bucket_for)
    sample = KEYS[::20]
    others = [_in_fresh_interpreter(bucket_for, sample, seed) for seed in (1, 2)]
    if others[0] != others[1] or others[0] != got[::20]:
        raise CheckFailed(
            "another Python process puts the same key in another bucket: str's hash() changes "
            "with every interpreter (PYTHONHASHSEED), so scatter tasks on other workers would "
            "disagree. Use a hash of the bytes (hashlib.blake2b, hashlib.sha256)"
        )
    _check_seeded(got, other_seed)
    gap, full = _mix_gap(_two_pass_order(bucket_for, twopass.shuffle_bucket))
    if gap > 0.5:
        raise CheckFailed(
            f"a batch of {BATCH} holds {full - gap:.1f} classes, a full shuffle's {full:.1f}: "
            "neighbouring samples land in the same bucket. The bucket must not follow the "
            "position (a range of keys); hash the key"
        )
    passed(f"buckets even, the same in every process, {full - gap:.1f} classes a batch")


def _check_samples_kept(shuffle_bucket):
    """Samples that are ``(key, label)`` pairs, as a bucket's are, come back as those pairs."""
    pairs = [(f"{i:06d}", i % 7) for i in range(20)]
    first = next(iter(shuffle_bucket(list(pairs), 0, 3)))
    if not (isinstance(first, tuple) and first in pairs):
        raise CheckFailed(
            f"samples such as {pairs[0]!r} came back as {first!r} ({type(first).__name__}): "
            "return the samples themselves, in a new order (rng.permutation makes a list of "
            "pairs a 2-D array of strings; permute the indices, or rng.shuffle a copy)"
        )


def check_shuffle_bucket(shuffle_bucket):
    """``shuffle_bucket(samples, seed, bucket)``: the same samples, each once, in a random order
    that depends on the seed and on the bucket, the same every run."""
    items = list(range(500))
    got = shuffle_bucket(list(items), 0, 3)
    if got is None:
        raise CheckFailed(
            "shuffle_bucket returned None: random.shuffle and rng.shuffle shuffle in place and "
            "return None; return the list"
        )
    _check_samples_kept(shuffle_bucket)
    got = [int(item) for item in got]
    if sorted(got) != items:
        missing, twice = set(items) - set(got), [i for i, n in Counter(got).items() if n > 1]
        raise CheckFailed(
            f"{len(missing)} sample(s) lost and {len(twice)} came twice: draw a permutation, not "
            "with replacement"
        )
    if got == items:
        raise CheckFailed("the bucket came back in its input order: shuffle it")
    if got != [int(item) for item in shuffle_bucket(list(items), 0, 3)]:
        raise CheckFailed("another run shuffled the bucket otherwise: seed the generator")
    next_bucket = [int(item) for item in shuffle_bucket(list(items), 0, 4)]
    next_seed = [int(item) for item in shuffle_bucket(list(items), 1, 3)]
    if got == next_bucket == next_seed:
        raise CheckFailed(
            "every seed and bucket came back in the same order: nothing random decides it. Draw "
            "a permutation from a generator seeded with the pair, np.random.default_rng([seed, "
            "bucket])"
        )
    if next_bucket == next_seed:
        raise CheckFailed(
            "seed 0's bucket 4 was shuffled as seed 1's bucket 3: seed + bucket makes every pair "
            "of the same sum collide. Seed with the pair, np.random.default_rng([seed, bucket])"
        )
    if got == next_bucket:
        raise CheckFailed(
            "buckets 3 and 4 were shuffled the same way: seed with (seed, bucket), or buckets of "
            "one size move their samples alike"
        )
    if got == [int(item) for item in shuffle_bucket(list(items), 1, 3)]:
        raise CheckFailed("seed 0 and seed 1 shuffle alike: use the seed")
    gap, full = _mix_gap(_two_pass_order(twopass.bucket_of, shuffle_bucket))
    if gap > 0.5:
        raise CheckFailed(
            f"a batch holds {full - gap:.1f} classes, a full shuffle's {full:.1f}: neighbours "
            "stay together. Draw a full permutation of the bucket, not a rotation, local swaps "
            "or a shuffle of chunks"
        )
    passed(f"each bucket a seeded permutation of its own, {full - gap:.1f} classes a batch")
