"""Checks of lesson 5: a webdataset loader for two ranks, run through real worker processes and
audited epoch by epoch.
"""

from collections import Counter
from collections.abc import Mapping
from typing import NamedTuple

from .feedback import CheckFailed, passed, stop_workers


def _dataset_of(loader):
    """What a ``DataLoader`` (or a ``WebLoader`` around one) sends to each worker process;
    ``CheckFailed`` when it starts fewer than the 2 workers the task asks for."""
    from torch.utils.data import DataLoader

    inner = loader if isinstance(loader, DataLoader) else _inner_loader(loader)
    if inner.num_workers < 2:
        raise CheckFailed(
            f"make_loader's loader starts {inner.num_workers} worker(s); the task asks for 2 "
            "(num_workers=2): with workers, each must get shards of its own, which is what "
            "this exercise is about."
        )
    return inner.dataset


def _inner_loader(loader):
    """The ``DataLoader`` inside a ``WebLoader``."""
    from torch.utils.data import DataLoader

    inner = [stage for stage in getattr(loader, "pipeline", ()) if isinstance(stage, DataLoader)]
    if not inner:
        raise CheckFailed(
            f"make_loader returned a {type(loader).__name__}: return a wds.WebLoader (or a "
            "DataLoader) with 2 workers."
        )
    return inner[0]


def _check_pickles(dataset):
    """Spawn and forkserver workers receive ``dataset`` pickled: fail early, with the cure."""
    import pickle

    try:
        pickle.dumps(dataset)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise CheckFailed(
            f"the pipeline does not pickle ({error}): spawn and forkserver workers would fail. "
            "Use functions defined in a module, or operator.itemgetter/methodcaller, not lambdas."
        ) from None


def _batch_keys(batch):
    """The keys of one ``(keys, labels)`` batch; a sample, a dict or uncollated samples are named
    as what they are."""
    if isinstance(batch, Mapping):
        raise CheckFailed(
            f"the loader yielded a dict with {sorted(batch)[:4]}: pick the fields with "
            '.to_tuple("__key__", "cls"), then .batched(32).'
        )
    if isinstance(batch[0], str):
        raise CheckFailed(
            f"the loader yielded one sample, {tuple(batch)!r:.80}, not a batch: end the pipeline "
            "with .batched(32), so that workers hand over batches."
        )
    if not all(isinstance(key, str) for key in batch[0]) and all(
        isinstance(key, str) for key in batch[-1]
    ):
        raise CheckFailed(
            f"a batch starts with {batch[0]!r:.60} and ends with the keys: pick the key first, "
            '.to_tuple("__key__", "cls"), so that a batch is (keys, labels).'
        )
    if not all(isinstance(key, str) for key in batch[0]):
        raise CheckFailed(
            f"a batch starts with {batch[0]!r:.80}, not a list of keys: let .batched(32) collate "
            "the samples (no collation_fn), so that a batch is (keys, labels)."
        )
    return batch[0]


def _webdataset_keys(make_loader, shards, epoch, rank):
    """``(keys, shard shuffle)``: the keys rank ``rank`` of 2 gets from
    ``make_loader(shards, epoch)``, under the variables torchrun would set, and its pipeline's
    ``_shard_order``."""
    from ..torchrunenv import environment

    given = list(shards) if isinstance(shards, list) else shards  # each rank has its own list
    try:
        with environment(RANK=rank, WORLD_SIZE=2):  # reaches forkserver workers too
            loader = make_loader(given, epoch)
            dataset = _dataset_of(loader)
            _check_pickles(dataset)
            found = _keys_of(loader), _shard_order(dataset)
    except ValueError as error:
        if "nodesplitter" in str(error):
            raise CheckFailed(
                "webdataset refused to run on rank 0 of 2: give it a nodesplitter "
                "(nodesplitter=wds.split_by_node)."
            ) from None
        raise
    if given != shards:
        raise CheckFailed(
            "make_loader reordered the shard list it was given (random.shuffle shuffles in "
            "place): a job that passes the same list every epoch then builds each epoch's order "
            "on the last one's, and a job resumed at epoch k reads another order than one that "
            "ran through. Shuffle a copy: order = list(shards)."
        )
    return found


