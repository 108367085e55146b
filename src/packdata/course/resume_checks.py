"""Checks for lesson 7's exercises: a stream that resumes mid-epoch, and DDP's index split.

Each check runs the learner's code for real (a ``StatefulDataLoader`` saved and restored at several
steps; torch's own ``DistributedSampler`` as the reference) and names the mistake it sees.
"""

import copy
import json
import os
import tempfile
from bisect import bisect_right
from itertools import islice
from pathlib import Path

from .feedback import CheckFailed, passed

KEYS = ("__key__", "cls")
BATCH = 8


def _loader(stream):
    """A ``StatefulDataLoader`` over ``stream`` in this process, batches as lists of items."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(stream, batch_size=BATCH, collate_fn=list)


def _keys(batches):
    """The sample keys of ``batches``, in order."""
    return [str(item[0]) for batch in batches for item in batch]


def _resumed(stream_class, shards, cut):
    """Keys read before a checkpoint taken after ``cut`` batches, the loader state saved, and a
    fresh loader that loaded it."""
    first = _loader(stream_class(shards))
    batches = iter(first)
    before = _keys(islice(batches, cut))
    if len(before) < cut * BATCH:
        raise CheckFailed(
            f"a new stream gave {len(before)} samples where the epoch has more: did it start "
            "from a place another instance left behind (a module-level variable, say)? Keep the "
            "place in self, and go back to the first sample once an epoch ends."
        )
    state = copy.deepcopy(first.state_dict())  # as a checkpoint file keeps it
    return before, state, _restarted(stream_class(shards), state)


def _restarted(stream, state):
    """A fresh loader over ``stream`` (a new one), resumed from a copy of the loader ``state``."""
    loader = _loader(stream)
    loader.load_state_dict(copy.deepcopy(state))
    return loader


def _state_problem(state, n_samples, shards):
    """Why a dataset state is not a checkpoint's: missing, not JSON, holding the shard list, or
    growing with the epoch."""
    if state is None:
        return (
            "the loader saved no dataset state: give the class state_dict() and "
            "load_state_dict(state); StatefulDataLoader calls them"
        )
    try:
        text = json.dumps(state)
    except TypeError as error:
        return f"state_dict() returned something JSON cannot hold ({error}): keep to ints and strs"
    size = len(text)
    if any(str(shard) in text for shard in shards):
        return (
            "state_dict() holds shard names: the dataset is built again with its shard list, so "
            "keep only the place (a shard's number, how far into it)"
        )
    if size > 200 or size > n_samples:
        return (
            f"state_dict() is {size} characters of JSON: it grows with what was read. Keep where "
            "the next sample is (a shard and a place in it), not a record of what was read"
        )
    return None


def _fresh_state(stream_class, shards):
    """The state of a stream not yet iterated; None when it has none to give then (its place is
    set in ``__iter__``, say)."""
    try:
        return stream_class(shards).state_dict()
    except Exception:  # any: it is the learner's code, and the other checks say what is wrong
        return None


def _shared(fresh, now):
    """Why a new stream's state ``now`` differs from ``fresh``, a new stream's before any other
    had moved; None when it does not."""
    if fresh is None or now == fresh:
        return None
    return (
        f"a new stream's state is {now!r}, not {fresh!r} as before any stream had moved: it "
        "starts where another left off. Keep the place in self (set in __init__), not in a "
        "module or class variable that every stream shares"
    )


def _unmoved(state, fresh, taken):
    """Why a state saved after ``taken`` samples is a ``fresh`` stream's; None when it is not."""
    if fresh is None or state != fresh:
        return None
    return (
        f"the saved place {state!r} is a fresh stream's, though {taken} samples were handed out: "
        "update the place as you yield, before each yield to the sample after it"
    )


def _shard_starts(shards):
    """Where each shard's first sample sits in the epoch."""
    from packdata.layout import raise_now
    from packdata.streaming import shard_tuples

    starts = [0]
    for shard in shards:
        starts.append(starts[-1] + sum(1 for _ in shard_tuples(shard, KEYS, raise_now)))
    return starts[:-1]


