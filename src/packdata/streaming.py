"""Stream samples from tar shards: an ``IterableDataset`` built from small generator stages.

Every epoch, each DataLoader worker of each rank runs the same pipeline on its own part of the
data::

    shard list ─ expand_shards ─ shuffle_shards(seed, epoch) ─ split_shards(rank, world size,
    worker, workers)
      ─ read_tuples (a read or GET per shard, members grouped by key) ─ shuffle_buffer ─ decode ─
      batched

All ranks and workers shuffle the shard list with the same seed before splitting it, so the parts
never overlap and every sample arrives exactly once per epoch across all ranks and workers. The
order is a function of seed, epoch, rank and worker, so a worker's place in it is two counts, which
``state_dict`` returns and ``load_state_dict`` resumes from (``packdata.resume``).
``set_epoch`` picks a new shard order; the shuffle buffer then mixes samples from the shards a
worker has open.

    dataset = ShardDataset("data/shards/train-{000000..000009}.tar", buffer_size=1000)
    loader = DataLoader(dataset, batch_size=64, num_workers=2)
"""

import operator
import os
import random
import warnings
from contextlib import nullcontext
from functools import partial
from itertools import chain, islice

import torch
from PIL import Image
from torch.utils.data import IterableDataset, default_collate, get_worker_info

from .compression import CompressionError
from .fields import decode_field, image_field
from .httpclient import is_url
from .images import IMAGE_FIELDS, check_decoder
from .layout import (
    ShardError,
    expand_shards,
    group_samples,
    is_meta,
    keys_digest,
    member_keys,
    raise_now,
)
from .memberread import member_tuples
from .plaingroup import plain_tuples
from .presigned import iter_secrets_withheld, secrets_withheld, withheld
from .readahead import ReadAhead
from .resume import (
    WHOLE,
    Layout,
    Progress,
    checked,
    continued,
    fingerprint,
    progress_from,
    starting,
)
from .sampleseed import seeded_by
from .shardread import count_shard_samples, read_shard
from .tario import TarFormatError
from .tarscan import scan_readable

ERROR_MODES = ("raise", "skip")
# how a shard that cannot be read at all fails: missing, HTTP error, not a tar, compressed beyond us
UNREADABLE = (OSError, TarFormatError, CompressionError)


# --- which shards, in which order, for whom -------------------------------------------------------


def shuffle_shards(shards, seed, epoch):
    """The shards in this epoch's order: the same for every rank and worker that shares ``seed``."""
    order = list(shards)
    random.Random(f"shards:{seed}:{epoch}").shuffle(order)
    return order


def split_shards(shards, rank, world_size, worker, num_workers):
    """This worker's shards: every ``world_size``-th for the rank, then every ``num_workers``-th of
    those. Over all ranks and workers the parts are disjoint and cover the list."""
    return list(shards)[rank::world_size][worker::num_workers]


# --- reading --------------------------------------------------------------------------------------


def read_tuples(shards, keys, report, progress, read=None):
    """The ``keys`` tuples of the samples left in each of ``shards`` (``(shard, resume.Rest)``
    pairs) in turn, from where ``progress`` stands (all of them, on a fresh start), each counted
    there as it is taken in; ``read(shard)`` gives a shard's bytes (``to_read`` lists those it is
    asked for, in order), or None reads each where it lies (``shard_tuples``).

    ``chain`` drops each shard's iterator, and with it the shard's bytes, before it reads the next
    shard: two shards alive at once would send the memory of one back to the system after every
    shard, and the next read would pay a page fault per 4 KiB to get it back."""
    return chain.from_iterable(
        progress.counted(
            index,
            islice(
                matched_tuples(
                    progress, index, shards, keys, progress.reporting(index, report), read
                ),
                skip,
                None,
            ),
        )
        for index, skip in progress.todo(shards)
    )


