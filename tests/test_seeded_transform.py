"""Random augmentations across a resume: with ``seeded_transform=True`` every sample gets the crop
it gets without a resume, on the same workers and on other numbers of them; without it, a resumed
loader's workers draw other crops (what torchdata's StatefulDataLoader leaves to the dataset)."""

import warnings

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from torchvision.transforms import v2

from packdata.resume import loader_states, rest_of_epoch
from packdata.shardwrite import write_shards
from packdata.streaming import ShardDataset

CROP = v2.RandomResizedCrop(16, antialias=True)


@pytest.fixture(scope="module")
def shards(tiny_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    return [str(info.path) for info in write_shards(tiny_dataset, out, maxcount=9, progress=False)]


def dataset(shards, seeded=True):
    return ShardDataset(
        shards, keys=("__key__", "jpg"), transform=CROP, seeded_transform=seeded, buffer_size=5
    )


def loader(data, num_workers=2):
    return StatefulDataLoader(data, batch_size=None, num_workers=num_workers)


def resumed(shards, seeded, then=None, taken=10):
    """The samples of a whole epoch, and of the same epoch cut after ``taken`` samples and resumed
    (by a loader with ``then`` workers from the rest of the epoch, or by the same layout)."""
    torch.manual_seed(0)
    whole = list(loader(dataset(shards, seeded)))
    torch.manual_seed(1)  # a new job, seeded otherwise
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
def test_a_seeded_transform_gives_every_sample_the_same_crop_after_a_resume(shards, then):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        whole, cut = resumed(shards, seeded=True, then=then)
    assert len(cut) == len(whole)
    expected, got = dict(whole), dict(cut)
    differ = [key for key in expected if not torch.equal(expected[key], got[key])]
    assert not differ, f"other crops after the resume: {differ[:3]}"


def test_without_it_a_resumed_loader_draws_other_crops(shards):
    whole, cut = resumed(shards, seeded=False)
    expected, got = dict(whole), dict(cut)
    assert any(not torch.equal(expected[key], got[key]) for key in expected)


def test_seeding_leaves_this_processs_generator_where_it_was(shards):
    torch.manual_seed(5)
    list(dataset(shards))  # no workers: the transform runs in this process
    drawn = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(drawn, torch.rand(3))


def test_seeded_transform_without_a_transform_is_refused(shards):
    with pytest.raises(ValueError, match="pass transform= too"):
        ShardDataset(shards, seeded_transform=True)
