"""Resume a ``ShardDataset`` mid-epoch after a kill: a small JSON state per worker, the same order
continued, and the rest of an epoch split over another number of ranks or workers.

What a worker's state holds
    The order of an epoch is a pure function of the seed, the epoch and the layout (rank, world
    size, DataLoader worker, number of workers). A worker takes samples in from its shards, and its
    shuffle buffer hands them on, so two counts say where it is::

        {"epoch": 3, "dataset": "7 shards 9f2c41d0, seed 0, shuffled, buffer 8, keys __key__ cls",
         "rest": null, "layout": [0, 2, 1, 2], "read": [9, 9, 4],
         "shards": ["3f0a9c1e52d87b64", "c41d0e2a9b7f3856", "07be5a3c1d9e4f28"], "yielded": 14,
         "done": false, "reported": [0, 1, 0], "skipped": [0, 0, 1], "size": null}

    ``read``: samples taken in from each of the worker's shards so far (the last one may be under
    way); ``shards``: a digest of each of those shards' sample keys in order, taken as it was read
    (``layout.keys_digest``); ``yielded``: samples its buffer handed on, before decoding and
    batching (a sample that fails to decode and is skipped counts too); ``done``: the worker
    finished its part. With ``errors="skip"``: ``reported``, the problems reading each of those
    shards reported (a shard read again on the resume passes over as many, so none is counted
    twice), and ``skipped``, the shards, damaged shards and samples it skipped this epoch (the
    warning at the epoch's end goes on from them, so none is lost with the killed process). With
    ``batch_size``: ``size``, the shape of the first image the worker decoded and its sample's key
    (images of another shape cannot join its batches; the resumed worker keeps to the same shape).
    ``rest`` is null for a whole epoch (for the rest of one, see below).
    ``StatefulDataLoader`` asks each worker for its state along with each batch it snapshots, and
    keeps the state of the batches the loop has received: prefetched batches do not count.

Same layout: the same order, continued
    The buffer draws its choices from a generator seeded by the epoch and the layout, and they
    depend on how many samples went in, never on what they are (a buffer stage given as ``buffer=``
    must be so too). Replaying it on the positions 0, 1, … of the samples taken in (nothing read,
    nothing decoded) tells which it handed on and which it still held. Only those are read again
    from their shards; the worker goes on reading where it stopped, and the order that follows is
    exactly the uninterrupted epoch's.

Another layout: the rest of the epoch
    ``rest_of_epoch(dataset, states)`` needs the states of every worker of every rank (one rank's
    checkpoint cannot say what the others delivered; ``loader_states`` takes them out of the
    ``StatefulDataLoader`` states). So each rank saves its loader's state, and on the restart every
    rank reads all of them and merges them: the result is the same on every rank. The rest of the
    epoch is every sample the epoch delivers (with ``equalize``, within the quotas) that no state
    counts as handed on. It is split over the new ranks and workers as the epoch is (its shard
    order, ``split_shards``), and each worker reads only what is left of its shards (a shard with
    nothing left, not at all), through a shuffle buffer seeded anew. With as many ranks as before,
    every rank keeps its shards and finishes its own part: only the split among its workers
    changes. The skips counted before go on with rank 0's worker 0; each worker takes the size its
    batches keep afresh, from the first image it decodes.

    Without ``equalize`` every sample left arrives exactly once. With ``equalize`` every new rank
    yields as many as the rank with the fewest left, and the surplus is left out, as ``equalize``
    does with a whole epoch; with as many ranks as before, ranks that stopped together have equal
    rests and nothing is left out. States taken during a rest carry it along, so a second kill
    resumes the same way, with the same layout or yet another one.

A shard read again on a resume (the one under way, and those the buffer held samples of) must hold
the samples the state counted, in the same order, or the resume stops with ``ShardChanged`` naming
it: a shard rewritten in between (samples added, removed or reordered) would shift the places the
state counts, and some samples would come twice or not at all.

Exactly once is counted against the checkpoint: what workers handed on after the last saved state
(batches received after the last checkpoint, before the kill) comes again after the restart, which
is what a training job restarted from that checkpoint needs.
"""