def matched_tuples(progress, index, shards, keys, report, read=None):
    """``left_tuples`` of the worker's shard ``index``, its samples checked against ``progress``
    (``Progress.opened``) before any of them comes."""
    shard, rest = shards[index]
    return left_tuples(
        shard, rest, keys, report, read, partial(progress.opened, index, shard, rest)
    )


def to_read(shards, progress):
    """The shards ``read_tuples`` reads, in its order: from the one ``progress`` stopped in on,
    those with samples left."""
    start = max(len(progress.read) - 1, 0)
    return [shard for shard, rest in shards[start:] if not rest.is_empty()]


def closing(samples, reads):
    """Yield from ``samples``, then close ``reads`` (a cache's ``PrefetchedReads``: its last shard
    let go, its downloads ahead cancelled), also when the consumer stops early."""
    try:
        yield from samples
    finally:
        reads.close()


def left_tuples(shard, rest, keys, report, read=None, seen=None):
    """The ``keys`` tuples of the samples ``rest`` leaves of ``shard``, the fast way when the shard
    allows it; a shard with nothing left is not read."""
    if rest.is_empty():
        return iter(())
    return rest.kept(shard_tuples(shard, keys, report, read, seen))


def shard_tuples(shard, keys, report, read=None, seen=None):
    """An iterator over the ``keys`` tuples of one shard's samples, its bytes from ``read(shard)``.
    With no ``read`` the shard is read where it lies: a local plain shard of large members member
    by member (``memberread``), its members copied once and the file not mapped; any other whole
    (``shardread.read_shard``: mapped, or one GET). A shard that cannot be read at all (missing, not
    a tar or cut in its first member, HTTP error) goes to ``report`` as one problem with the shard,
    and yields nothing; a shard damaged part-way (cut short, a corrupt header) yields the samples
    before the damage, then goes to ``report`` as a ``DamagedShard``. ``seen(digest)``, when given,
    hears the ``layout.keys_digest`` of the shard's sample keys before any sample comes."""
    try:
        if read is None:
            by_member = None if is_url(shard) else member_tuples(shard, keys, seen)
            if by_member is not None:
                return _until_damage(by_member, shard, report)
            read = read_shard
        data = read(shard)
    except UNREADABLE as error:
        report(error, shard=shard)
        return iter(())
    try:
        plain = plain_tuples(data, shard, keys, seen)
    except TarFormatError:
        plain = None  # a bad header: the general walk finds where, and keeps what comes before
    if plain is not None:
        return plain
    members, damage = scan_readable(data, shard)
    if damage is not None and not members:  # not a tar, or cut in its first member
        report(damage, shard=shard)
        return iter(())
    if seen is not None:
        seen(keys_digest(member_keys(name for name, _, _ in members)))
    named = [(name, data[s : s + n]) for name, s, n in members if not is_meta(name)]
    samples = to_tuple(group_samples(named, shard, report), keys, report)
    return samples if damage is None else _then_damage(samples, damage, shard, report)


class DamagedShard(TarFormatError):
    """A shard damaged part-way: the samples before the damage were read, the rest cannot be."""


def _then_damage(samples, damage, shard, report):
    """Yield ``samples``, then report ``damage``, saying how many whole samples came before it."""
    count = 0
    for count, sample in enumerate(samples, 1):  # noqa: B007 (the count is the point)
        yield sample
    report(_damaged(damage, count), shard=shard)


def _until_damage(samples, shard, report):
    """Yield ``samples``; damage found while they are read (a shard cut short meanwhile) goes to
    ``report``, saying how many whole samples came before it."""
    count = 0
    try:
        for count, sample in enumerate(samples, 1):  # noqa: B007 (the count is the point)
            yield sample
    except TarFormatError as damage:
        report(_damaged(damage, count), shard=shard)


def _damaged(damage, count):
    return DamagedShard(f"{damage} ({count} whole sample(s) of it were read before)")


