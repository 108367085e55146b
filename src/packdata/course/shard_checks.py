"""Checks of lesson 4: samples shuffled before they are cut into shards, shards split over ranks
and workers, a shuffle buffer, and the learner's streaming dataset, each checked for every sample
exactly once.
"""

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from .. import imagefolder
from .feedback import CheckFailed, passed, stop_workers

# the check's own data: 10 classes of 60 keys each, in key order, which is class order (as a dataset
# folder lists them)
_SORTED_KEYS = [f"{index:06d}" for index in range(600)]


def _label_of(key):
    return int(key) // 60


def _shown(key):
    """``key`` as a message shows it: a ``str`` of NumPy's (``np.str_``) as the plain ``str`` it
    holds, quoted; anything else as its repr."""
    return repr(str(key)) if isinstance(key, str) else repr(key)


def _cuts(keys, per_shard):
    """``keys`` cut into consecutive shards of ``per_shard``, the last holding what is left."""
    return [list(keys[start : start + per_shard]) for start in range(0, len(keys), per_shard)]


def _as_shards(got, call):
    """The learner's answer as a list of lists of keys, or ``CheckFailed`` saying what it is."""
    try:
        return [list(shard) for shard in got]
    except TypeError:
        raise CheckFailed(
            f"{call} returned {got!r:.80}: return a list of shards, each a list of keys."
        ) from None


def _random_state():
    """The state of Python's, NumPy's and torch's global random generators."""
    import random

    import numpy as np
    import torch

    return random.getstate(), str(np.random.get_state()), torch.get_rng_state().numpy().tobytes()


def _assignment(assign_shards, keys, per_shard, seed):
    """``assign_shards`` called on a copy of ``keys``; ``CheckFailed`` when it changes the copy or
    reseeds a global random generator."""
    given, before = list(keys), _random_state()
    call = f"assign_shards(keys, {per_shard}, seed={seed})"
    shards = _as_shards(assign_shards(given, per_shard, seed), call)
    if given != list(keys):
        raise CheckFailed(
            f"{call} reordered the list it was given (random.shuffle(keys) shuffles in place): the "
            "caller's keys changed under it. Shuffle a copy, or draw a permutation of the indices."
        )
    if _random_state() != before:
        raise CheckFailed(
            f"{call} reseeded or drew from a global random generator, Python's, NumPy's or "
            "torch's (random.seed, np.random.seed, torch.manual_seed, random.shuffle): every "
            "other user of it, an "
            "augmentation say, now repeats its numbers or loses them. Make a generator of your "
            "own from the seed: random.Random(seed) or np.random.default_rng(seed)."
        )
    return shards


