"""Random augmentations across a resume: with ``seeded_transform=True`` every sample gets the crop
it gets without a resume, on the same workers and on other numbers of them; without it, a resumed
loader's workers draw the epoch's first numbers again (what torchdata's StatefulDataLoader leaves to
the dataset)."""

import random
import warnings

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from torchvision.transforms import v2

from packdata.resume import loader_states, rest_of_epoch
from packdata.sampleseed import sample_seed
from packdata.streaming import ShardDataset

CROP = v2.RandomResizedCrop(16, antialias=True)


def dataset(shards, seeded=True):
    return ShardDataset(
        shards, keys=("__key__", "jpg"), transform=CROP, seeded_transform=seeded, buffer_size=5
    )


def loader(data, num_workers=2):
    return StatefulDataLoader(data, batch_size=None, num_workers=num_workers)


def resumed(shards, seeded, then=None, taken=10, job_seed=1):
    """The samples of a whole epoch, and of the same epoch cut after ``taken`` samples and resumed
    (by a loader with ``then`` workers from the rest of the epoch, or by the same layout); the cut
    job seeded with ``job_seed``, the whole epoch's with 0."""
    torch.manual_seed(0)
    whole = list(loader(dataset(shards, seeded)))
    torch.manual_seed(job_seed)
    first = loader(dataset(shards, seeded))
    samples = iter(first)
    before = [next(samples) for _ in range(taken)]
    state = first.state_dict()
    again = dataset(shards, seeded)
    if then is None:
        after = loader(again)
        after.load_state_dict(state)
    else:
        again.load_state_dict(rest_of_epoch(again, loader_states(state)))
        after = loader(again, then)
    return whole, before + list(after)


@pytest.mark.parametrize("then", [None, 1, 3])
def test_a_seeded_transform_gives_every_sample_the_same_crop_after_a_resume(tiny_shards, then):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        whole, cut = resumed(tiny_shards, seeded=True, then=then)
    assert len(cut) == len(whole)
    expected, got = dict(whole), dict(cut)
    differ = [key for key in expected if not torch.equal(expected[key], got[key])]
    assert not differ, f"other crops after the resume: {differ[:3]}"


def test_without_it_the_same_job_crops_otherwise_after_the_cut(tiny_shards):
    whole, cut = resumed(tiny_shards, seeded=False, taken=10, job_seed=0)
    same = [torch.equal(a, b) for (_, a), (_, b) in zip(whole, cut)]
    assert all(same[:10]), "the same torch seed: the same crops before the cut"
    assert not any(same[10:]), "StatefulDataLoader keeps no worker generator's place"


def shifted(image):
    """A transform that draws from Python's generator, as torchvision's RandomChoice does."""
    return image + random.randrange(50)


def test_pythons_draws_are_seeded_too(tiny_shards):
    def run(global_seed):
        random.seed(global_seed)
        return list(ShardDataset(tiny_shards, transform=shifted, seeded_transform=True))

    first, second = run(1), run(2)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, second))


def test_the_seed_names_the_shard_by_its_file_name():
    local = sample_seed(0, 3, "/scratch/train-000001.tar", "s1")
    presigned = "http://store/bucket/train-000001.tar?X-Amz-Signature=ab"
    assert local == sample_seed(0, 3, presigned, "s1")  # staged or presigned: the same crop
    assert local != sample_seed(0, 3, "/scratch/train-000002.tar", "s1")  # a key in two shards
    assert local != sample_seed(0, 4, "/scratch/train-000001.tar", "s1")  # another epoch


def test_seeding_leaves_this_processs_generator_where_it_was(tiny_shards):
    torch.manual_seed(5)
    list(dataset(tiny_shards))  # no workers: the transform runs in this process
    drawn = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(drawn, torch.rand(3))


def test_seeded_transform_without_a_transform_is_refused(tiny_shards):
    with pytest.raises(ValueError, match="pass transform= too"):
        ShardDataset(tiny_shards, seeded_transform=True)