def to_tuple(samples, keys, report):
    """``(sample[k] for k in keys)`` per sample; a sample without one of them goes to ``report``."""
    for sample in samples:
        try:
            yield tuple(sample[key] for key in keys)
        except KeyError as missing:
            report(ShardError(missing_member(sample, missing.args[0])))


def missing_member(sample, key):
    """Why ``sample`` has no tuple: it lacks the member ``key``, and what it may be."""
    have = ", ".join(name for name in sample if not name.startswith("__"))
    guess = (
        "a file that is no image, written as a sample?"
        if key in IMAGE_FIELDS
        else "a sample missing its label?"
    )
    return (
        f"{sample['__url__']}: sample {sample['__key__']!r} has no '.{key}' member (it has: "
        f"{have}); {guess}"
    )


def shuffle_buffer(samples, size, rng):
    """Shuffle a stream with a buffer of ``size``: fill it first, then yield a random element for
    each new one, finally drain it in random order. ``size`` ≤ 1 leaves the order alone."""
    if size <= 1:
        yield from samples
        return
    buffer = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        index = rng.randrange(size)
        yield buffer[index]
        buffer[index] = sample
    rng.shuffle(buffer)
    yield from buffer


def decode(items, keys, transform, decoder, report, sized=None, seeds=None):
    """Decode each tuple field by its key (``fields.decode_field``); ``transform`` applies to the
    image field. Items arrive as ``(shard, sample key, *fields)`` and leave as the decoded fields,
    so that a sample that cannot be decoded is named. With ``sized`` (a ``resume.Progress``, when
    batching here), an image of another shape than the first (``sized.size``, kept across a
    resume) is reported, naming both samples. With ``seeds`` (``(seed, epoch)``), each sample's
    transform runs ``sampleseed.seeded_by`` its shard and key."""
    image_key = image_field(keys)
    image = keys.index(image_key) if image_key is not None else None
    kinds = [(key, index == image) for index, key in enumerate(keys)]
    for shard, sample_key, *item in items:
        try:
            fields = [
                decode_field(value, key, is_image, decoder)
                for value, (key, is_image) in zip(item, kinds)
            ]
        # how decoders say "not this": PIL's guard against huge images and numpy's empty file too
        except (OSError, ValueError, RuntimeError, EOFError, Image.DecompressionBombError) as error:
            report(ShardError(f"{shard}: cannot decode sample {sample_key!r}: {error}"))
            continue
        if transform is not None:
            with seeded_by(*seeds, shard, sample_key) if seeds else nullcontext():
                fields[image] = transform(fields[image])
        if sized is not None and image is not None:
            shape = tuple(fields[image].shape)
            sized.size = sized.size or (shape, sample_key)
            if shape != sized.size[0]:
                report(ShardError(different_size(shard, sample_key, shape, sized.size)))
                continue
        yield tuple(fields)


def different_size(shard, sample_key, shape, first):
    """Why a sample cannot join a batch: its image's size, the first one's, and how to fix it."""
    return (
        f"{shard}: sample {sample_key!r} has an image of shape {shape}, sample {first[1]!r} one of "
        f"{first[0]}: a batch stacks images of one size; resize them, in transform= (for example "
        "torchvision's v2.Resize or v2.RandomResizedCrop) or once when writing (resize=)"
    )


def batched(items, batch_size, collate_fn=default_collate):
    """Collate every ``batch_size`` items into a batch with ``collate_fn``; the last may be
    smaller."""
    items = iter(items)
    while batch := list(islice(items, batch_size)):
        yield collate_fn(batch)


# --- counting, skipping, equalising ---------------------------------------------------------------


def equal_quotas(counts, target):
    """Trim per-worker sample counts to sum to ``target`` (≤ their sum), always taking from the
    largest: the same answer in every process that computes it."""
    quotas = list(counts)
    for _ in range(sum(quotas) - target):
        largest = max(range(len(quotas)), key=lambda w: (quotas[w], -w))
        quotas[largest] -= 1
    return quotas