def _each_key_once(shards, keys, per_shard, call):
    """``CheckFailed`` unless the shards hold every key of ``keys`` once, cut every
    ``per_shard``."""
    where = {}
    for number, shard in enumerate(shards):
        for key in shard:
            if where.get(key) == number:
                raise CheckFailed(
                    f"{call}: key {_shown(key)} is twice in shard {number}: drawing with "
                    "replacement (random.choices, rng.choice without replace=False) repeats keys "
                    "and leaves others out. Shuffle a copy of the list, or draw a permutation of "
                    "it."
                )
            if key in where:
                raise CheckFailed(
                    f"{call}: key {_shown(key)} is in shard {where[key]} and in shard {number}, "
                    "so its sample would come twice an epoch. Cut the shuffled list into slices "
                    "that do not overlap: [start : start + per_shard], start going up by "
                    "per_shard."
                )
            where[key] = number
    given = set(keys)
    stray = [key for key in where if key not in given]
    if stray:
        raise CheckFailed(f"{call}: {_shown(stray[0])} is not one of the keys given.")
    lost = [key for key in keys if key not in where]
    if lost:
        cure = (
            "Keep the last, shorter shard."
            if len(shards) < -(-len(keys) // per_shard)
            else f"Your shards hold fewer than {per_shard} keys: look at where each slice starts "
            "and ends."
        )
        raise CheckFailed(
            f"{call}: {len(lost)} of {len(keys)} keys are in no shard (e.g. "
            f"{_shown(lost[0])}): those samples would never be trained on. {cure}"
        )
    sizes = [len(shard) for shard in shards]
    if any(size != per_shard for size in sizes[:-1]) or not 0 < sizes[-1] <= per_shard:
        raise CheckFailed(
            f"{call}: the shards hold {sorted(set(sizes))} keys; expected {per_shard} in each, "
            "the last one fewer when the keys run out (as write_shards(maxcount=...) cuts them)."
        )


def _class_mix(shards, keys, per_shard, call):
    """``CheckFailed`` when the shards are the given order cut up, or a shard holds few
    classes."""
    cut = _cuts(keys, per_shard)
    if shards == cut:
        raise CheckFailed(
            f"{call}: shard 0 holds only class {_label_of(shards[0][0])}: you cut the keys in the "
            "order given, which is class order. Shuffle the whole list first, then cut it."
        )
    if [sorted(shard) for shard in shards] == [sorted(shard) for shard in cut]:
        raise CheckFailed(
            f"{call}: each shard holds one class, in a new order: you shuffled inside each shard, "
            "after cutting. A shard's classes are decided by the cut: shuffle the whole list "
            "before it."
        )
    mixes = [len({_label_of(key) for key in shard}) for shard in shards[:-1]]
    if min(mixes) < 5:
        number = mixes.index(min(mixes))
        raise CheckFailed(
            f"{call}: shard {number} holds {min(mixes)} of 10 classes, where a full shuffle gives "
            f"every shard of {per_shard} nearly all 10. Shuffle the whole list, then cut."
        )
    if all(shard == sorted(shard) for shard in shards):
        raise CheckFailed(
            f"{call}: the keys of every shard come in sorted order, so a shard streams its "
            "classes one after another and a shuffle buffer sees runs of one class. Keep the "
            "shuffled order within each shard."
        )


def _check_same_shards_elsewhere(assign_shards, shards, per_shard, seed):
    """``CheckFailed`` when ``assign_shards``, run from its source by fresh Python processes with
    other hash seeds, cuts other shards than ``shards`` from the same keys and seed; nothing to
    say when it cannot run there (it calls a helper of the notebook)."""
    import subprocess

    from . import fresh

    call = f"[[str(key) for key in shard] for shard in {{name}}(args, {per_shard}, {seed})]"
    try:
        others = [fresh.run(assign_shards, _SORTED_KEYS, call, hash_seed) for hash_seed in (1, 2)]
    except (fresh.Unreadable, fresh.Failed, subprocess.TimeoutExpired):
        return
    if any(other != [[str(key) for key in shard] for shard in shards] for other in others):
        raise CheckFailed(
            f"assign_shards(keys, {per_shard}, seed={seed}) cut other shards in another Python "
            "process: str's hash() changes with every interpreter (PYTHONHASHSEED), so a shard "
            "written again later, or on another machine, would hold other keys. Draw from a "
            "generator made from the seed: random.Random(seed) or np.random.default_rng(seed)."
        )


def check_assign_shards(assign_shards, root):
    """Lesson 4: ``assign_shards(keys, per_shard, seed)`` cuts a full shuffle, seeded by ``seed``,
    into shards of ``per_shard`` keys: every key once, every shard a mix of classes, the same
    shards from the same seed and others from another seed."""
    for per_shard, seed in [(50, 1), (64, 7), (600, 3)]:
        call = f"assign_shards(keys, {per_shard}, seed={seed})"
        shards = _assignment(assign_shards, _SORTED_KEYS, per_shard, seed)
        _each_key_once(shards, _SORTED_KEYS, per_shard, call)
        if len(shards) > 1:
            _class_mix(shards, _SORTED_KEYS, per_shard, call)
        if _assignment(assign_shards, _SORTED_KEYS, per_shard, seed) != shards:
            raise CheckFailed(
                f"{call} gave other shards when called again with the same seed: draw from a "
                "generator made from the seed (random.Random(seed) or "
                "np.random.default_rng(seed)), so that the same seed rewrites the same shards."
            )
    _check_same_shards_elsewhere(
        assign_shards, _assignment(assign_shards, _SORTED_KEYS, 50, 1), 50, 1
    )
    if _assignment(assign_shards, _SORTED_KEYS, 50, 1) == _assignment(
        assign_shards, _SORTED_KEYS, 50, 2
    ):
        raise CheckFailed(
            "assign_shards(keys, 50, seed=1) and seed=2 gave the same shards: the seed must "
            "choose the shuffle (make the generator from it)."
        )
    samples = imagefolder.load_manifest(root)["samples"]
    keys = sorted(sample["key"] for sample in samples)
    labels = {sample["key"]: sample["label"] for sample in samples}
    per_shard = -(-len(keys) // 20)
    shards = _assignment(assign_shards, keys, per_shard, 0)
    _each_key_once(shards, keys, per_shard, f"with the dataset's {len(keys):,} keys")

    def mixes(cut):
        return [len({labels[key] for key in shard}) for shard in cut]

    mixed, unshuffled = mixes(shards), mixes(_cuts(keys, per_shard))
    passed(
        f"every key once, the same shards from the same seed; the dataset's {len(keys):,} samples "
        f"in {len(shards)} shards of {per_shard}, each holding {min(mixed)} to {max(mixed)} of "
        f"{len(set(labels.values()))} classes (cut in key order, each would hold "
        f"{_range_of(unshuffled)})."
    )


def _range_of(counts):
    """``"1 class"``, or ``"2 to 3 classes"``: the spread of ``counts``, in words."""
    low, high = min(counts), max(counts)
    if low == high:
        return f"{low} class" + ("" if low == 1 else "es")
    return f"{low} to {high} classes"


def _forked_epochs(dataset, num_workers, epochs, **options):
    """The items of ``dataset`` in each of ``epochs`` (``set_epoch`` before each), from one
    ``DataLoader`` whose workers are forked (a class from a notebook reaches them so), without
    torch's warning about more workers than cores. The workers are stopped before this returns
    or raises: an error of the learner's code in a worker, kept with its traceback as a notebook
    keeps it, would otherwise keep the loader's iterator, and so its workers, alive."""
    import warnings

    from torch.utils.data import DataLoader

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        fork = "fork" if num_workers else None
        loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=num_workers,
            multiprocessing_context=fork,
            **options,
        )
        items, iterator = [], None
        try:
            for epoch in epochs:
                dataset.set_epoch(epoch)
                iterator = iter(loader)
                items.append(list(iterator))
            return items
        finally:
            stop_workers(iterator)


def _stream_keys(shards, world_size=2, num_workers=3, epoch=0, **options):
    """Keys of one epoch as ``world_size`` simulated ranks × ``num_workers`` DataLoader workers
    stream them from ``shards`` with ``ShardDataset(**options)``: real worker processes where
    ``fork`` exists (a function defined in a notebook reaches them that way), else each worker's
    share computed in this process."""
    import multiprocessing

    from ..streaming import ShardDataset

    keys = []
    for rank in range(world_size):
        dataset = ShardDataset(
            shards, rank=rank, world_size=world_size, keys=("__key__",), decode=False, **options
        )
        if "fork" in multiprocessing.get_all_start_methods():
            keys += [key for (key,) in _forked_epochs(dataset, num_workers, [epoch])[0]]
        else:
            dataset.set_epoch(epoch)
            keys += [
                key
                for worker in range(num_workers)
                for (key,) in dataset.iterate(worker, num_workers)
            ]
    return keys


def _check_exactly_once(shards, what, **options):
    """2 ranks × 3 workers, two epochs: every sample exactly once per epoch, and the next epoch in
    another order."""
    from ..layout import expand_shards
    from ..shardread import count_shard_samples

    listed = expand_shards(shards)
    expected = sum(count_shard_samples(shard) for shard in listed)
    orders = [_stream_keys(shards, epoch=epoch, **options) for epoch in (0, 1)]
    for epoch, keys in enumerate(orders):
        repeated = [key for key, n in Counter(keys).items() if n > 1]
        if repeated:
            raise CheckFailed(
                f"epoch {epoch}: {len(repeated)} samples arrived more than once across 2 ranks × 3 "
                f"workers (e.g. key {_shown(repeated[0])}) {what}"
            )
        if len(keys) != expected:
            raise CheckFailed(
                f"epoch {epoch}: {expected - len(keys)} of {expected} samples never arrived across "
                "2 "
                f"ranks × 3 workers {what}"
            )
    if orders[0] == orders[1]:
        raise CheckFailed(f"epochs 0 and 1 delivered the samples in the same order {what}")
    return expected


def _split_parts(split_shards, names, world_size, num_workers, call):
    """``{(rank, worker): part}``; ``CheckFailed`` when a call changes the list it is given or
    gives another part for the same arguments (a shuffle inside the split)."""
    given = list(names)
    parts = {
        (rank, worker): list(split_shards(given, rank, world_size, worker, num_workers))
        for rank in range(world_size)
        for worker in range(num_workers)
    }
    if given != names:
        raise CheckFailed(
            f"{call}, split_shards reordered the list it was given: the caller's shard list "
            "changed under it. Only slice it; the shuffle happens before the split."
        )
    if list(split_shards(given, 0, world_size, 0, num_workers)) != parts[0, 0]:
        raise CheckFailed(
            f"{call}, split_shards gave rank 0 worker 0 another part when called again with the "
            "same arguments: a shuffle inside the split makes the ranks' and workers' parts "
            "overlap. Only slice the list; it arrives already shuffled for the epoch."
        )
    return parts


def _check_split_follows_order(split_shards, given):
    """``CheckFailed`` when each part holds the same shards whatever the list's order: a split by
    the shards' names, which the epoch's shuffle then cannot change."""
    rotated = given[1:] + given[:1]

    def part(shards, rank, worker):
        return set(split_shards(list(shards), rank, 2, worker, 2))

    places = [(rank, worker) for rank in range(2) for worker in range(2)]
    if all(part(given, *place) == part(rotated, *place) for place in places):
        raise CheckFailed(
            "each rank and worker gets the same shards whatever order the list comes in: your "
            "split goes by the shards' names, so every worker reads the same shards every epoch. "
            "Take the parts by position in the list you are given."
        )


def check_shard_split(split_shards, shards):
    """Lesson 4: ``split_shards(shards, rank, world_size, worker, num_workers)`` gives every (rank,
    worker) a part of the list: disjoint, complete, within one shard of each other; then streams
    every sample exactly once."""
    for count, world_size, num_workers in [(20, 2, 3), (7, 2, 2), (5, 1, 4), (12, 3, 1), (3, 2, 3)]:
        names = [f"train-{i:06d}.tar" for i in range(count)]
        call = f"with {count} shards, {world_size} ranks and {num_workers} workers"
        parts = _split_parts(split_shards, names, world_size, num_workers, call)
        owners = {}
        for place, part in parts.items():
            for name in part:
                if name in owners:
                    (r1, w1), (r2, w2) = owners[name], place
                    raise CheckFailed(
                        f"{call}, {name} goes to rank {r1} worker {w1} and to rank {r2} worker "
                        f"{w2}: its samples would arrive twice. Split by rank first, then by "
                        "worker ([rank::world_size][worker::num_workers]), or deal in one step: "
                        "[rank * num_workers + worker :: world_size * num_workers]."
                    )
                owners[name] = place
        if len(owners) != count:
            missing = sorted(set(names) - set(owners))
            raise CheckFailed(
                f"{call}, nobody reads {missing[0]} ({len(missing)} of {count} shards left out): "
                "chunks of len(shards) // parts leave the remainder out. Deal the shards like "
                "cards: shards[rank::world_size][worker::num_workers]."
            )
        sizes = sorted(map(len, parts.values()))
        if sizes[-1] - sizes[0] > 1:
            raise CheckFailed(
                f"{call}, workers get {sizes[0]} to {sizes[-1]} shards: deal them out like cards."
            )
    # an epoch's shuffled order, here simply reversed
    given = [f"train-{i:06d}.tar" for i in reversed(range(8))]
    for rank in range(2):
        part = list(split_shards(given, rank, 2, 0, 1))
        if part != sorted(part, key=given.index):
            raise CheckFailed(
                "Keep the order you are given: the list arrives reshuffled for each epoch, and "
                "reordering it (sorting, a shuffle of your own) gives every epoch the same order."
            )
    _check_split_follows_order(split_shards, given)
    samples = _check_exactly_once(shards, "with your split.", splitter=split_shards)
    passed(
        f"disjoint, complete, balanced; 2 ranks × 3 workers streamed all {samples:,} samples "
        "exactly once per epoch, "
        "in a new order in the next epoch."
    )


def _past_the_buffer_named(stream):
    """The items of ``stream``; an ``IndexError`` from it becomes a ``CheckFailed`` that says
    where such an index comes from."""
    try:
        yield from stream
    except IndexError as error:
        raise CheckFailed(
            f"shuffle_buffer raised IndexError ({error}): it indexed past the buffer. "
            "rng.randint(0, size) can return size itself, rng.randrange(size) cannot; and pick "
            "from the buffer only once it is full."
        ) from None


def check_shuffle_buffer(shuffle_buffer, shards):
    """Lesson 4: ``shuffle_buffer(samples, size, rng)`` fills up before it yields, loses and repeats
    nothing, shuffles, and is reproducible from ``rng``; then streams every sample exactly once with
    it."""
    import random

    consumed = []

    def source(count=200):
        for item in range(count):
            consumed.append(item)
            yield item

    stream = shuffle_buffer(source(), 50, random.Random(0))
    if not isinstance(stream, Iterator):
        raise CheckFailed(
            f"shuffle_buffer returned a {type(stream).__name__}: write a generator (yield the "
            "samples "
            "one at a time), or it holds the whole stream in memory."
        )
    out = []
    for item in _past_the_buffer_named(stream):
        if not out and len(consumed) < 50:
            raise CheckFailed(
                f"the first sample came out after reading only {len(consumed)} of a buffer of 50: "
                "fill "
                "the buffer before yielding, or the first samples are hardly shuffled."
            )
        if len(consumed) > 50 + len(out) + 1:
            raise CheckFailed(
                f"sample {len(out) + 1} came out after reading {len(consumed)}: a buffer of 50 "
                "never "
                "reads more than 50 ahead of what it has yielded (the stream may not fit in "
                "memory)."
            )
        out.append(item)
    if out[:150] == list(range(50, 200)):
        raise CheckFailed(
            "each newcomer came out as soon as it was read, and of 200 samples "
            f"{len(out) - len(set(out))} came out more than once and {200 - len(set(out))} never. "
            "You replaced buffer[i] before yielding it: yield it first, then put the newcomer in "
            "its place."
        )
    if len(set(out)) < len(out):
        raise CheckFailed(
            f"200 samples went in, {len(out)} came out, {len(out) - len(set(out))} of them more "
            f"than once and {200 - len(set(out))} never: yield the sample you picked, then put the "
            "newcomer in its place (buffer[i] = sample), not beside it."
        )
    if sorted(out) != list(range(200)):
        lost = 200 - len(set(out))
        raise CheckFailed(
            f"200 samples went in, {len(out)} came out ({lost} missing): at the end, yield what is "
            "still in the buffer."
        )
    if out == list(range(200)):
        raise CheckFailed(
            "the samples come out in the order they went in: pick a random one of the buffer with "
            "rng."
        )
    long_run = list(_past_the_buffer_named(shuffle_buffer(iter(range(2000)), 50, random.Random(0))))
    stuck = [item for place, item in enumerate(long_run) if place - item > 1900]
    if stuck:
        raise CheckFailed(
            f"in a stream of 2,000, sample {stuck[0]} stayed in the buffer from the start to the "
            "final drain, through more than 1,900 draws: a slot that is never picked? "
            "rng.randrange(size - 1) leaves out the last one; rng.randrange(size) picks any."
        )
    if out[:50] == list(range(50)):
        raise CheckFailed(
            "the first 50 samples out are the first 50 in, in the order they went in: first in, "
            "first out, which only delays the stream. Pick the sample to yield at random "
            "(rng.randrange(len(buffer))), and put the newcomer in its place."
        )
    if sorted(out[:50]) == list(range(50)):
        raise CheckFailed(
            "the first 50 samples out are the first 50 in, reordered: you shuffle block by block, "
            "so a sample never meets one from the next block. Once the buffer is full, yield one "
            "random sample of it for each newcomer."
        )
    consumed.clear()
    again = list(_past_the_buffer_named(shuffle_buffer(source(), 50, random.Random(0))))
    if len(again) != 200:
        raise CheckFailed(
            f"a second call gave {len(again)} samples for 200: something outlived the first call "
            "(a buffer=[] default argument, or a buffer outside the function). Make the buffer "
            "inside the function."
        )
    if again != out:
        raise CheckFailed(
            "the same rng seed gave a different order: draw every random choice from rng, nothing "
            "else."
        )
    if list(_past_the_buffer_named(shuffle_buffer(iter(range(200)), 50, random.Random(5)))) == out:
        raise CheckFailed(
            "rng seeded 0 and rng seeded 5 gave the same order: the buffer never uses the rng it "
            "is given. Draw every random choice from rng (rng.randrange, rng.shuffle), not from a "
            "generator of your own."
        )
    small = list(_past_the_buffer_named(shuffle_buffer(iter(range(20)), 50, random.Random(1))))
    if sorted(small) != list(range(20)):
        raise CheckFailed(
            f"a stream shorter than the buffer (20 samples, buffer 50) came out as {small}."
        )
    if small == list(range(20)):
        raise CheckFailed(
            "a stream shorter than the buffer (20 samples, buffer 50) came out in the order it "
            "went in: "
            "the buffer never filled, so everything left in the final drain. Shuffle what is left "
            "with "
            "rng.shuffle before yielding it."
        )
    if list(shuffle_buffer(iter(range(20)), 50, random.Random(2))) == small:
        raise CheckFailed(
            "a stream shorter than the buffer (20 samples, buffer 50) came out in the same order "
            "from two seeds: the final drain ignores rng. Shuffle what is left with rng.shuffle "
            "before yielding it."
        )
    samples = _check_exactly_once(
        shards, "with your buffer.", shuffle=False, buffer_size=100, buffer=shuffle_buffer
    )
    passed(
        "fills first, keeps every sample, reproducible; 2 ranks × 3 workers streamed all "
        f"{samples:,} samples exactly "
        "once per epoch, in a new order in the next epoch."
    )


def _keys_by_rank(stream_class, shards, epoch, buffer_size, world_size=2, num_workers=3, seed=0):
    """The first field of every item that ``stream_class`` yields in ``epoch``, per rank, read
    by ``num_workers`` real, forked DataLoader workers (a class from a notebook reaches them so)."""
    keys = []
    for rank in range(world_size):
        dataset = stream_class(
            shards, rank=rank, world_size=world_size, seed=seed, buffer_size=buffer_size
        )
        keys.append([item[0] for item in _forked_epochs(dataset, num_workers, [epoch])[0]])
    return keys


def _duplicates_explained(per_rank, expected):
    """Why samples arrived more than once or not at all, in words, or None."""
    within = [len(keys) - len(set(keys)) for keys in per_rank]
    everyone = [key for keys in per_rank for key in keys]
    missing, twice = expected - len(set(everyone)), len(everyone) - len(set(everyone))
    if all(set(Counter(keys).values()) == {3} for keys in per_rank):
        return (
            "every worker of a rank read all of that rank's shards (each sample 3 times per "
            "rank): split the shards between workers with get_worker_info()."
        )
    if any(within) and missing:
        return (
            f"within one rank, {max(within)} samples arrived twice, and {missing} of {expected} "
            "never arrived: the rank's workers shuffled the shard list differently (a seed from "
            "get_worker_info().seed, or none at all), or their slices are off. Shuffle it with the "
            "same seed and epoch in every worker and rank, then split: [worker::num_workers]."
        )
    if any(within):
        return (
            f"within one rank, {max(within)} samples arrived twice: the workers' parts overlap. "
            "Split the rank's shards with [worker::num_workers], after the split by rank."
        )
    if len(everyone) == 2 * expected and len(set(everyone)) == expected:
        return (
            "every rank read every shard (each sample once per rank, twice in all): split the "
            "shards between ranks first, with [rank::world_size]."
        )
    if missing and twice:
        return (
            f"{twice} samples arrived on both ranks, and {missing} of {expected} never arrived: "
            "the ranks' parts overlap and leave gaps. Either the ranks or workers shuffled the "
            "shard list differently (a seed with the rank or worker in it, or none at all), or "
            "the split's index is off: rank r's worker w takes [r::world_size][w::num_workers], "
            "or, dealt in one step, [r * num_workers + w :: world_size * num_workers]."
        )
    if missing:
        return (
            f"{missing} of {expected} samples never arrived: the ranks or "
            "workers shuffled the shard list differently. Shuffle it with the same seed and epoch "
            "everywhere (never the rank or the worker), then split."
        )
    if len(everyone) != expected:
        return (
            f"{len(everyone) - expected} samples arrived on both ranks: the ranks' parts "
            "overlap. Give each rank its own slice of the shuffled list, [rank::world_size]."
        )
    return None


def _shard_neighbours(keys, shards, window=3):
    """The share of items whose successor in their shard follows within ``window`` places (3
    workers take turns, so a worker's consecutive items lie 3 apart)."""
    from ..shardread import iter_shard_samples

    following, previous = {}, None
    for sample in iter_shard_samples(shards):
        if previous is not None and previous["__url__"] == sample["__url__"]:
            following[previous["__key__"]] = sample["__key__"]
        previous = sample
    close = sum(following.get(key) in keys[i + 1 : i + 1 + window] for i, key in enumerate(keys))
    return close / max(len(keys), 1)


def _check_shards_mix(keys, shards):
    """``CheckFailed`` when ``keys`` (one rank, no workers) bring every shard's samples together,
    one shard after another: shuffled within each shard, never across shards."""
    from ..shardread import iter_shard_samples

    shard_of = {sample["__key__"]: sample["__url__"] for sample in iter_shard_samples(shards)}
    runs = 1 + sum(shard_of[a] != shard_of[b] for a, b in zip(keys, keys[1:]))
    if len(set(shard_of.values())) > 1 and runs == len(set(shard_of.values())):
        raise CheckFailed(
            f"one rank, no workers: the samples of each of the {runs} shards came together, one "
            "shard after another: shuffled within each shard, never across them, so a batch "
            "holds the classes of one shard. Pass every shard's samples through one shuffle "
            "buffer, which mixes samples of several shards."
        )


def _alone_explained(alone, shards, expected, buffer_size):
    """Why one rank without workers did not stream every sample once: shards it never read while
    it read the others whole, a buffer never drained (exactly ``buffer_size`` samples missing), or
    else where to start looking."""
    from ..shardread import iter_shard_samples

    arrived, keys_of = set(alone), {}
    for sample in iter_shard_samples(shards):
        keys_of.setdefault(sample["__url__"], set()).add(sample["__key__"])
    unread = sorted(shard for shard, keys in keys_of.items() if not keys & arrived)
    whole = all(keys <= arrived for keys in keys_of.values() if keys & arrived)
    counts = (
        f"one rank, no workers: {len(alone)} items, {len(arrived)} distinct, of {expected} samples."
    )
    if arrived and unread and whole and len(alone) == len(arrived):
        first = unread[0].rsplit("/", 1)[-1]
        return (
            f"{counts} No sample of {len(unread)} shard(s) arrived ({first} first), the others "
            "arrived whole: rank 0 of 1, worker 0 of 1, must read every shard. Look at where "
            "your slices start and end."
        )
    if len(alone) == len(arrived) == expected - buffer_size:
        return (
            f"{counts} Exactly buffer_size (here {buffer_size}) samples never arrived: those "
            "the buffer still held when the shards ran out. After the loop, shuffle what is left "
            "in the buffer and yield it too."
        )
    return (
        f"{counts} Start there: with no workers, get_worker_info() is None (worker 0 of 1); and "
        "when the shards run out, the buffer still holds samples to give."
    )


def _check_stream_seeding(stream_class, shards, alone, buffer_size):
    """The order of one rank, no workers, follows ``(seed, epoch)`` and nothing else: the same
    pair gives ``alone`` again, another seed another order, and seed 1's epoch 0 is not seed 0's
    epoch 1."""

    def order(seed, epoch):
        (keys,) = _keys_by_rank(
            stream_class, shards, epoch, buffer_size, world_size=1, num_workers=0, seed=seed
        )
        return keys

    first_of_seed_1 = order(1, 0)
    if order(0, 0) != alone:
        raise CheckFailed(
            "the same seed and epoch streamed another order the second time: draw every random "
            "choice from generators seeded with self.seed and self.epoch, so that a run can be "
            "repeated."
        )
    if first_of_seed_1 == alone:
        raise CheckFailed(
            "seed=1 streamed epoch 0 in the same order as seed=0: mix self.seed into the shard "
            "shuffle and the buffer's rng, so that two runs can differ on purpose."
        )
    if first_of_seed_1 == order(0, 1):
        raise CheckFailed(
            "seed=1's epoch 0 came in the order of seed=0's epoch 1: seed + epoch makes them "
            'collide. Seed with the pair: random.Random(f"{seed}:{epoch}"), or '
            "np.random.default_rng([seed, epoch])."
        )


def _check_buffer_follows_epoch(stream_class, shards, buffer_size):
    """One shard alone, whose place no shard shuffle can change, comes mixed otherwise in epoch 1
    than in epoch 0: the buffer's generator is seeded with the epoch too."""
    one = shards[:1]
    name = str(one[0]).rsplit("/", 1)[-1]
    orders = [
        _keys_by_rank(stream_class, one, epoch, buffer_size, world_size=1, num_workers=0)[0]
        for epoch in (0, 1)
    ]
    if orders[0] == orders[1]:
        raise CheckFailed(
            f"a stream of one shard ({name}) came in the same order in epochs 0 and 1: the "
            "shard shuffle cannot move a lone shard, so the buffer made the same random choices "
            "both epochs. Seed the buffer's generator with the epoch too, "
            'random.Random(f"{seed}:{epoch}:{rank}:{worker}"), or every epoch mixes each '
            "stretch of shards the same way."
        )


def _check_workers_that_stay(stream_class, shards, first, buffer_size):
    """Rank 0 of 2 with 3 workers that stay (``persistent_workers=True``) streams ``first`` (its
    keys in epoch 0 from workers made for it) in epoch 0 and a new order in epoch 1."""
    dataset = stream_class(shards, rank=0, world_size=2, seed=0, buffer_size=buffer_size)
    by_epoch = _forked_epochs(dataset, 3, [0, 1], persistent_workers=True)
    epochs = [[item[0] for item in items] for items in by_epoch]
    if epochs[0] != first:
        raise CheckFailed(
            "with workers that stay (persistent_workers=True), epoch 0 came in another order than "
            "from workers made for it, with the same seed: draw every random choice from "
            "generators seeded with self.seed, self.epoch, the rank and the worker's number (not "
            "get_worker_info().seed, which differs from one loader to the next)."
        )
    if epochs[1] == first:
        raise CheckFailed(
            "with workers that stay (persistent_workers=True), epoch 1 repeated epoch 0: the "
            "workers keep the copy of the dataset they got at the start, and an epoch set in the "
            "main process reaches them only through shared memory. Read it in __iter__ as "
            "self.epoch, the property the class gives, and keep set_epoch as it is."
        )


def _alone_keys(stream_class, shards, buffer_size):
    """The keys one rank without workers streams in epoch 0, iterating one dataset twice;
    ``CheckFailed`` naming what a first run shows: no worker info, no iterator, items that are not
    ``(key, label)``, a global generator touched, a second pass that differs."""
    dataset = stream_class(shards, rank=0, world_size=1, seed=0, buffer_size=buffer_size)
    dataset.set_epoch(0)
    before = _random_state()
    passes = [_items_of(dataset), _items_of(dataset)]
    if _random_state() != before:
        raise CheckFailed(
            "iterating the dataset reseeded or drew from a global random generator (random.seed, "
            "random.shuffle, np.random.permutation, torch.manual_seed): the model's own "
            "randomness changes with it. Draw from a generator of your own: "
            'random.Random(f"{seed}:{epoch}").'
        )
    if sorted(passes[1]) != sorted(passes[0]):
        raise CheckFailed(
            f"iterating the same dataset twice in one epoch gave {len(passes[0])} items, then "
            f"{len(passes[1])} ({len(set(passes[1]))} distinct): something outlived the first "
            "pass (a buffer or a generator made in __init__). Make them inside __iter__."
        )
    if passes[1] != passes[0]:
        raise CheckFailed(
            "iterating the same dataset twice in one epoch gave its samples in another order the "
            "second time: draw every random choice from generators made in __iter__ and seeded "
            "with self.seed and self.epoch, and shuffle a copy of the shard list (not self.shards "
            "in place), so that an epoch can be repeated, as a resumed job repeats it."
        )
    return [key for key, _ in passes[0]]


def _items_of(dataset):
    """Every item of one pass over ``dataset`` in this process, each checked to be a ``(key,
    label)`` pair; the usual first-run errors in words."""
    try:
        items = list(iter(dataset))
    except AttributeError as error:
        if "'NoneType'" not in str(error):
            raise
        raise CheckFailed(
            f"{error}: without DataLoader workers, get_worker_info() returns None. Take that as "
            "worker 0 of 1: (info.id, info.num_workers) if info else (0, 1)."
        ) from None
    except TypeError as error:
        if "non-iterator" not in str(error):
            raise
        raise CheckFailed(
            f"{error}: make __iter__ a generator (yield each sample), so that samples flow one "
            "at a time."
        ) from None
    for item in items[:1]:
        if not (isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str)):
            raise CheckFailed(
                f"an item is {item!r:.60}, not a (key, label) pair: yield the pairs that "
                "read_samples gives."
            )
    return [tuple(item) for item in items]


