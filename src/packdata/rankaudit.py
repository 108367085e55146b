"""Which samples each rank reads from a map-style dataset under a ``DistributedSampler``: read
through real DataLoaders (worker processes and all), then audited for samples read twice or never.

    samplers = [DistributedSampler(dataset, num_replicas=3, rank=rank) for rank in range(3)]
    per_rank = read_per_rank(dataset, samplers, batch_size=8, num_workers=2)
    print(audit_ranks(dataset, per_rank))   # reads per rank, samples read twice, samples missed

The ranks run one after another in this process, each with its own sampler: what a rank reads
depends only on its sampler (its rank, the world size, the seed and the epoch), not on the others.
"""

from collections import Counter
from dataclasses import dataclass

from torch.utils.data import DataLoader, Dataset


class Indexed(Dataset):
    """Item ``i`` of ``dataset`` reduced to ``i``, after its bytes were really read
    (``read_bytes``): what an audit needs to know, at a fraction of the decoding."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        self.dataset.read_bytes(index)
        return index


def read_indices(loader):
    """The sample indices ``loader`` (over an ``Indexed`` dataset) delivers, in order."""
    return [int(index) for batch in loader for index in batch]


def read_per_rank(dataset, samplers, *, loader=DataLoader, **loader_kwargs):
    """The indices each rank reads, one list per sampler in ``samplers`` (``samplers[r]`` is rank
    r's), through ``loader(Indexed(dataset), sampler=..., **loader_kwargs)``."""
    return [
        read_indices(loader(Indexed(dataset), sampler=sampler, **loader_kwargs))
        for sampler in samplers
    ]


@dataclass
class RankAudit:
    """What the ranks read together, against the ``size`` samples of the dataset."""

    per_rank: list  # indices each rank read, in order
    size: int
    names: list  # how to name each sample, by index

    @property
    def duplicates(self):
        """``{index: times read}`` of the samples read more than once."""
        counts = Counter(index for indices in self.per_rank for index in indices)
        return {index: times for index, times in sorted(counts.items()) if times > 1}

    @property
    def missing(self):
        """The indices no rank read, in order."""
        read = {index for indices in self.per_rank for index in indices}
        return [index for index in range(self.size) if index not in read]

    def __str__(self):
        lengths = sorted({len(indices) for indices in self.per_rank})
        per_rank = " or ".join(map(str, lengths))
        reads = sum(map(len, self.per_rank))
        lines = [
            f"{len(self.per_rank)} ranks × {per_rank} = {reads} reads of {self.size} samples: "
            f"{len(self.duplicates)} read more than once, {len(self.missing)} never read"
        ]
        lines += [
            f"  twice+: [{index}] {self.names[index]} ({times}×)"
            for index, times in self.duplicates.items()
        ]
        lines += [f"  never:  [{index}] {self.names[index]}" for index in self.missing]
        return "\n".join(lines)


def audit_ranks(dataset, per_rank):
    """A ``RankAudit`` of ``per_rank`` (``read_per_rank``'s answer) over ``dataset``; samples are
    named by the dataset's ``describe`` when it has one."""
    describe = getattr(dataset, "describe", str)
    return RankAudit(per_rank, len(dataset), [describe(index) for index in range(len(dataset))])


def read_resumed(make_loader, batches):
    """Read ``batches`` batches from ``make_loader()`` (a ``StatefulDataLoader`` over an
    ``Indexed`` dataset), take its ``state_dict()``, then finish the epoch with a fresh
    ``make_loader()`` that loads it, as a restarted job would. Returns ``(indices before, indices
    after)``."""
    loader = make_loader()
    batch_iterator, before = iter(loader), []
    for _ in range(batches):
        before += [int(index) for index in next(batch_iterator)]
    state = loader.state_dict()
    del batch_iterator  # its workers stop here, like the killed job's
    resumed = make_loader()
    resumed.load_state_dict(state)
    return before, read_indices(resumed)
