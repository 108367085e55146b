"""Lesson 7's checks pass the worked answers and name the typical mistakes."""

import os
from itertools import islice

import pytest
import torch
from torch.utils.data import IterableDataset

from packdata import shardwrite, synthetic
from packdata.course.feedback import CheckFailed
from packdata.course.resume_checks import check_distributed_indices, check_resumable_stream
from packdata.layout import raise_now
from packdata.streaming import shard_tuples

pytestmark = pytest.mark.filterwarnings("ignore:.*set_vital.*")
KEYS = ("__key__", "cls")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return synthetic.make_dataset(
        tmp_path_factory.mktemp("data") / "shapes", size=60, progress=False
    )


def write(root, folder, maxcount):
    written = shardwrite.write_shards(root, folder, maxcount=maxcount, progress=False)
    return [str(info.path) for info in written]


@pytest.fixture(scope="module")
def shards(root, tmp_path_factory):
    return write(root, tmp_path_factory.mktemp("shards"), maxcount=7)


@pytest.fixture(scope="module")
def long_shards(root, tmp_path_factory):
    """Shards longer than a batch, so that a place rounded to whole batches lands inside one."""
    return write(root, tmp_path_factory.mktemp("long"), maxcount=20)


class Stream(IterableDataset):
    """The worked answer, with switches for the mistakes learners make."""

    update_after_yield = ignore_loaded = keep_history = keep_shards = no_reset = False
    shard_start = skip_everywhere = never_update = count_batches = count_from_resume = False

    def __init__(self, shards):
        self.shards, self.shard, self.taken, self.seen = list(shards), 0, 0, []

    def __iter__(self):
        start, skip = (0, 0) if self.ignore_loaded else (self.shard, self.taken)
        skip = 0 if self.shard_start else skip
        for index in range(start, len(self.shards)):
            samples = shard_tuples(self.shards[index], ("__key__", "cls"), raise_now)
            first = skip if index == start or self.skip_everywhere else 0
            counted = 1 if self.count_from_resume else first + 1
            for taken, sample in enumerate(islice(samples, first, None), counted):
                if not (self.update_after_yield or self.never_update):
                    self.shard, self.taken = index, taken
                self.seen.append(sample[0])
                yield sample
                if self.update_after_yield:
                    self.shard, self.taken = index, taken
        if not self.no_reset:
            self.shard, self.taken = 0, 0

    def state_dict(self):
        taken = self.taken // 8 * 8 if self.count_batches else self.taken
        state = {"shard": self.shard, "taken": taken}
        if self.keep_shards:
            state["shards"] = [str(shard) for shard in self.shards]
        return state | {"seen": self.seen} if self.keep_history else state

    def load_state_dict(self, state):
        self.shard, self.taken = state["shard"], state["taken"]


def mistake(name):
    return type(name, (Stream,), {name: True})


class LazyPlace(Stream):
    """Right, but its place is made on the first pass: a fresh one has no state to give."""

    def __init__(self, shards):
        self.shards, self.seen = list(shards), []

    def __iter__(self):
        if not hasattr(self, "shard"):
            self.shard, self.taken = 0, 0
        return super().__iter__()


def test_a_place_shared_by_every_instance_and_never_reset_is_named(shards):
    class SharedPlace(LazyPlace):
        """Its place in one dict for every instance (a module-level variable), never reset."""

        place, no_reset = {}, True
        shard = property(
            lambda self: self.place.get("shard", 0), lambda self, v: self.keep(shard=v)
        )
        taken = property(
            lambda self: self.place.get("taken", 0), lambda self, v: self.keep(taken=v)
        )

        def keep(self, **place):
            self.place.update(place)

    with pytest.raises(CheckFailed, match=r"a new stream gave 0 samples .* module-level variable"):
        check_resumable_stream(SharedPlace, shards)