import hashlib
import warnings
from bisect import bisect_right
from collections import defaultdict
from functools import partial
from itertools import accumulate, chain, count, islice, repeat
from typing import NamedTuple

import numpy as np

from .httpclient import file_name

# --- what is left of one shard, and of an epoch ---------------------------------------------------


class Rest(NamedTuple):
    """The samples a shard still has to deliver this epoch, numbered by their place in the shard:
    those in ``pending`` (taken in earlier, still in a buffer then; all before ``start``) and those
    from ``start`` up to ``stop`` (None: the shard's end). ``digest``: the shard's sample keys'
    digest when those numbers were counted (None: it was not read yet); ``reported``: the problems
    (with ``errors="skip"``) reading it reported so far, each counted once an epoch."""

    pending: tuple = ()
    start: int = 0
    stop: int | None = None
    digest: str | None = None
    reported: int = 0

    def kept(self, samples):
        """The samples of a shard's ``samples`` (all of them, in order) that are left."""
        whole = not self.pending and self.start == 0 and self.stop is None
        return samples if whole else self._kept(samples)

    def _kept(self, samples):
        pending = set(self.pending)
        stop = float("inf") if self.stop is None else self.stop
        for number, sample in enumerate(samples):
            if number >= stop and not pending:
                return
            if number in pending or self.start <= number < stop:
                pending.discard(number)
                yield sample

    def number(self, place):
        """The number (in the shard) of the ``place``-th sample left."""
        held = len(self.pending)
        return self.pending[place] if place < held else self.start + place - held

    def count(self, size):
        """How many samples are left of a shard of ``size``."""
        stop = size if self.stop is None else min(self.stop, size)
        return len(self.pending) + max(0, stop - self.start)

    def is_empty(self):
        """Nothing left, as far as the rest itself tells (an open end may still hold nothing)."""
        return not self.pending and self.stop is not None and self.stop <= self.start

    def after(self, taken):
        """What is left once the first ``taken`` samples left have been taken in."""
        held = len(self.pending)
        if taken <= held:
            return self._replace(pending=self.pending[taken:])
        return self._replace(pending=(), start=self.start + taken - held)

    def first(self, number):
        """Only the first ``number`` samples left (a quota)."""
        held = len(self.pending)
        if number <= held:
            return self._replace(pending=self.pending[:number], stop=self.start)
        stop = self.start + number - held
        return self._replace(stop=stop if self.stop is None else min(self.stop, stop))

    def done(self):
        """This rest once its shard was read to the end: only the pending samples are left."""
        return self._replace(stop=self.start)

    def with_pending(self, numbers):
        """This rest and the samples ``numbers`` (before ``start``) still to deliver."""
        return self._replace(pending=tuple(sorted(self.pending + tuple(numbers))))


ALL = Rest()
NO_SKIPS = (0, 0, 0)  # shards, damaged shards, samples


class EpochRest(NamedTuple):
    """What an epoch still has to deliver: ``shards`` maps a shard's index (in the dataset's list)
    to its ``Rest`` (absent: all of it); ``generation`` counts the resumes with another layout;
    ``skipped``: the shards, damaged shards and samples skipped before (rank 0's worker 0 goes on
    counting them)."""

    generation: int = 0
    shards: dict = {}
    skipped: tuple = NO_SKIPS

    def of(self, index):
        return self.shards.get(index, ALL)

    def to_json(self):
        if not self.generation:
            return None
        rows = [
            [index, rest.start, rest.stop, list(rest.pending), rest.digest, rest.reported]
            for index, rest in self.shards.items()
        ]
        return {
            "generation": self.generation,
            "shards": sorted(rows),
            "skipped": list(self.skipped),
        }

    @classmethod
    def from_json(cls, saved):
        if saved is None:
            return WHOLE
        shards = {i: Rest(tuple(p), a, b, d, r) for i, a, b, p, d, r in saved["shards"]}
        return cls(saved["generation"], shards, tuple(saved["skipped"]))


WHOLE = EpochRest()


class Layout(NamedTuple):
    """Where a worker sits: its rank among ``world_size`` ranks, its place among its rank's
    DataLoader workers (worker 0 of 1 without workers)."""

    rank: int
    world_size: int
    worker: int
    num_workers: int

    def __str__(self):
        return f"rank {self.rank} of {self.world_size}, worker {self.worker} of {self.num_workers}"