class _ShardOrder(NamedTuple):
    """What decides a webdataset pipeline's shard order (``_shard_order``)."""

    listed: tuple  # the shard list as given, and its own seed: (urls, seed)
    size: int  # the shard shuffle's size: 0 (or False) shuffles nothing
    seed: object  # the shard shuffle's seed (detshuffle's: seed and epoch)


def _shard_order(dataset):
    """What decides a webdataset pipeline's shard order, from the stages before the one that opens
    the shards: a ``_ShardOrder``; None when the
    pipeline is laid out otherwise. The shard list comes as given, reshuffled when
    ``SimpleShardList`` has a seed; the shuffle is ``WebDataset(shardshuffle=..., seed=...)``'s
    (a size of 0, False or none at all shuffles nothing; ``detshuffle`` seeds with its seed and
    epoch). A loader made anew for each epoch, as here, starts all of them afresh: the same list,
    seeds and epoch give the same shard order."""
    from webdataset import cache, filters

    stages = getattr(dataset, "pipeline", [])
    opens = [
        isinstance(stage, (cache.StreamingOpen, cache.FileCache))
        or getattr(getattr(stage, "f", None), "__name__", "") in ("tarfile_samples", "url_opener")
        for stage in stages
    ]
    if True not in opens:
        return None
    before = stages[: opens.index(True)]
    given = next((stage for stage in before if hasattr(stage, "urls")), None)
    if given is None:
        return None
    size, seed = 0, None
    for stage in before:
        if isinstance(stage, filters.detshuffle):
            size, seed = stage.bufsize, (stage.seed, stage.epoch)
        elif isinstance(stage, filters.FilterFunction) and stage.f is filters._shuffle:
            size = (stage.args or (stage.kw.get("bufsize", 1000),))[0]
            seed = stage.kw.get("seed")
    return _ShardOrder((list(given.urls), getattr(given, "seed", None)), size, seed)


def _keys_of(loader):
    """The keys of every batch ``loader`` yields. Its workers are stopped here, even when it
    raises, not when a later check's fork collects its iterator: an error from a worker keeps the
    DataLoader's iterator, and so its workers, alive in its traceback (a notebook keeps the last
    error), even when a ``CheckFailed`` raised ``from None`` replaces it."""
    batches, keys = iter(loader), []
    try:
        for batch in batches:
            keys += _batch_keys(batch)
    except Exception as error:
        _stop_workers_behind(error)
        raise
    finally:
        stop_workers(batches)
    return keys


