"""The two-pass shuffle measured: how well it mixes, how much memory it holds, how long it takes.

    orders = {"full shuffle": full_shuffle(n, seed=0), "two-pass": output_positions(shards, keys)}
    print(quality_table(orders, labels))       # classes per batch, entropy, displacement
    peaks = gather_peaks(sources, out_dir, buckets=4)   # each bucket's bytes, and its task's peak

An order is given as the input position of each output sample (``positions[i]`` is where the
``i``-th sample written stood in the input), so the input's own order is ``0, 1, 2, …``. Timing
runs (for ``compare.in_turn``) write the same photos as shuffled shards three ways: read in random
order (what ``shardwrite.write_shards`` does), and in two passes from the folder or from a tar of
tars, on local disk or through an emulated store.
"""

import tracemalloc
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import numpy as np

from .httpclient import HttpClient
from .imagefolder import FORMAT, VERSION, parse_versioned_json
from .shardread import iter_shard_samples
from .shardwrite import ShardWriter, write_shards
from .tartars import tar_of_tars_to_shards
from .twopass import folder_sources, two_pass_shuffle

# --- orders and their quality ---------------------------------------------------------------------


def output_positions(shards, input_keys):
    """The input position of each sample of ``shards``, in the order they hold them."""
    where = {key: position for position, key in enumerate(input_keys)}
    return np.array([where[sample["__key__"]] for sample in iter_shard_samples(shards)])


def full_shuffle(count, seed=0):
    """The reference: every sample in memory, one uniformly random permutation."""
    return np.random.default_rng(seed).permutation(count)


def chunk_shuffle(count, chunk, seed=0):
    """The tempting shortcut with the same memory as a bucket: cut the input, in its order, into
    chunks of ``chunk`` samples and shuffle each chunk on its own."""
    rng = np.random.default_rng(seed)
    return np.concatenate(
        [rng.permutation(np.arange(s, min(s + chunk, count))) for s in range(0, count, chunk)]
    )


def batch_mix(labels, batch=64):
    """Per batch of ``batch`` consecutive labels: the number of distinct classes, and the entropy
    of its class shares in bits (``log2(classes)`` when every class is equally there)."""
    rows = np.asarray(labels)[: len(labels) // batch * batch].reshape(-1, batch)
    shares = np.stack([np.bincount(row, minlength=max(labels) + 1) / batch for row in rows])
    logs = np.log2(shares, where=shares > 0, out=np.zeros_like(shares))
    return (shares > 0).sum(axis=1), -(shares * logs).sum(axis=1)


def displacement(positions):
    """How far each sample moved: ``|output position - input position|``."""
    return np.abs(np.arange(len(positions)) - np.asarray(positions))


@dataclass(frozen=True)
class Quality:
    """One order's mix: mean distinct classes and entropy per batch, and the median and 10th
    percentile of the displacement as shares of the sample count."""

    classes: float
    entropy: float
    median_move: float
    low_move: float


def quality(positions, labels, batch=64):
    """The ``Quality`` of an order over the input whose ``i``-th sample has label ``labels[i]``."""
    distinct, entropy = batch_mix(np.asarray(labels)[positions], batch)
    moves = displacement(positions) / len(positions)
    return Quality(distinct.mean(), entropy.mean(), np.median(moves), np.percentile(moves, 10))


def quality_table(orders, labels, batch=64):
    """One line per order (``{name: positions}``): its ``Quality``, in words."""
    width = max(map(len, orders))
    lines = [f"{'':<{width}}  classes/batch  entropy  median move  10% move less than"]
    for name, positions in orders.items():
        q = quality(positions, labels, batch)
        lines.append(
            f"{name:<{width}}  {q.classes:>13.1f}  {q.entropy:>7.2f}  {q.median_move:>11.0%}"
            f"  {q.low_move:>17.1%}"
        )
    return "\n".join(lines)


# --- memory ---------------------------------------------------------------------------------------


class TracedHere(Executor):
    """An executor that runs each task here, as it is submitted, under ``tracemalloc``: ``peaks``
    holds each task's peak of Python memory allocated while it ran and not freed at its start."""

    def __init__(self):
        self.peaks = []

    def submit(self, fn, /, *args, **kwargs):
        future = Future()
        tracemalloc.start()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:  # the caller sees it from the future, as from a pool
            future.set_exception(error)
        finally:
            self.peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        return future


def gather_peaks(sources, out_dir, buckets, **options):
    """Run the two-pass shuffle with every task traced; ``[(bucket bytes, peak bytes)]`` of each
    gather task (the scatter tasks come first in the executor's list)."""
    traced = TracedHere()
    result = two_pass_shuffle(sources, out_dir, buckets=buckets, executor=traced, **options)
    peaks = traced.peaks[len(result.scattered) :]
    return [(gathered.held_bytes, peak) for gathered, peak in zip(result.gathered, peaks)]


# --- time -----------------------------------------------------------------------------------------


def random_order_from_store(store_url, folder, out_dir, seed=0, maxcount=100):
    """What ``write_shards`` does, through a store: the folder's manifest, then one GET per image in
    a random order, written as shards. Returns the samples written."""
    client = HttpClient(store_url)
    manifest = parse_versioned_json(client.get(f"{folder}/manifest.json"), folder, FORMAT, VERSION)
    entries = manifest["samples"]
    with ShardWriter(out_dir, maxcount=maxcount) as writer:
        for index in np.random.default_rng(seed).permutation(len(entries)):
            entry = entries[index]
            data = client.get(f"{folder}/{entry['path']}")
            writer.write(entry["key"], {"jpg": data, "cls": str(entry["label"]).encode()})
    return len(entries)


def local_runs(folder, outer, scratch, buckets=4, maxcount=100, seed=0):
    """``{name: run}`` for ``compare.in_turn``, each writing the photos in ``folder`` (also packed
    as the tar of tars ``outer``) as shuffled shards under ``scratch``, in this process."""
    options = {"buckets": buckets, "maxcount": maxcount, "seed": seed}
    return {
        "random-order read": lambda: sum(
            info.samples
            for info in write_shards(folder, scratch / "random", maxcount=maxcount, progress=False)
        ),
        "two-pass from the folder": lambda: (
            two_pass_shuffle(folder_sources(folder), scratch / "folder", **options).samples
        ),
        "two-pass from the tar of tars": lambda: (
            tar_of_tars_to_shards(outer, scratch / "tars", **options).samples
        ),
    }


def store_runs(store, folder, outer, scratch, buckets=4, maxcount=100, seed=0):
    """The same through ``store`` (a ``NetworkStore`` serving both ``folder`` and ``outer``, given
    relative to its root): a GET per image in random order, or the tar of tars streamed."""
    options = {"buckets": buckets, "maxcount": maxcount, "seed": seed}
    return {
        "random-order read, store": lambda: random_order_from_store(
            store.url, folder, scratch / "store-random", seed, maxcount
        ),
        "two-pass from the tar of tars, store": lambda: (
            tar_of_tars_to_shards(store.url_for(outer), scratch / "store-tars", **options).samples
        ),
    }