def reported_before(error, shard=None):
    """The report of a shard's second read after a resume: a sample's problem was reported the
    first time, so nothing again; a shard that cannot be read now, though it was read then (gone,
    an HTTP error), stops the resume with its own error."""
    if shard is not None:
        raise error


class Skips:
    """What one worker skipped in one epoch, when skipping was asked for: the worker's
    ``progress.skipped`` (shards, damaged shards, samples), counted on from a resumed state's; the
    reasons are those of this process."""

    def __init__(self, progress):
        rank, _, worker, _ = progress.layout
        self.where = f"rank {rank} worker {worker}"
        self.reasons, self.counts = [], progress.skipped
        self.before = sum(self.counts)
        merged = sum(progress.rest.skipped) if rank == worker == 0 else 0  # the rest's, carried
        self.whose = f", {merged} of those by the workers before the epoch's rest" if merged else ""

    shards = property(lambda self: self.counts[0])
    damaged = property(lambda self: self.counts[1])
    samples = property(lambda self: self.counts[2])

    def __call__(self, error, shard=None):
        kind = 1 if isinstance(error, DamagedShard) else 0 if shard is not None else 2
        self.counts[kind] += 1
        self.reasons.append(withheld(str(error)))

    def __bool__(self):
        return any(self.counts)

    def summary(self):
        more = len(self.reasons) - 3
        examples = "; ".join(self.reasons[:3]) + (f"; and {more} more" if more > 0 else "")
        damaged = f", the rest of {self.damaged} damaged shard(s)," if self.damaged else ""
        before = f" ({self.before} of them before a resume{self.whose}, counted in its state)"
        return (
            f"{self.where} skipped {self.shards} shard(s){damaged} and {self.samples} sample(s) "
            f"this epoch{before if self.before else ''}: {examples or 'no reasons kept'}"
        )