def fingerprint(shards, seed, shuffle, buffer_size, keys, equalize):
    """What must not change between a state and the dataset it is loaded into, in words. Shards
    count by file name, so data served from another host or port (a restarted store), or through
    URLs presigned anew, still fits. Their contents do not count: a shard rewritten under its name
    between the save and the resume is noticed when it is read again (``Progress.opened``, by its
    sample keys): leave a run's shards as they are until the run is over."""
    names = hashlib.sha1("\n".join(map(file_name, shards)).encode()).hexdigest()
    order = "shuffled" if shuffle else "in order"
    equal = ", equalized" if equalize else ""
    return (
        f"{len(shards)} shards {names[:8]}, seed {seed}, {order}, buffer {buffer_size}, "
        f"keys {' '.join(keys)}{equal}"
    )


# --- one worker's place ---------------------------------------------------------------------------


class ShardChanged(ValueError):
    """A shard read again on a resume is not the one the state counted samples in."""


class Progress:
    """How far one worker is through its part of an epoch (or of an epoch's rest): how many
    samples it took in from each of its shards (``read``) and which samples those held
    (``shards``, their keys' digests), how many its buffer handed on (``yielded``); the problems
    reading each shard reported (``reported``), and what it skipped this epoch (``skipped``: shards,
    damaged shards, samples; ``streaming.Skips`` counts into it); the ``(shape, sample key)`` of the
    first image it decoded when it batches (``size``, set by ``streaming.decode``)."""

    def __init__(
        self,
        epoch,
        rest,
        layout,
        read=(),
        shards=(),
        yielded=0,
        done=False,
        *,
        reported=(),
        skipped=NO_SKIPS,
        size=None,
    ):
        self.epoch, self.rest, self.layout = epoch, rest, layout
        self.read, self.shards = list(read), list(shards)
        self.yielded, self.done = yielded, done
        self.reported, self.skipped = list(reported), list(skipped)
        self.size = None if size is None else (tuple(size[0]), size[1])

    def state(self, dataset):
        """The JSON-able state (see the module's description)."""
        return {
            "epoch": self.epoch,
            "dataset": dataset,
            "rest": self.rest.to_json(),
            "layout": list(self.layout),
            "read": list(self.read),
            "shards": list(self.shards),
            "yielded": self.yielded,
            "done": self.done,
            "reported": list(self.reported),
            "skipped": list(self.skipped),
            "size": None if self.size is None else [list(self.size[0]), self.size[1]],
        }

    def todo(self, shards):
        """``(index, skip)`` for each shard still to read of the worker's ``shards`` (``(shard,
        Rest)`` pairs), from the one it stopped in (skip what it took from it); each counts as
        started when it is reached."""
        for index in range(max(len(self.read) - 1, 0), len(shards)):
            if index == len(self.read):
                self.read.append(0)
                self.shards.append(None)
                self.reported.append(shards[index][1].reported)
            yield index, self.read[index]

    def reporting(self, index, report):
        """``report`` for the problems of reading the worker's shard ``index`` from its start, each
        counted in ``reported``: those counted before a resume (the shard is read again from its
        start) are passed over, so that each problem is reported once an epoch."""
        before, seen = self.reported[index], 0

        def once(error, shard=None):
            nonlocal seen
            seen += 1
            if seen > before:
                self.reported[index] = seen
                report(error, shard=shard)

        return once

    def opened(self, index, shard, rest, digest):
        """Note the ``digest`` of the sample keys of the worker's shard ``index`` (``shard``, whose
        ``rest`` is left) as it is read; refuse the shard when a state counted other samples in
        it."""
        counted = self.shards[index] if self.shards[index] is not None else rest.digest
        if counted is not None and counted != digest:
            raise ShardChanged(
                f"{shard} holds other samples than when the state was saved (the digest of its "
                f"sample keys was {counted}, it is {digest} now): it was rewritten since, so the "
                "samples the state counts in it are no "
                "longer where they were. Resume with the shards the run started with, or start "
                "the epoch afresh"
            )
        self.shards[index] = digest

    def counted(self, index, samples):
        """``samples`` of shard ``index``, each counted in ``read`` as it is taken in."""
        for sample in samples:
            self.read[index] += 1
            yield sample


