"""Random augmentations that survive a resume: each sample's transform seeded from what names it.

    with seeded_by(seed, epoch, shard, sample_key):
        image = transform(image)            # torchvision's random crops, flips, colour jitter

A DataLoader seeds its workers from one number it draws at each ``iter()``; ``StatefulDataLoader``
saves that number and seeds resumed workers with it again, but not where their generators had got
to. After a resume, the workers draw the epoch's first numbers again, so every sample after the cut
gets another crop than in the run that was not cut. Seeded by the sample, the crop no longer
depends on which worker drew it, nor when: the same on any number of workers, before and after a
resume. ``ShardDataset(..., seeded_transform=True)`` does it around its ``transform``.
"""

import hashlib
import random
from contextlib import contextmanager

import torch

from .httpclient import file_name


def sample_seed(seed, epoch, shard, sample_key):
    """A 64-bit seed from the run's ``seed``, the ``epoch``, the shard's file name (the same where
    the shard is staged or presigned) and the sample's key. Through ``hashlib``: Python's
    ``hash()`` of a string differs in every process."""
    text = f"{seed}:{epoch}:{file_name(shard)}:{sample_key}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


@contextmanager
def seeded_by(seed, epoch, shard, sample_key):
    """Run the block with the global generators that torchvision's transforms draw from (torch's
    CPU generator; Python's ``random``, for v1's ``RandomChoice`` and ``RandomOrder``) seeded by
    ``sample_seed``, then give each its state back. Not numpy's: keeping its state costs about
    80 µs a sample, and a transform that draws from ``np.random`` is not repeated."""
    number = sample_seed(seed, epoch, shard, sample_key)
    states = torch.get_rng_state(), random.getstate()
    torch.default_generator.manual_seed(number)
    random.seed(number)
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