def test_a_place_shared_by_every_instance_and_reset_is_named(shards):
    class SharedPlace(Stream):
        """Its place in one dict for every instance (a module-level variable), reset at the end
        of each epoch: a new stream starts where the last one stopped."""

        place = {}
        shard = property(
            lambda self: self.place.get("shard", 0), lambda self, v: self.place.update(shard=v)
        )

        def __init__(self, shards):  # the place is not set here: it is the module's
            self.shards, self.seen = list(shards), []

        taken = property(
            lambda self: self.place.get("taken", 0), lambda self, v: self.place.update(taken=v)
        )

    with pytest.raises(CheckFailed, match=r"starts where another left off\. Keep the place in"):
        check_resumable_stream(SharedPlace, shards)


def test_a_stream_whose_place_is_made_on_the_first_pass_passes(shards, capsys):
    check_resumable_stream(LazyPlace, shards)
    assert capsys.readouterr().out.startswith("✓")


def test_a_state_that_is_the_streams_own_dict_passes(long_shards, capsys):
    class LivePlace(Stream):
        """Right, but state_dict hands out the dict it keeps updating, and loads the one given:
        a checkpoint file holds a copy, so the check must too."""

        def __init__(self, shards):
            super().__init__(shards)
            self.place = {"shard": 0, "taken": 0}

        shard = property(lambda self: self.place["shard"], lambda self, v: self.set("shard", v))
        taken = property(lambda self: self.place["taken"], lambda self, v: self.set("taken", v))

        def set(self, name, value):
            if "place" in vars(self):
                self.place[name] = value

        def state_dict(self):
            return self.place

        def load_state_dict(self, state):
            self.place = state

    check_resumable_stream(LivePlace, long_shards)
    assert "resumed exactly" in capsys.readouterr().out


def test_the_answer_passes(shards, capsys):
    check_resumable_stream(Stream, shards)
    assert "resumed exactly" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name, says",
    [
        ("update_after_yield", "repeated .* names the last sample handed out"),
        ("ignore_loaded", "began the epoch again: load_state_dict must keep the loaded place"),
        ("keep_history", "grows with what was read"),
        ("keep_shards", "holds shard names"),
        ("no_reset", "back to the first sample"),
        ("shard_start", "to the start of the shard it was in?"),
        ("skip_everywhere", "skip samples only in the shard you resume in"),
        ("never_update", "place {'shard': 0, 'taken': 0} is a fresh stream's.*as you yield"),
    ],
)
def test_each_mistake_is_named(shards, name, says):
    with pytest.raises(CheckFailed, match=says):
        check_resumable_stream(mistake(name), shards)


@pytest.mark.parametrize(
    "name, says",
    [
        ("shard_start", "went back 16 sample.*to the start of the shard it was in?"),
        ("count_batches", "went back 4 sample.*inside the shard it was in: .* samples handed out"),
        ("count_from_resume", "after a resume from batch 1: .* went back 8 .* add the samples"),
    ],
)
def test_going_back_inside_a_shard_is_told_from_going_to_its_start(long_shards, name, says):
    with pytest.raises(CheckFailed, match=says):
        check_resumable_stream(mistake(name), long_shards)


class ReadsFromTheStart(IterableDataset):
    """Resumes exactly, but keeps only a count: a restart reads every shard up to the cut again."""

    report = staticmethod(raise_now)  # what a shard that cannot be read goes to

    def __init__(self, shards):
        self.shards, self.count = list(shards), 0

    def __iter__(self):
        every = (s for shard in self.shards for s in shard_tuples(shard, KEYS, self.report))
        for count, sample in enumerate(islice(every, self.count, None), self.count + 1):
            self.count = count
            yield sample
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


class SkipsWhatItCannotRead(ReadsFromTheStart):
    """Keeps only a count too, and passes over shards it cannot open instead of raising."""

    report = staticmethod(lambda error, shard=None: None)


class ChecksItsShards(Stream):
    """The worked answer, with a constructor that looks at every shard, as a careful job does."""

    def __init__(self, shards):
        super().__init__(shards)
        self.sizes = [os.path.getsize(shard) for shard in self.shards]


def test_a_stream_that_looks_at_every_shard_when_built_passes(shards, capsys):
    check_resumable_stream(ChecksItsShards, shards)
    assert "opening no shard before the one it stopped in" in capsys.readouterr().out