def checked(state, dataset, stacklevel=3):
    """``state`` (a worker's, or a rest of an epoch), refused with the reason when it does not fit
    ``dataset`` (a ``ShardDataset``); a state saved by an older packdata is read as this one saves
    it (``upgraded``), with a warning when ``dataset`` needs what it lacks (``unchecked``), given
    once a job: on rank 0, by its worker 0's state or by a rest."""
    if not isinstance(state, dict) or not {"epoch", "dataset", "rest"} <= state.keys():
        raise ValueError(
            "not a ShardDataset state: expected a dict with 'epoch', 'dataset' and 'rest' (from "
            "state_dict() or resume.rest_of_epoch)"
        )
    if state["dataset"] != dataset.fingerprint():
        raise ValueError(
            f"the state is of another dataset: it was saved for {state['dataset']!r}, this one is "
            f"{dataset.fingerprint()!r}"
        )
    state, missing = upgraded(state)
    lacking = unchecked(missing, dataset)
    rank, _, worker, _ = state.get("layout", [dataset.rank, 1, 0, 1])
    if lacking and rank == worker == dataset.rank == 0:  # every rank checks rank 0's states
        warnings.warn(
            f"the state was saved by an older packdata, without {', '.join(lacking)}: it resumes, "
            f"but {'; '.join(OLDER[field] for field in lacking)}",
            stacklevel=stacklevel,
        )
    return state


# The fields of a state that an older packdata did not save, and what goes unchecked without them.
OLDER = {
    "shards": "a shard rewritten since it was saved goes unnoticed",
    "reported": "a problem found before it may be counted again",
    "skipped": "the skips before it are left out of the epoch's count",
    "size": "the image shape its batches keep is taken afresh after it",
}


def unchecked(missing, dataset):
    """Of the ``missing`` fields, those that ``dataset`` uses: the problems and skips when it skips
    them (``errors="skip"``), the image shape when it decodes and batches."""
    used = {"shards"}
    used |= {"reported", "skipped"} if dataset.errors == "skip" else set()
    used |= {"size"} if dataset.decode and dataset.batch_size else set()
    return [field for field in missing if field in used]


def upgraded(state):
    """``(state, missing)``: ``state`` as this packdata saves it, the fields an older one did not
    save (``OLDER``) read as empty, and the names of those fields."""
    missing = [field for field in OLDER if "layout" in state and field not in state]
    rest = state["rest"]
    if rest is not None and "skipped" not in rest:  # rows lacked a digest, then problems
        short = any(len(row) < 5 for row in rest["shards"])
        lacks = {*missing, *("shards",) * short, "reported", "skipped"}
        missing = [field for field in OLDER if field in lacks]
        rows = [[*row, *(None, 0)[len(row) - 4 :]] for row in rest["shards"]]
        state = {**state, "rest": {**rest, "shards": rows, "skipped": list(NO_SKIPS)}}
    read = len(state.get("read", ()))
    empty = {
        "shards": [None] * read,
        "reported": [0] * read,
        "skipped": list(NO_SKIPS),
        "size": None,
    }
    return {**(empty if "layout" in state else {}), **state}, missing


def progress_from(state, layout):
    """The ``Progress`` a loaded ``state`` gives the worker at ``layout``: where the worker was (a
    worker's state, same layout only), or the start of a rest of an epoch (any layout)."""
    rest = EpochRest.from_json(state["rest"])
    if "layout" not in state:  # the skips before go on with rank 0's worker 0
        first = layout.rank == 0 and layout.worker == 0
        return Progress(state["epoch"], rest, layout, skipped=rest.skipped if first else NO_SKIPS)
    if Layout(*state["layout"]) != layout:
        raise ValueError(
            f"this state is of {Layout(*state['layout'])}, loaded into {layout}: a worker's state "
            "resumes the same layout only. To resume with other ranks or workers, merge the states "
            "of every rank's workers with packdata.resume.rest_of_epoch and load that"
        )
    return Progress(
        state["epoch"],
        rest,
        layout,
        state["read"],
        state["shards"],
        state["yielded"],
        state["done"],
        reported=state["reported"],
        skipped=state["skipped"],
        size=state["size"],
    )