def _cut_problem(before, after, whole, shards):
    """What went wrong at the cut, compared with the uninterrupted epoch; None when nothing."""
    cut = len(before)
    if before + after == whole:
        return None
    if after == whole:
        return (
            "the restarted loader began the epoch again: load_state_dict must keep the loaded "
            "place, and __iter__ start from it"
        )
    if after[:1] == before[-1:]:
        return (
            f"the restarted loader repeated {before[-1]!r}, the last sample before the checkpoint: "
            "the saved place names the last sample handed out instead of the next one (update it "
            "before you yield, to the next sample's place), or __iter__ skips one too few"
        )
    if after == whole[cut + 1 :]:
        return (
            f"the restarted loader skipped {whole[cut]!r}, the first sample after the checkpoint: "
            "the saved place is one too far"
        )
    start = len(whole) - len(after)
    if 0 < start < cut and whole[start:] == after:
        went = f"the restarted loader went back {cut - start} sample(s), to {after[0]!r}"
        if start in _shard_starts(shards):
            return (
                f"{went}: to the start of the shard it was in? Save how far into that shard it "
                "got as well, and skip that many"
            )
        return (
            f"{went}, inside the shard it was in: the place must count the samples handed out, "
            "exactly, not batches or a round number"
        )
    if cut < start < len(whole) and whole[start:] == after:
        return (
            f"the restarted loader jumped {start - cut} sample(s) ahead, to {after[0]!r}: to the "
            "next shard? Resume inside the shard it was in, after the samples it handed out"
        )
    lost, again = set(whole) - set(before + after), [key for key in after if key in set(before)]
    if lost and not again and set(after) <= set(whole[cut:]):
        return (
            f"after the restart {len(lost)} sample(s) never came, none came twice: skip samples "
            "only in the shard you resume in; the shards after it start at their first sample"
        )
    return f"after the restart {len(again)} sample(s) came twice and {len(lost)} never came"