def test_a_restart_that_passes_over_the_hidden_shards_is_named(shards):
    with pytest.raises(CheckFailed, match="with the shards before shard [1-9] hidden.*skip shards"):
        check_resumable_stream(SkipsWhatItCannotRead, shards)


def test_a_restart_that_reads_the_shards_before_the_cut_again_is_named(shards):
    says = r"opened shard 0 \(train-000000.tar\), though the checkpoint was taken in shard [1-9]"
    with pytest.raises(CheckFailed, match=says):
        check_resumable_stream(ReadsFromTheStart, shards)


def padded(n, world_size, epoch, drop_last, pad=lambda order, missing: order[:missing]):
    """DistributedSampler's permutation, cut or padded (by ``pad``) to a multiple of the ranks."""
    generator = torch.Generator()
    generator.manual_seed(epoch)
    order = torch.randperm(n, generator=generator).tolist()
    per_rank = n // world_size if drop_last else -(-n // world_size)
    total = per_rank * world_size
    while len(order) < total:
        order += pad(order, total - len(order))
    return order[:total]


def answer(n, world_size, rank, epoch, drop_last=False):
    return padded(n, world_size, epoch, drop_last)[rank::world_size]


def in_blocks(n, world_size, rank, epoch, drop_last=False):
    order = padded(n, world_size, epoch, drop_last)
    per_rank = len(order) // world_size
    return order[rank * per_rank : (rank + 1) * per_rank]


def padded_with_the_end(n, world_size, rank, epoch, drop_last=False):
    repeat_last = lambda order, missing: order[-1:] * missing  # noqa: E731
    return padded(n, world_size, epoch, drop_last, repeat_last)[rank::world_size]


def padded_once(n, world_size, rank, epoch, drop_last=False):
    pad_once = lambda order, missing: order[:missing] + [None] * (missing - len(order))  # noqa: E731
    return [
        i
        for i in padded(n, world_size, epoch, drop_last, pad_once)[rank::world_size]
        if i is not None
    ]


def globally_seeded(n, world_size, rank, epoch, drop_last=False):
    """Torch's indices, drawn from torch's global generator."""
    torch.manual_seed(0 + epoch)
    per_rank = n // world_size if drop_last else -(-n // world_size)
    return (torch.randperm(n).tolist() * world_size)[: per_rank * world_size][rank::world_size]


def cut_at_the_start(n, world_size, rank, epoch, drop_last=False):
    """Torch's permutation, but drop_last drops its first indices."""
    if not drop_last:
        return answer(n, world_size, rank, epoch)
    generator = torch.Generator()
    generator.manual_seed(epoch)
    order = torch.randperm(n, generator=generator).tolist()
    return order[n % world_size :][rank::world_size]


def test_the_index_answer_passes(capsys):
    check_distributed_indices(answer)
    assert "68 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, says",
    [
        (lambda n, w, r, e, d=False: answer(n, w, r, e, d)[::-1], "another order"),
        (lambda n, w, r, e, d=False: list(range(n))[r::w], "not shuffled"),
        (lambda n, w, r, e, d=False: answer(n, w, r, e + 1, d), "other indices than torch's"),
        (lambda n, w, r, e, d=False: answer(n, w, r, 0, d), "right in epoch 0.*seed \\+ epoch"),
        (lambda n, w, r, e, d=False: answer(n, w, r, e + r, d), "right for rank 0.*without the"),
        (lambda n, w, r, e, d=False: answer(n, w, r, 2 * e, d), "right in epoch 0"),
        (globally_seeded, r"\(12, 3, 0, 0, False\) reseeded .* torch.Generator of its own"),
        (in_blocks, r"a block of the permutation .* permutation\[rank::world_size\]"),
        (padded_with_the_end, "the padding is not torch's: DistributedSampler pads with its start"),
        (padded_once, r"repeated as often as needed: here the padding \(3\) is longer"),
        (cut_at_the_start, "the right permutation, cut at its start: drop_last keeps its first"),
    ],
)
def test_index_mistakes_are_named(wrong, says):
    with pytest.raises(CheckFailed, match=says):
        check_distributed_indices(wrong)
