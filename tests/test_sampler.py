"""Map-style datasets under ``DistributedSampler``, read through real DataLoader workers: who reads
what per epoch with and without ``drop_last``, what ``set_epoch`` changes, and an exact mid-epoch
resume with torchdata's ``StatefulDataLoader``."""

import io
import warnings

import pytest
import torch
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from packdata import synthetic
from packdata.datasets import FolderDataset, IndexedTarDataset, WorkerSafeZipDataset
from packdata.packing import pack_tar, pack_zip
from packdata.rankaudit import Indexed, audit_ranks, read_per_rank, read_resumed

SIZE = 31  # not a multiple of 2 or 3: a sampler must drop or pad
SEED = 7
LOADER = {"batch_size": 4, "num_workers": 2}


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """A 31-image folder, and the same images as a ZIP and as a tar."""
    folder = tmp_path_factory.mktemp("sampler")
    root = synthetic.make_dataset(folder / "images", size=SIZE, image_size=16, progress=False)
    return {
        "folder": root,
        "zip": pack_zip(root, folder / "images.zip", progress=False),
        "tar": pack_tar(root, folder / "images.tar", progress=False),
    }


KINDS = {"folder": FolderDataset, "zip": WorkerSafeZipDataset, "tar": IndexedTarDataset}


@pytest.fixture(params=sorted(KINDS))
def dataset(request, roots):
    return KINDS[request.param](roots[request.param])


def sampler(dataset, world, rank, epoch=None, **options):
    """Rank ``rank``'s ``DistributedSampler``, at ``epoch`` when given."""
    made = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=SEED, **options)
    if epoch is not None:
        made.set_epoch(epoch)
    return made


def samplers(dataset, world, epoch=None, **options):
    """One ``DistributedSampler`` per rank."""
    return [sampler(dataset, world, rank, epoch, **options) for rank in range(world)]


def permutation(epoch):
    """The order every rank's sampler draws for ``epoch``: ``randperm`` seeded with seed + epoch."""
    generator = torch.Generator().manual_seed(SEED + epoch)
    return torch.randperm(SIZE, generator=generator).tolist()


@pytest.mark.parametrize("world", [2, 3])
def test_drop_last_reads_every_index_once_except_the_permutations_tail(dataset, world):
    per_rank = read_per_rank(dataset, samplers(dataset, world, epoch=1, drop_last=True), **LOADER)
    audit = audit_ranks(dataset, per_rank)
    assert [len(indices) for indices in per_rank] == [SIZE // world] * world
    assert audit.duplicates == {}
    # the last SIZE % world of this epoch's permutation: other samples next epoch
    assert audit.missing == sorted(permutation(1)[-(SIZE % world) :])
    assert f"{len(audit.missing)} never read" in str(audit)


@pytest.mark.parametrize("world", [2, 3])
def test_padding_repeats_the_first_indices_of_the_permutation(dataset, world):
    per_rank = read_per_rank(dataset, samplers(dataset, world, epoch=1), **LOADER)
    audit = audit_ranks(dataset, per_rank)
    padding = world - SIZE % world
    assert [len(indices) for indices in per_rank] == [-(-SIZE // world)] * world
    assert audit.missing == []
    assert audit.duplicates == dict.fromkeys(sorted(permutation(1)[:padding]), 2)
    # each rank takes every world-th index of the padded permutation, from its rank on
    padded = permutation(1) + permutation(1)[:padding]
    assert per_rank == [padded[rank::world] for rank in range(world)]
    for index in audit.duplicates:
        assert dataset.describe(index) in str(audit)


def test_set_epoch_reshuffles_and_forgetting_it_repeats_the_order(roots):
    dataset = FolderDataset(roots["folder"])
    remembered, forgotten = samplers(dataset, 2), samplers(dataset, 2)
    epochs = {"set_epoch": [], "forgotten": []}
    for epoch in range(2):
        for each in remembered:
            each.set_epoch(epoch)
        epochs["set_epoch"].append(read_per_rank(dataset, remembered, **LOADER))
        epochs["forgotten"].append(read_per_rank(dataset, forgotten, **LOADER))
    assert epochs["set_epoch"][0] != epochs["set_epoch"][1]
    assert epochs["forgotten"][0] == epochs["forgotten"][1] == epochs["set_epoch"][0]
    for per_rank in epochs["set_epoch"]:
        assert audit_ranks(dataset, per_rank).missing == []


def checkpointed(make_loader):
    """``make_loader`` whose first loader's state goes through ``torch.save`` and ``torch.load``,
    as a checkpoint on disk would."""

    class Saved(StatefulDataLoader):
        def state_dict(self):
            buffer = io.BytesIO()
            torch.save(super().state_dict(), buffer)
            return torch.load(io.BytesIO(buffer.getvalue()))

    return lambda: make_loader(Saved)


@pytest.mark.parametrize("batches", [1, 2, 3])  # 3 batches of 4 hold a rank's 11: all
def test_stateful_loader_resumes_mid_epoch_exactly(dataset, batches):
    world, epoch = 3, 4

    def make_loader(rank, kind=StatefulDataLoader):
        return kind(Indexed(dataset), sampler=sampler(dataset, world, rank, epoch), **LOADER)

    whole = read_per_rank(dataset, samplers(dataset, world, epoch=epoch), **LOADER)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*set_vital.*")  # torchdata 0.11 on torch 2.14
        parts = [
            read_resumed(checkpointed(lambda kind, r=rank: make_loader(r, kind)), batches)
            for rank in range(world)
        ]
    for rank, (before, after) in enumerate(parts):
        assert len(before) == min(batches * LOADER["batch_size"], len(whole[rank]))
        assert before + after == whole[rank]
    resumed = audit_ranks(dataset, [before + after for before, after in parts])
    assert resumed.missing == []
    assert resumed.duplicates == audit_ranks(dataset, whole).duplicates  # the padding, no more