@contextmanager
def _read_samples_wrapped(stream_class, wrap):
    """Within the block, the ``read_samples`` that ``stream_class`` calls (a global of the module
    that defines it, a notebook's) is ``wrap(read_samples)``; yields whether there was one to
    wrap."""
    import sys

    module = sys.modules.get(stream_class.__module__)
    read = getattr(module, "read_samples", None)
    if not callable(read):
        yield False
        return
    module.read_samples = wrap(read)
    try:
        yield True
    finally:
        module.read_samples = read


def _check_workers_read_their_shards(stream_class, shards, buffer_size):
    """One rank, 3 forked workers: ``CheckFailed`` when a worker reads more than its share of the
    shards (a split of the samples, not the shards), counted through ``read_samples`` where the
    class finds it."""
    import os
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:

        def logged(read):
            def counted(shard):
                with open(log.name, "a") as file:
                    file.write(f"{os.getpid()}\t{shard}\n")
                return read(shard)

            return counted

        with _read_samples_wrapped(stream_class, logged):
            _keys_by_rank(stream_class, shards, 0, buffer_size, world_size=1)
        per_worker = Counter(line.split("\t")[0] for line in set(log.read().splitlines()))
    count = len(list(shards))
    if per_worker and max(per_worker.values()) > -(-count // 3):
        raise CheckFailed(
            f"one rank, 3 workers: a worker read {max(per_worker.values())} of the {count} shards "
            "and kept only some of their samples. Every sample arrived once, but every worker "
            "read (over a network: downloaded) nearly every shard. Split the shard list between "
            "workers, not the samples."
        )


def _check_reads_as_it_yields(stream_class, shards, buffer_size):
    """One rank, no workers: ``CheckFailed`` when the stream reads more than ``buffer_size`` + 1
    samples ahead of those it yielded (it holds them all in memory), or yields its first before
    ``buffer_size`` were read while more were to come (a smaller buffer than asked), counted
    through ``read_samples`` where the class finds it."""
    read = 0

    def counting(read_samples):
        def counted(shard):
            nonlocal read
            for sample in read_samples(shard):
                read += 1
                yield sample

        return counted

    dataset = stream_class(shards, rank=0, world_size=1, seed=0, buffer_size=buffer_size)
    dataset.set_epoch(0)
    first = None  # how many were read when the first sample came out
    with _read_samples_wrapped(stream_class, counting):
        for yielded, _ in enumerate(dataset):
            first = read if first is None else first
            if read > buffer_size + 1 + yielded:
                which = "its first" if yielded == 0 else f"sample {yielded + 1}"
                raise CheckFailed(
                    f"one rank, no workers: your stream read {read} samples before it yielded "
                    f"{which}: a shuffle buffer holds at most buffer_size (here {buffer_size}) "
                    "and yields one sample for each newcomer; reading ahead (a shard, or the whole "
                    "part) holds all it read in memory. Put each sample read_samples gives into "
                    "the buffer as it comes."
                )
    if first is not None and first < buffer_size < read:
        raise CheckFailed(
            f"one rank, no workers: your stream yielded its first sample after reading {first}, "
            f"though buffer_size is {buffer_size}: a shuffle buffer fills to buffer_size before "
            "it yields, or it mixes less than it was asked to. Use self.buffer_size."
        )


def _buffer_size_for(expected):
    """The stream check's buffer: a quarter of a worker's share of ``expected`` samples (2 ranks
    × 3 workers), so that it fills and a buffer that does not mix shows; at most 100, and at least
    10, which a worker's share of a tiny dataset never fills."""
    return max(10, min(100, expected // 6 // 4))


def check_shard_stream(stream_class, shards):
    """Lesson 4: ``stream_class(shards, rank, world_size, seed, buffer_size)``, an
    ``IterableDataset`` with ``set_epoch``, streams every sample exactly once per epoch across 2
    ranks × 3 workers, in a new order each epoch, shuffled within shards too."""
    from ..layout import expand_shards
    from ..shardread import count_shard_samples

    listed = expand_shards(shards)
    expected = sum(count_shard_samples(shard) for shard in listed)
    buffer_size = _buffer_size_for(expected)
    alone = _alone_keys(stream_class, shards, buffer_size)
    if sorted(alone) != sorted(set(alone)) or len(alone) != expected:
        raise CheckFailed(_alone_explained(alone, shards, expected, buffer_size))
    epochs = [_keys_by_rank(stream_class, shards, epoch, buffer_size) for epoch in (0, 1)]
    for epoch, per_rank in enumerate(epochs):
        reason = _duplicates_explained(per_rank, expected)
        if reason:
            raise CheckFailed(f"epoch {epoch}, 2 ranks × 3 workers: {reason}")
    if epochs[0] == epochs[1]:
        raise CheckFailed(
            "every rank got the same samples in the same order in epochs 0 and 1: mix the epoch "
            "from set_epoch into the seed of the shard shuffle, so that each epoch deals the "
            "shards anew."
        )
    if [set(keys) for keys in epochs[0]] == [set(keys) for keys in epochs[1]]:
        raise CheckFailed(
            "every rank got the same shards in epochs 0 and 1, only in a new order. Shuffle the "
            "whole shard list, with a seed that mixes in the epoch, before splitting it by rank "
            "and worker: a shuffle of each part after the split, or a shard shuffle whose seed "
            "lacks the epoch, deals every rank the same shards each epoch."
        )
    _check_workers_read_their_shards(stream_class, shards, buffer_size)
    together = _shard_neighbours(epochs[0][0], shards)
    if together > 0.5:
        raise CheckFailed(
            f"{together:.0%} of the samples arrived right after their neighbour in the shard: the "
            "shuffle buffer is not mixing. Fill it first, then yield a random one for each new "
            "sample."
        )
    _check_shards_mix(alone, shards)
    _check_reads_as_it_yields(stream_class, shards, buffer_size)
    _check_stream_seeding(stream_class, shards, alone, buffer_size)
    _check_buffer_follows_epoch(stream_class, listed, buffer_size)
    _check_workers_that_stay(stream_class, shards, epochs[0][0], buffer_size)
    passed(
        f"2 ranks × 3 workers streamed all {expected:,} samples exactly once per epoch, in a new "
        f"order each epoch, {together:.0%} of neighbours still together."
    )