def starting(loaded, epoch, layout):
    """The ``Progress`` an iteration over ``epoch`` starts from: the ``loaded`` state's place
    (None: the epoch's beginning). A finished epoch's state starts the next epoch afresh."""
    if loaded is None or (loaded["epoch"] != epoch and loaded.get("done")):
        return Progress(epoch, WHOLE, layout)
    return progress_from(loaded, layout)


def _same_epoch(progress, epoch):
    """Refuse to go on from the middle of another epoch than the dataset's ``epoch``."""
    if progress.epoch != epoch:
        raise ValueError(
            f"the state loaded is from the middle of epoch {progress.epoch}, and the dataset is "
            f"at epoch {epoch}: call set_epoch({progress.epoch}) before iterating to resume it"
        )


# --- the stream, continued ------------------------------------------------------------------------


def continued(progress, epoch, samples, quota, shuffled, read_again, names):
    """The samples a worker hands on in ``epoch`` from where ``progress`` stands, counted in
    ``yielded``. A progress from another epoch is refused when the first sample is asked for (a
    ``StatefulDataLoader`` loading a state saved at an epoch's end makes an iterator it never uses).

    ``samples``: what it takes in next (``read`` already counts them); ``quota``: how many it takes
    in all epoch (None: all); ``shuffled``: its buffer stage; ``read_again(index)``: the samples
    left of its shard ``index``, read again; ``names``: its shards' names, for errors."""
    _same_epoch(progress, epoch)
    consumed = sum(progress.read)
    if quota is not None:
        samples = islice(samples, max(quota - consumed, 0))
    if consumed:
        out = _replayed(
            progress, consumed, samples, shuffled, partial(_read_held, read_again, names)
        )
    else:  # a fresh start: nothing to replay, the samples need no positions
        out = shuffled(samples)
    for sample in out:
        progress.yielded += 1
        yield sample
    progress.done = True


def _replayed(progress, consumed, samples, shuffled, read_held):
    """The buffer's output after the ``progress.yielded`` samples it had handed on: the buffer is
    replayed on the positions of the samples taken in, those it held are read again
    (``read_held``)."""
    out = shuffled(chain(zip(range(consumed), repeat(None)), zip(count(consumed), samples)))
    found = read_held(still_held(out, progress.yielded, consumed), progress.read)
    return (found.pop(position) if sample is None else sample for position, sample in out)


def still_held(out, yielded, consumed):
    """Advance a buffer's output ``out`` (``(position, sample)`` pairs) past ``yielded`` items; the
    positions (below ``consumed``) it holds then."""
    left = np.ones(consumed, dtype=bool)
    handed = [position for position, _ in islice(out, yielded)]
    if len(handed) != yielded or any(position >= consumed for position in handed):
        raise ValueError(_replay_failed(yielded, consumed))
    left[handed] = False
    return np.flatnonzero(left).tolist()


def _replay_failed(yielded, consumed):
    return (
        f"the state says the buffer handed on {yielded} of {consumed} samples taken in, and "
        "replaying it does not: was the dataset saved with another buffer, or are the shards "
        "different now?"
    )


def places(positions, read):
    """``{shard index: {place among its samples left: position}}`` for positions in the stream of a
    worker that took ``read[i]`` samples in from its shard ``i``."""
    ends = list(accumulate(read))
    found = defaultdict(dict)
    for position in positions:
        index = bisect_right(ends, position)
        found[index][position - (ends[index - 1] if index else 0)] = position
    return found


def _read_held(read_again, names, positions, read):
    """``{position: sample}`` for the samples the buffer held, read again from their shards."""
    found, short = {}, []
    for index, wanted in places(positions, read).items():
        before = len(found)
        for place, sample in enumerate(islice(read_again(index), max(wanted) + 1)):
            if place in wanted:
                found[wanted[place]] = sample
        if len(found) - before != len(wanted):
            short.append(names[index])
    if short:
        raise ValueError(
            f"{len(positions) - len(found)} of the samples the buffer held are no longer in their "
            f"shards ({', '.join(map(str, short))}): were the shards rewritten since the state "
            "was saved?"
        )
    return found