def _stop_workers_behind(error):
    """Stop the workers of each DataLoader iterator in ``error``'s traceback (the one that raised
    a worker's error here, inside a ``WebLoader``'s generator)."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    trace = error.__traceback__
    while trace is not None:
        iterator = trace.tb_frame.f_locals.get("self")
        if isinstance(iterator, _MultiProcessingDataLoaderIter):
            stop_workers(iterator)
        trace = trace.tb_next


def _webdataset_epoch_explained(epoch, per_rank, expected):
    """Why one epoch of 2 ranks did not deliver every sample once, in words, or None."""
    everyone = per_rank[0] + per_rank[1]
    twice_within = [rank for rank, keys in enumerate(per_rank) if len(keys) != len(set(keys))]
    if twice_within and len(set(everyone)) == expected:
        rank = twice_within[0]
        if set(Counter(per_rank[rank]).values()) == {2}:  # once from each worker
            return (
                f"epoch {epoch}: within rank {rank}, every sample arrived twice: each of its 2 "
                "workers read all of the rank's shards. Leave workersplitter at its default "
                "(wds.split_by_worker)."
            )
        return (
            f"epoch {epoch}: within rank {rank}, {len(per_rank[rank])} samples arrived, "
            f"{len(set(per_rank[rank]))} distinct: with_epoch and resampled=True repeat samples "
            "(in webdataset 1.0.2, .with_epoch(n) cuts or repeats each worker's stream to n "
            "items; resampled=True draws shards with replacement, without end). An exact epoch "
            "needs neither: leave both out, and each worker reads its shards once."
        )
    if len(everyone) == 2 * expected and len(set(everyone)) == expected:
        return (
            f"epoch {epoch}: both ranks read every shard. nodesplitter=wds.split_by_node gives "
            "each rank its own."
        )
    if len(everyone) == len(set(everyone)) < expected:
        missing = expected - len(everyone)
        cause = (
            "Does each worker drop its last, short batch (partial=False)? .batched(32) keeps it. "
            "Or is the epoch cut short (with_epoch)?"
            if missing < min(2 * 2 * 32, expected // 2)  # at most a batch short in each worker
            else "Are the shards split by rank twice (a slice of your own, then "
            "split_by_node), or the epoch cut short (with_epoch)?"
        )
        return f"epoch {epoch}: {missing} of {expected} samples never arrived. {cause}"
    if len(everyone) != expected or len(set(everyone)) != expected:
        return (
            f"epoch {epoch}: {len(everyone)} samples arrived, {len(set(everyone))} distinct, of "
            f"{expected}: some came more than once and others never. Shards drawn with "
            "replacement (resampled=True) do that, and so does a worker split where the split by "
            "node belongs (nodesplitter=wds.split_by_node)."
        )
    return None


def check_webdataset_loader(make_loader, shards):
    """Lesson 5: ``make_loader(shards, epoch)`` returns a ``WebLoader`` of ``(keys, labels)``
    batches that, as 2 ranks, delivers every sample once per epoch, in a new shard order."""
    from ..layout import expand_shards
    from ..shardread import count_shard_samples

    expected = sum(count_shard_samples(shard) for shard in expand_shards(shards))
    runs = [[_webdataset_keys(make_loader, shards, e, rank) for rank in (0, 1)] for e in (0, 1)]
    epochs = [[keys for keys, _ in per_rank] for per_rank in runs]
    for epoch, per_rank in enumerate(epochs):
        reason = _webdataset_epoch_explained(epoch, per_rank, expected)
        if reason:
            raise CheckFailed(reason)
    orders = [per_rank[0][1] for per_rank in runs]  # rank 0's, epochs 0 and 1
    # the same list, with the same seed of its own (or none), in both epochs
    same_list = None not in orders and orders[0].listed == orders[1].listed
    if epochs[0] == epochs[1] or (same_list and not orders[0].size):
        raise CheckFailed(
            "the shards came in the same order in epochs 0 and 1: shuffle them "
            "(shardshuffle=len(shards); False or leaving it out keeps their order; a buffer of "
            "samples, .shuffle(n), mixes only neighbours) and seed that shuffle from the epoch (a "
            "new WebDataset per epoch, seed=epoch: detshuffle=True counts its passes afresh in "
            "every new WebDataset, and in every worker started anew)."
        )
    if same_list and orders[0].seed is not None and orders[0].seed == orders[1].seed:
        raise CheckFailed(
            f"the shard order repeats every epoch: the shard shuffle is seeded {orders[0].seed!r} "
            "in epochs 0 and 1, so it draws the same order each time (a buffer of samples, "
            ".shuffle(n), mixes only neighbours, and so the samples' order changed). Seed the "
            "shard shuffle from the epoch: seed=epoch, or your own base seed and the epoch as a "
            'pair, seed=f"{base}:{epoch}" (base + epoch would give base 1\'s epoch 0 the order '
            "of base 0's epoch 1)."
        )
    passed(f"2 ranks read all {expected:,} samples once per epoch, in a new order each epoch.")
