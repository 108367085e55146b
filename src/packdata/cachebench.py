"""Stream every epoch, stage everything first, or cache: the same shards through the same emulated
store, measured side by side.

    result = compare_sources("data/shards-photos-small", latency=0.02, bandwidth=25e6)
    print(result)   # per source and epoch: first batch, epoch time, GETs, cache hit rate

Every source reads with the same ``ShardDataset`` split and order, decodes and crops every image,
and runs two epochs on one DataLoader whose workers stay between them. Each round starts cold (an
empty scratch folder and cache) and the sources take turns, round after round, so a slow spell of
the machine hits all of them; the table gives each figure's median and its range over the rounds.
"""

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from torch.utils.data import DataLoader
from torchvision.transforms import v2

from .bench import count_samples
from .netstore import NetworkStore
from .shardcache import ShardCache, hit_rate
from .shardread import count_shard_samples
from .streaming import ShardDataset
from .transfer import stage

CROP = v2.RandomResizedCrop(224, antialias=True)  # what a training job does to each image


@dataclass
class SourceEpochs:
    """One source's figures, one list per epoch with one value per round."""

    first_batch_s: list = field(default_factory=list)
    epoch_s: list = field(default_factory=list)
    gets: list = field(default_factory=list)
    hit_rate: list = field(default_factory=list)


@dataclass
class SourceComparison:
    """``{source: SourceEpochs}`` and the settings they were measured at."""

    sources: dict
    settings: dict

    def median(self, source, figure, epoch):
        """The median over the rounds of ``figure`` (a ``SourceEpochs`` field) in ``epoch``
        (from 0); None when it does not apply."""
        values = getattr(self.sources[source], figure)[epoch]
        return None if None in values else statistics.median(values)

    def __str__(self):
        lines = [
            "  ".join(f"{key}={value}" for key, value in self.settings.items() if key != "rounds"),
            f"{'source':<16}epoch  first batch s  epoch s (range)     GETs  hit rate",
        ]
        for name, figures in self.sources.items():
            for epoch, seconds in enumerate(figures.epoch_s):
                rate = self.median(name, "hit_rate", epoch)
                lines.append(
                    f"{name:<16}{epoch + 1:>5}  {self.median(name, 'first_batch_s', epoch):>13.2f}"
                    f"  {statistics.median(seconds):>7.2f} ({min(seconds):.2f}–{max(seconds):.2f})"
                    f"  {self.median(name, 'gets', epoch):>5.0f}"
                    f"  {'' if rate is None else f'{rate:>8.0%}'}"
                )
        return "\n".join(lines)


def timed_epoch(loader, dataset, epoch):
    """``(seconds to the first batch, seconds for the epoch)`` of epoch ``epoch``; every sample
    counted against ``len(dataset)``."""
    dataset.set_epoch(epoch)
    started, first, seen = time.perf_counter(), None, 0
    for batch in loader:
        first = first or time.perf_counter() - started
        seen += count_samples(batch)
    if seen != len(dataset):
        raise RuntimeError(f"epoch {epoch} delivered {seen} of {len(dataset)} samples")
    return first, time.perf_counter() - started


def run_source(make_dataset, store, scratch, epochs, figures, loader_options):
    """Measure ``epochs`` epochs of the dataset ``make_dataset(scratch)`` returns with its cache
    (or None), and append them to ``figures``; the time ``make_dataset`` took (staging's copy)
    counts in the first epoch."""
    store.reset_counters()
    started = time.perf_counter()
    dataset, cache = make_dataset(scratch)
    before_s = time.perf_counter() - started
    loader = DataLoader(dataset, persistent_workers=True, **loader_options)
    for epoch in range(epochs):
        mark = len(cache.events()) if cache else 0
        first, seconds = timed_epoch(loader, dataset, epoch)
        if len(figures.epoch_s) <= epoch:
            for values in (figures.first_batch_s, figures.epoch_s, figures.gets, figures.hit_rate):
                values.append([])
        figures.first_batch_s[epoch].append(first + (before_s if epoch == 0 else 0))
        figures.epoch_s[epoch].append(seconds + (before_s if epoch == 0 else 0))
        figures.gets[epoch].append(store.requests)
        figures.hit_rate[epoch].append(hit_rate(cache.events(mark)) if cache else None)
        store.reset_counters()


def compare_sources(
    shard_dir,
    *,
    latency=0.02,
    bandwidth=25e6,
    cache_sizes=(2.0, 0.5),
    ahead=1,
    rounds=3,
    epochs=2,
    num_workers=2,
    batch_size=16,
    shuffle=True,
):
    """Measure streaming every epoch, staging first and a ``ShardCache`` of each of
    ``cache_sizes`` (times the shards' total bytes) over the shards in ``shard_dir`` served by a
    ``NetworkStore`` at ``latency`` s and ``bandwidth`` bytes/s per transfer. Returns a
    ``SourceComparison``. Staging's copy counts in its first epoch and first batch.
    ``shuffle=False`` reads the shards in the same order every epoch."""
    files = sorted(Path(shard_dir).glob("*.tar"))
    working_set = sum(path.stat().st_size for path in files)
    sizes = [count_shard_samples(path) for path in files]
    common = {"sizes": sizes, "transform": CROP, "shuffle": shuffle}
    with NetworkStore(shard_dir, latency=latency, bandwidth=bandwidth) as store:
        urls = [store.url_for(path.name) for path in files]

        def streamed(scratch):
            return ShardDataset(urls, **common), None

        def staged(scratch):
            return ShardDataset(
                stage(urls, scratch, threads=num_workers, progress=False), **common
            ), None

        def cached(share):
            def make(scratch):
                cache = ShardCache(scratch, max_bytes=share * working_set, ahead=ahead)
                return ShardDataset(urls, cache=cache, **common), cache

            return make

        makers = {"stream": streamed, "stage": staged}
        makers |= {f"cache {share:g}× data": cached(share) for share in cache_sizes}
        figures = {name: SourceEpochs() for name in makers}
        options = {"batch_size": batch_size, "num_workers": num_workers}
        for _ in range(rounds):
            for name, make in makers.items():
                with tempfile.TemporaryDirectory(prefix="packdata-cachebench-") as scratch:
                    run_source(make, store, scratch, epochs, figures[name], options)
    settings = {
        "shards": len(files),
        "MB": round(working_set / 1e6, 1),
        "latency_ms": latency * 1e3,
        "MB/s per transfer": bandwidth / 1e6 if bandwidth else None,
        "workers": num_workers,
        "ahead": ahead,
        "shuffled": shuffle,
        "rounds": rounds,
    }
    return SourceComparison(figures, settings)