def check_resumable_stream(stream_class, shards):
    """``stream_class(shards)``: an ``IterableDataset`` of ``(key, label)`` that a
    ``StatefulDataLoader`` saves after any batch and a fresh one resumes exactly, epoch after
    epoch."""
    fresh = _fresh_state(stream_class, shards)  # before any stream has moved
    whole = _keys(_loader(stream_class(shards)))
    n_batches = -(-len(whole) // BATCH)
    if len(whole) != len(set(whole)):
        raise CheckFailed(f"one epoch gave {len(whole)} items but {len(set(whole))} keys")
    # latest first: there a restart that goes back to the start of its shard goes back furthest
    for cut in sorted({1, n_batches // 3, n_batches // 2, n_batches - 1} - {0}, reverse=True):
        before, state, resumed = _resumed(stream_class, shards, cut)
        state = state.get("dataset_state")
        problem = (
            _state_problem(state, len(whole), shards)
            or _shared(fresh, _fresh_state(stream_class, shards))
            or _unmoved(state, fresh, len(before))
            or _cut_problem(before, _keys(resumed), whole, shards)
        )
        if problem:
            raise CheckFailed(f"checkpoint after batch {cut} of {n_batches}: {problem}.")
    _check_second_cut(stream_class, shards, whole)
    straight = _check_straight_to_its_shard(stream_class, shards, whole, n_batches - 1)
    opening = ", opening no shard before the one it stopped in" if straight else ""
    loader = _loader(stream_class(shards))
    epochs = [_keys(loader), _keys(loader)]
    if epochs[1] != whole:
        raise CheckFailed(
            f"the second epoch of one loader read {len(epochs[1])} of {len(whole)} samples: "
            "once an epoch ends, the place must go back to the first sample"
        )
    passed(
        f"resumed exactly after batches {sorted({1, n_batches // 3, n_batches // 2})} and "
        f"{n_batches - 1} of {n_batches}, and 1 batch after a resume: all {len(whole)} samples "
        f"once, in the same order{opening}; "
        f"the state is {len(json.dumps(state))} characters of JSON."
    )


def _check_second_cut(stream_class, shards, whole):
    """A checkpoint taken one batch after a resume (from batch 1, inside the first shard when a
    shard is longer than two batches) resumes exactly too."""
    before, _, resumed = _resumed(stream_class, shards, 1)
    middle = _keys(islice(iter(resumed), 1))
    after = _keys(_restarted(stream_class(shards), resumed.state_dict()))
    where = "checkpoint 1 batch after a resume from batch 1"
    if whole[len(before) :] == after:  # back by as many as the run before the resume handed out
        raise CheckFailed(
            f"{where}: the restarted loader went back {len(before)} samples, to {after[0]!r}, "
            "where the resumed run began. A place saved after a resume must still count from "
            "the first sample of its shard: add the samples skipped at the resume"
        )
    problem = _cut_problem(before + middle, after, whole, shards)
    if problem:
        raise CheckFailed(f"{where}: {problem}.")


def _check_straight_to_its_shard(stream_class, shards, whole, cut):
    """Whether a restart after batch ``cut`` opens no shard before the one its last sample came
    from (``shards``: local paths); False when that is shard 0, and there is nothing to see. The
    stream reads links to the shards, in a folder of their own; those before are removed once the
    restarted stream is built, so that opening one fails, naming it."""
    last = bisect_right(_shard_starts(shards), cut * BATCH - 1) - 1  # the shard it stopped in
    if last < 1:
        return False
    with tempfile.TemporaryDirectory(prefix="hidden-shards-") as folder:
        links = [os.path.join(folder, f"{i:05d}-{Path(s).name}") for i, s in enumerate(shards)]
        for link, shard in zip(links, shards):
            os.symlink(os.path.abspath(shard), link)
        _, state, _ = _resumed(stream_class, links, cut)
        stream = stream_class(links)  # a restarted job finds every shard: hide them only now
        for link in links[:last]:
            os.unlink(link)
        restarted = _restarted(stream, state)
        try:
            after = _keys(restarted)
        except Exception as error:  # any: the learner's code, told apart by what it names
            opened = next((i for i, link in enumerate(links[:last]) if link in str(error)), None)
            if opened is None:
                raise
            raise CheckFailed(
                f"checkpoint after batch {cut}: the restarted loader opened shard {opened} "
                f"({Path(shards[opened]).name}), though the checkpoint was taken in shard {last}. "
                "A restart should open the shard it stopped in first, and none before it: keep "
                "that shard's number in the place, not only a count of samples (re-reading every "
                "shard up to the cut costs their reads again at each restart). The check hid the "
                "shards before it to see this."
            ) from None
    if after != whole[cut * BATCH :]:
        raise CheckFailed(
            f"checkpoint after batch {cut}: with the shards before shard {last} hidden, the "
            f"restarted loader gave {len(after)} samples, not the {len(whole) - cut * BATCH} after "
            "the checkpoint: did it skip shards it could not read, and count samples from the "
            "first shard? Keep the shard's number in the place, and start at that shard"
        )
    return True


# --- DistributedSampler ---------------------------------------------------------------------------


def _reference(n, world_size, rank, epoch, drop_last):
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(
        range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=0, drop_last=drop_last
    )
    sampler.set_epoch(epoch)
    return list(sampler)


def _padded_permutation(n, world_size, epoch, drop_last):
    """DistributedSampler's whole permutation, cut or padded to a multiple of ``world_size``: the
    ranks' indices dealt back together (rank ``r`` holds every ``world_size``-th from ``r``)."""
    ranks = [_reference(n, world_size, rank, epoch, drop_last) for rank in range(world_size)]
    return [index for dealt in zip(*ranks) for index in dealt]


def _permutation(n, epoch, seed=0):
    """The permutation DistributedSampler deals out: torch.randperm seeded by seed + epoch."""
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(n, generator=generator).tolist()


def _index_problem(got, want, case):
    """What ``got`` (the learner's indices) gets wrong against ``want`` (torch's), in words."""
    n, world_size, rank, epoch, drop_last = case
    if len(got) != len(want):
        padding = len(want) * world_size - n
        rule = (
            "drop the last n % world_size of the permutation"
            if drop_last
            else "pad with the start of the permutation"
            + (
                f", repeated as often as needed: here the padding ({padding}) is longer than the "
                f"permutation ({n})"
                if padding > n
                else ""
            )
        )
        return f"{len(got)} indices, torch gives {len(want)}: every rank takes as many; {rule}"
    if sorted(got) == sorted(want):
        return (
            "the right indices in another order: ranks take every world_size-th index of the "
            "permutation, starting at their rank"
        )
    per_rank, padded = len(want), _padded_permutation(n, world_size, epoch, drop_last)
    if got == padded[rank * per_rank : (rank + 1) * per_rank]:
        return (
            "a block of the permutation for each rank: DistributedSampler deals the indices out "
            "in turn, permutation[rank::world_size]"
        )
    from_permutation = [j for j in range(per_rank) if rank + j * world_size < n]
    if all(got[j] == want[j] for j in from_permutation):
        rule = "drops its end" if drop_last else "pads with its start"
        return f"the right permutation, but the padding is not torch's: DistributedSampler {rule}"
    if drop_last and got == _permutation(n, epoch)[n - per_rank * world_size :][rank::world_size]:
        return (
            "the right permutation, cut at its start: drop_last keeps its first "
            "n - n % world_size indices and drops the last ones"
        )
    if got == list(range(rank, n, world_size))[: len(want)]:
        return "not shuffled: permute range(n) with a torch.Generator seeded by seed + epoch"
    return "other indices than torch's: the permutation is torch.randperm(n) seeded by seed + epoch"


def _indices(distributed_indices, case):
    """The learner's indices for ``case``, as ints; ``CheckFailed`` when the call touched torch's
    global random generator."""
    import torch

    before = torch.get_rng_state()
    got = [int(index) for index in distributed_indices(*case)]
    if not torch.equal(torch.get_rng_state(), before):
        raise CheckFailed(
            f"distributed_indices{case} reseeded or drew from torch's global random generator "
            "(torch.manual_seed, torch.randperm without a generator): the model's own randomness "
            "(initialisation, dropout, augmentation) changes with it. Draw from a torch.Generator "
            "of its own, seeded with seed + epoch."
        )
    return got


def _epoch_problem(distributed_indices, case):
    """Why ``case``, wrong in an epoch after the first, was right in epoch 0; None when it was
    not."""
    n, world_size, rank, epoch, drop_last = case
    first = (n, world_size, rank, 0, drop_last)
    if epoch == 0 or _indices(distributed_indices, first) != _reference(*first):
        return None
    return (
        f"right in epoch 0, other indices in epoch {epoch}: DistributedSampler seeds its generator "
        "with seed + epoch, so that every epoch has its own order; mix the epoch in that way"
    )


def _rank_problem(distributed_indices, case, got, want):
    """Why ``case``, where ``got`` has as many indices as torch's ``want`` but other ones of the
    permutation (not only other padding), was right for rank 0; None when it was not."""
    n, world_size, rank, epoch, drop_last = case
    first = (n, world_size, 0, epoch, drop_last)
    drawn = [j for j in range(len(want)) if rank + j * world_size < n]  # the rest is padding
    if len(got) != len(want) or all(got[j] == want[j] for j in drawn):
        return None
    if rank == 0 or _indices(distributed_indices, first) != _reference(*first):
        return None
    return (
        f"right for rank 0, other indices for rank {rank}: every rank must draw the same "
        "permutation (seeded by seed + epoch, without the rank), then take its own share of it"
    )


def check_distributed_indices(distributed_indices):
    """``distributed_indices(n, world_size, rank, epoch, drop_last)`` gives the indices torch's
    ``DistributedSampler`` (seed 0, shuffled) gives that rank, for even and uneven splits."""
    cases = [
        (n, world, rank, epoch, drop)
        for n, world in ((12, 3), (10, 3), (7, 4), (2, 3), (1, 4))
        for rank in range(world)
        for epoch in (0, 1)
        for drop in (False, True)
    ]
    for case in cases:
        got, want = _indices(distributed_indices, case), _reference(*case)
        if got != want:
            n, world, rank, epoch, drop = case
            where = f"n={n}, world_size={world}, rank={rank}, epoch={epoch}, drop_last={drop}"
            problem = (
                _epoch_problem(distributed_indices, case)
                or _rank_problem(distributed_indices, case, got, want)
                or _index_problem(got, want, case)
            )
            raise CheckFailed(f"{where}: {problem}.")
    passed(f"the same indices as DistributedSampler in all {len(cases)} cases, padding included.")