# --- the rest of an epoch, from every rank's states -----------------------------------------------


def loader_states(state):
    """The dataset states of each worker in a ``StatefulDataLoader.state_dict()``, worker 0 first.

    Refused when the loader saved them some steps before the state (``snapshot_every_n_steps`` > 1
    and a checkpoint between snapshots): those steps' samples would count as not delivered."""
    if "_snapshot" not in state:  # no workers: the dataset's state of this process
        return [state["dataset_state"]]
    if state["_steps_since_snapshot"]:
        raise ValueError(
            f"the loader's workers were last saved {state['_steps_since_snapshot']} step(s) before "
            "this checkpoint: take checkpoints at its snapshot steps, or snapshot_every_n_steps=1"
        )
    workers = state["_snapshot"]["_worker_snapshots"]
    return [workers[f"worker_{worker}"]["dataset_state"] for worker in range(len(workers))]


def rest_of_epoch(dataset, states):
    """Merge the states of every worker of every rank (``loader_states`` of each rank's loader
    state) into the rest of their epoch: load it with ``dataset.load_state_dict`` on every rank of
    the new layout (the module's description defines it)."""
    states = _complete(dataset, states)
    epoch, before = states[0]["epoch"], EpochRest.from_json(states[0]["rest"])
    left = dict(before.shards)
    for state in states:
        layout = Layout(*state["layout"])
        shards, quota = dataset.part(epoch, before, layout)
        left.update(_left_by(dataset, state, layout, shards, quota))
    left = {shard: rest for shard, rest in left.items() if rest != ALL}
    skipped = tuple(map(sum, zip(*(state["skipped"] for state in states))))
    rest = EpochRest(before.generation + 1, left, skipped)
    return {"epoch": epoch, "dataset": states[0]["dataset"], "rest": rest.to_json()}


def _complete(dataset, states):
    """``states`` in layout order, refused unless they are every worker's of one epoch and one
    layout."""
    states = sorted((checked(state, dataset, stacklevel=5) for state in states), key=_layout_of)
    if not states or any("layout" not in state for state in states):
        raise ValueError("rest_of_epoch needs the states of workers (ShardDataset.state_dict)")
    first = states[0]
    mixed = {(s["epoch"], repr(s["rest"]), *s["layout"][1::2]) for s in states}
    if len(mixed) > 1:
        raise ValueError(f"the states are of different epochs, rests or layouts: {sorted(mixed)}")
    world_size, num_workers = first["layout"][1::2]
    expected = [
        [rank, world_size, worker, num_workers]
        for rank in range(world_size)
        for worker in range(num_workers)
    ]
    if [state["layout"] for state in states] != expected:
        missing = [str(Layout(*x)) for x in expected if x not in [s["layout"] for s in states]]
        raise ValueError(
            "the rest of an epoch needs the state of every worker of every rank, each once; "
            f"missing or repeated: {'; '.join(missing) or 'a worker given twice'}"
        )
    return states


def _layout_of(state):
    return state.get("layout", [])


def _left_by(dataset, state, layout, shards, quota):
    """``{shard index: Rest}``: what is left of the shards of the worker whose ``state`` this is."""
    progress = progress_from(state, layout)
    read = progress.read
    consumed = sum(read)
    out = dataset.shuffled(
        zip(range(consumed), repeat(None)), progress.epoch, progress.rest, layout
    )
    held = places(still_held(out, progress.yielded, consumed), read)
    budget = None if quota is None else quota - consumed
    sizes = [dataset.sizes()[shard] for shard in dataset.shards] if quota is not None else None
    left = {}
    for index, (shard, rest) in enumerate(shards):
        pending = [rest.number(place) for place in held.get(index, ())]
        if index < len(read):
            rest = rest.after(read[index])
            rest = rest.done() if index < len(read) - 1 else rest
            digest = progress.shards[index]  # None: the shard had nothing left to read
            rest = rest if digest is None else rest._replace(digest=digest)
            rest = rest._replace(reported=progress.reported[index])
        if budget is not None:
            rest = rest.first(budget)
            budget -= rest.count(sizes[shard])
        left[shard] = rest.with_pending(pending)
    return left