def distributed_rank():
    """``(rank, world size)`` of this process: from ``torch.distributed`` when initialised, else
    from the ``RANK`` and ``WORLD_SIZE`` variables ``torchrun`` sets, else ``(0, 1)``, with a
    warning when the process is one of several tasks of a Slurm step."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    rank, world_size = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None and world_size is None:
        warn_of_slurm_tasks()
        return 0, 1
    if rank is None or world_size is None:
        given, missing = ("RANK", "WORLD_SIZE") if world_size is None else ("WORLD_SIZE", "RANK")
        raise ValueError(f"{given} is set and {missing} is not: set both (torchrun does), or none")
    try:
        return int(rank), int(world_size)
    except ValueError:
        raise ValueError(
            f"RANK={rank!r} and WORLD_SIZE={world_size!r}: both must be whole numbers"
        ) from None


def warn_of_slurm_tasks():
    """Warn when this process is one of several tasks of one Slurm step (``srun --ntasks``, which
    sets ``SLURM_STEP_NUM_TASKS``; a batch script is no step) and no rank was set: each task would
    read every shard."""
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS", "1")
    if tasks.isdigit() and int(tasks) > 1:
        warnings.warn(
            f"this process is task {os.environ.get('SLURM_PROCID', '?')} of {tasks} of a Slurm "
            "step, and no rank is set (no torch.distributed process group, no RANK and "
            "WORLD_SIZE): every task reads every shard. Start the ranks with torchrun, set up "
            "torch.distributed before the dataset, or pass rank= and world_size= (rank=0, "
            "world_size=1 when every task should read all)",
            stacklevel=4,  # where the dataset is made
        )


# --- the dataset ----------------------------------------------------------------------------------


class ShardDataset(IterableDataset):
    """Stream ``(image, label)`` (or the ``keys`` you name) from tar shards, each sample exactly
    once per epoch across all ranks and DataLoader workers.

    - ``shards``: a brace pattern, paths or ``http://`` URLs (a list, or one string).
    - ``rank``/``world_size``: this process's place among the training processes (default:
      ``distributed_rank``).
    - ``seed`` and ``set_epoch(epoch)``: the shard order, reshuffled every epoch (``shuffle=False``
      keeps it).
    - ``buffer_size``: the sample shuffle buffer per worker (0: none).
    - ``decode``/``transform``/``decoder``: decode images to tensors and labels to ints;
      ``decode=False`` yields bytes. ``seeded_transform=True`` seeds torch's and Python's
      global generators (not numpy's) for each sample's ``transform`` from the seed, the epoch,
      the shard's file name and the sample's key (``sampleseed``): its random augmentation is then
      the same after a resume, on any layout, as without one. Else a resumed loader's workers draw
      the epoch's first numbers again.
    - ``batch_size``: collate batches inside the workers (then use ``DataLoader(batch_size=None)``)
      with ``collate_fn`` (default ``default_collate``; ``bytebatch.collate_bytes`` hands
      undecoded bytes over in shared memory).
    - ``errors="skip"``: leave out unreadable shards and bad samples, and warn with their count at
      the end of each worker's epoch (also kept in ``last_skips`` when iterating in this process);
      default ``"raise"``. Errors and warnings name a presigned URL with its secrets
      ``(withheld)`` (``presigned.withheld``); a sample's ``__url__`` is the whole URL.
    - ``equalize=True``: every rank yields the same number of samples per epoch (the smallest
      rank's); the surplus is left out (a different part each epoch when the shard order is
      shuffled). Equal samples are not yet equal steps: each DataLoader worker batches its own
      samples, so a rank can still get one batch more than another. Stop every rank after the same
      number of batches (``train.common_steps``) so that none waits for the others.
    - ``sizes``: samples per shard (same order as the expanded list) when known; counted from the
      shards otherwise.
    - ``cache``: a ``shardcache.ShardCache``: every worker reads its shards through it (a local
      copy each, LRU-bounded, shared by the processes of the machine, the next ``cache.ahead``
      fetched while one is read); counting ``sizes`` goes through it too.
    - ``read_ahead``: shards given as URLs and read without a cache are fetched this many ahead by
      a thread of each worker, so that the next download overlaps this shard's decoding (memory:
      that many more shards per worker; 0: one after the other). Local files need none.
    - ``splitter``/``buffer``: replace the ``split_shards`` and ``shuffle_buffer`` stages (used by
      the exercises).
    - ``state_dict()``/``load_state_dict()``: resume mid-epoch, with ``StatefulDataLoader`` or by
      hand: the same ranks and workers continue the same order; other numbers of them get the rest
      of the epoch (``packdata.resume`` describes both, and the state).
    """

    def __init__(
        self,
        shards,
        *,
        rank=None,
        world_size=None,
        seed=0,
        shuffle=True,
        buffer_size=0,
        keys=("jpg", "cls"),
        decode=True,
        transform=None,
        seeded_transform=False,
        decoder="pil",
        batch_size=None,
        collate_fn=default_collate,
        errors="raise",
        equalize=False,
        sizes=None,
        cache=None,
        read_ahead=1,
        splitter=split_shards,
        buffer=shuffle_buffer,
    ):
        self.shards = expand_shards(shards)
        if rank is None or world_size is None:  # the environment only for what was left to it
            found = distributed_rank()
            rank, world_size = (
                found[0] if rank is None else rank,
                found[1] if world_size is None else world_size,
            )
        self.rank, self.world_size = operator.index(rank), operator.index(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank must be in 0..world_size-1, got rank {self.rank} of {self.world_size}"
            )
        check_decoder(decoder)
        if isinstance(keys, str):
            raise ValueError(
                f"keys={keys!r} is one string, which would be read as {len(keys)} keys of one "
                f"letter: give a tuple, such as ({keys!r},) or ('jpg', 'cls')"
            )
        for name, value in (("buffer_size", buffer_size), ("read_ahead", read_ahead)):
            whole_number(name, value)
        if batch_size is not None:
            whole_number("batch_size", batch_size)
        if transform is not None and not (decode and image_field(keys) is not None):
            raise ValueError(
                f"transform applies to a decoded image, and keys={tuple(keys)} with "
                f"decode={decode} "
                f"yields none: name an image key ({', '.join(IMAGE_FIELDS)}) and keep decode=True"
            )
        if seeded_transform and transform is None:
            raise ValueError("seeded_transform=True seeds a transform: pass transform= too")
        if collate_fn is not default_collate and not batch_size:
            raise ValueError(
                "collate_fn= collates the batches that batch_size= makes in the workers: give "
                "batch_size too, or pass collate_fn= to the DataLoader instead"
            )
        if errors not in ERROR_MODES:
            raise ValueError(f"errors must be one of {ERROR_MODES}, got {errors!r}")
        if len(self.shards) < self.world_size:
            raise ValueError(
                f"{len(self.shards)} shard(s) for {self.world_size} ranks: a rank without a shard "
                "reads "
                "nothing (and distributed training waits for it); write at least one shard per rank"
            )
        if equalize and errors == "skip":
            raise ValueError(
                "equalize=True needs exact sample counts, and errors='skip' can leave samples out "
                "after "
                "they were counted; repair or remove the bad shards, or keep errors='raise'"
            )
        if sizes is not None and len(sizes) != len(self.shards):
            raise ValueError(f"sizes has {len(sizes)} entries for {len(self.shards)} shards")
        self.seed, self.shuffle, self.buffer_size, self.keys = (
            seed,
            shuffle,
            buffer_size,
            tuple(keys),
        )
        self.decode, self.transform, self.decoder, self.batch_size = (
            decode,
            transform,
            decoder,
            batch_size,
        )
        self.collate_fn, self.seeded_transform = collate_fn, seeded_transform
        self.errors, self.equalize, self.splitter, self.buffer = errors, equalize, splitter, buffer
        self.cache, self.read_ahead = cache, read_ahead
        self._sizes = None if sizes is None else dict(zip(self.shards, sizes))
        if equalize:
            self.sizes()  # counted once here, not again in every worker
        # seen by workers that outlive an epoch
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self.last_skips = None
        self._progress = self._loaded = None  # this process's iteration, and a state to resume

    @property
    def epoch(self):
        return int(self._epoch)

    def set_epoch(self, epoch):
        """Use epoch ``epoch``'s shard order (and buffer seed) from the next iteration on. Call it
        before each epoch, in the main process. The epoch lives in shared memory, so workers kept
        alive across epochs (``persistent_workers=True``) see it too, not only workers started
        afterwards. A state loaded for another epoch is dropped: this epoch starts afresh."""
        self._epoch.fill_(operator.index(epoch))
        if self._loaded is not None and self._loaded["epoch"] != self.epoch:
            self._loaded = None

    def epoch_order(self, epoch=None):
        """The whole shard list in this epoch's order (or epoch ``epoch``'s), as every rank and
        worker sees it."""
        epoch = self.epoch if epoch is None else epoch
        return shuffle_shards(self.shards, self.seed, epoch) if self.shuffle else list(self.shards)

    def shards_for(self, worker=0, num_workers=1):
        """The shards worker ``worker`` of ``num_workers`` on this rank reads this epoch."""
        return self.splitter(self.epoch_order(), self.rank, self.world_size, worker, num_workers)

    def part(self, epoch, rest, layout):
        """The part of epoch ``epoch``'s ``rest`` (a ``resume.EpochRest``; ``resume.WHOLE``: the
        whole epoch) that the worker at ``layout`` delivers: its shards as ``(index in shards,
        resume.Rest)`` pairs in reading order, and how many samples it takes in (None: all).

        A rest is split as the epoch is, so that with as many ranks as before every rank keeps its
        shards (and, with ``equalize``, ranks with equal rests stay equal)."""
        index, order = {shard: n for n, shard in enumerate(self.shards)}, self.epoch_order(epoch)

        def split(rank, worker, num_workers):
            part = self.splitter(order, rank, layout.world_size, worker, num_workers)
            return [index[shard] for shard in part]

        mine = split(layout.rank, layout.worker, layout.num_workers)
        mine = [(shard, rest.of(shard)) for shard in mine]
        if not self.equalize:
            return mine, None
        sizes = [self.sizes()[shard] for shard in self.shards]

        def left(shards):
            return sum(rest.of(shard).count(sizes[shard]) for shard in shards)

        per_rank = [left(split(rank, 0, 1)) for rank in range(layout.world_size)]
        workers = range(layout.num_workers)
        ours = [left(split(layout.rank, worker, layout.num_workers)) for worker in workers]
        return mine, equal_quotas(ours, min(per_rank))[layout.worker]

    @secrets_withheld
    def sizes(self):
        """``{shard: number of samples}``, counted (one read per shard) the first time it is needed.
        With ``errors="skip"`` a shard that cannot be read counts 0 (iterating skips it, and counts
        it then), and a damaged one the samples before its damage."""
        if self._sizes is None:
            self._sizes = {shard: self._count(shard) for shard in self.shards}
        return self._sizes

    def _count(self, shard):
        try:
            damaged = "raise" if self.errors == "raise" else "count"
            return count_shard_samples(shard, self._read_again() or read_shard, damaged)
        except UNREADABLE:
            if self.errors == "raise":
                raise
            return 0

    @secrets_withheld
    def __len__(self):
        """Samples this rank yields this epoch (not batches). After ``load_state_dict`` of this
        epoch, those still to come: of the rest of an epoch, or of a worker's state when this
        process reads without DataLoader workers. With ``errors="skip"`` it is an estimate: the
        samples that will fail count (never below 0)."""
        layout = Layout(self.rank, self.world_size, 0, 1)
        loaded = self._loaded if self._loaded and self._loaded["epoch"] == self.epoch else None
        if loaded is not None and loaded.get("layout", list(layout)) != list(layout):
            raise ValueError(
                f"len() counts what this rank has left, and the state loaded is one worker's of "
                f"{Layout(*loaded['layout'])}: load the rest of the epoch "
                "(resume.rest_of_epoch) to count the rank's samples left"
            )
        progress = starting(loaded, self.epoch, layout)
        shards, quota = self.part(progress.epoch, progress.rest, layout)
        if quota is None:
            sizes = [self.sizes()[shard] for shard in self.shards]
            quota = sum(rest.count(sizes[index]) for index, rest in shards)
        return 0 if progress.done else max(quota - progress.yielded, 0)

    def __iter__(self):
        return iter_secrets_withheld(self.iterate(*_worker()))

    def iterate(self, worker=0, num_workers=1):
        """The pipeline ``__iter__`` runs in worker ``worker`` of ``num_workers``, or resumes."""
        layout = Layout(self.rank, self.world_size, worker, num_workers)
        keys = ("__url__", "__key__") + self.keys if self.decode else self.keys  # decode's errors
        loaded, self._loaded = self._loaded, None  # used once
        progress = self._progress = starting(loaded, self.epoch, layout)
        report = Skips(progress) if self.errors == "skip" else raise_now
        part, quota = self.part(progress.epoch, progress.rest, layout)
        shards = [(self.shards[index], rest) for index, rest in part]
        quiet = report if report is raise_now else reported_before
        reads = self._reads(to_read(shards, progress))
        samples = continued(
            progress,
            self.epoch,
            read_tuples(shards, keys, report, progress, reads),
            quota,
            partial(self.shuffled, epoch=progress.epoch, rest=progress.rest, layout=layout),
            lambda index: matched_tuples(progress, index, shards, keys, quiet, self._read_again()),
            [shard for shard, _ in shards],
        )
        if reads is not None:
            samples = closing(samples, reads)
        if self.decode:
            samples = self.decoded(samples, progress, report)
        if self.batch_size:
            samples = batched(samples, self.batch_size, self.collate_fn)
        return samples if report is raise_now else self.reporting(samples, report)

    def decoded(self, samples, progress, report):
        """``samples`` through ``decode``: images of one shape when batching here, each transform
        seeded by its sample with ``seeded_transform``."""
        sized = progress if self.batch_size else None
        seeds = (self.seed, progress.epoch) if self.seeded_transform else None
        return decode(samples, self.keys, self.transform, self.decoder, report, sized, seeds)

    def _read_again(self):
        """What reads a shard a second time (``left_tuples``, counting its samples): the cache,
        when there is one; else None, where it lies."""
        return None if self.cache is None else self.cache.read

    def _reads(self, shards):
        """What reads ``shards`` in turn: the cache, with its downloads ahead; a ``ReadAhead`` of
        URLs; None for local files, each read where it lies (the page cache has them)."""
        if self.cache is not None:
            return self.cache.reads(shards)
        if self.read_ahead > 0 and any(map(is_url, shards)):
            return ReadAhead(shards, read_shard, self.read_ahead)
        return None

    def shuffled(self, samples, epoch, rest, layout):
        """``samples`` through the shuffle buffer of the worker at ``layout`` in epoch ``epoch``
        (seeded anew for a rest of the epoch: ``rest.generation``)."""
        if self.buffer_size <= 1:
            return samples
        again = f":rest {rest.generation}" if rest.generation else ""
        seed = f"buffer:{self.seed}:{epoch}:rank {layout.rank} worker {layout.worker}{again}"
        return self.buffer(samples, self.buffer_size, random.Random(seed))

    # --- resuming (packdata.resume describes the state) -------------------------------------------

    def fingerprint(self):
        """What a saved state must agree with to be loaded here, in words."""
        return fingerprint(
            self.shards, self.seed, self.shuffle, self.buffer_size, self.keys, self.equalize
        )

    def state_dict(self):
        """Where this worker (this process, without DataLoader workers) is in its epoch: a small
        JSON-able dict. ``StatefulDataLoader`` calls it in each worker."""
        layout = Layout(self.rank, self.world_size, *_worker())
        if self._loaded is not None:  # loaded, not iterated yet
            return progress_from(self._loaded, layout).state(self.fingerprint())
        progress = self._progress or Progress(self.epoch, WHOLE, layout)
        return progress.state(self.fingerprint())

    def load_state_dict(self, state):
        """Resume the epoch of ``state`` at the next iteration (``set_epoch`` to it, as in every
        epoch).

        ``state``: a worker's ``state_dict`` (the same layout, continued in the same order), or a
        ``resume.rest_of_epoch`` (any layout: load it on every rank before making the loader).
        ``StatefulDataLoader.load_state_dict`` has it called in each worker."""
        self._loaded = checked(state, self)

    def reporting(self, samples, skips):
        """Yield from ``samples``, then keep the epoch's ``skips`` in ``last_skips`` and warn when
        there were any."""
        yield from samples
        self.last_skips = skips
        if skips:  # the epoch in the text: Python shows a text once, and each epoch has its own
            # the loop that iterates, past __iter__'s iter_secrets_withheld
            warnings.warn(f"epoch {self.epoch}: {skips.summary()}", stacklevel=3)


def whole_number(name, value):
    """``value`` as an ``int`` when it is a whole number of 0 or more; else an error naming
    ``name``."""
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be a whole number, got {value!r}") from None
    if number < 0:
        raise ValueError(f"{name} must be 0 or more, got {number}")
    return number


def _worker():
    """``(worker, num_workers)`` of this DataLoader worker; ``(0, 1)`` outside workers."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)
