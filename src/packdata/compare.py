"""Repeated, interleaved measurements, and only the verdicts they support.

One timing on a shared two-core machine says as much about the machine as about the code: another
program, a page-cache hiccup or a slow spell of one core moves it by tens of percent. So every
configuration runs once per round, the configurations taking turns, for several rounds: a slow spell
hits all of them. A verdict is drawn only when the rounds do not overlap; otherwise it says so.

    comparison = compare.in_turn({"0 workers": run0, "2 workers": run2}, rounds=3)
    print(comparison.verdict("2 workers", "0 workers"))
"""

import statistics
import time
from dataclasses import dataclass

from torch.utils.data import DataLoader

from .bench import SampleCountError, count_samples

NO_CLEAR_DIFFERENCE = "no clear difference: the rounds overlap"


def sentence(*parts, width=88):
    """``parts`` joined by spaces, a line at most ``width`` columns where the parts allow: a part
    that would pass it starts a new line, indented, so that a verdict fits a slide."""
    lines = [parts[0]]
    for part in parts[1:]:
        if len(lines[-1]) + 1 + len(part) <= width:
            lines[-1] += " " + part
        else:
            lines.append("  " + part)
    return "\n".join(lines)


@dataclass(frozen=True)
class Ratio:
    """``top / bottom``: the ratio of the medians, and the lowest and highest ratio of a round's
    pair."""

    value: float
    low: float
    high: float

    def __format__(self, spec):
        spec = spec or ".2f"
        return f"{self.value:{spec}}× (rounds {self.low:{spec}}× to {self.high:{spec}}×)"

    def __str__(self):
        return format(self)


@dataclass
class Comparison:
    """Rates by configuration, one per round; rounds were measured with the configurations taking
    turns."""

    rates: dict
    unit: str = "samples/s"

    def median(self, name):
        return statistics.median(self.rates[name])

    def best(self):
        """The configuration with the highest median rate."""
        return max(self.rates, key=self.median)

    def ratio(self, top, bottom):
        """``top`` against ``bottom``: a ``Ratio`` of medians with the spread of each round's
        pair."""
        pairs = [a / b for a, b in zip(self.rates[top], self.rates[bottom])]
        return Ratio(self.median(top) / self.median(bottom), min(pairs), max(pairs))

    def clearly(self, top, bottom):
        """1 when every round of ``top`` beat every round of ``bottom``, -1 when the opposite, 0
        when their rounds overlap."""
        top, bottom = self.rates[top], self.rates[bottom]
        if min(top) > max(bottom):
            return 1
        if max(top) < min(bottom):
            return -1
        return 0

    def verdict(self, top, bottom, faster="faster", slower="slower"):
        """``top`` against ``bottom`` in words, with the ratio and its spread: ``faster`` or
        ``slower`` only when the rounds do not overlap."""
        words = {1: faster, -1: slower, 0: NO_CLEAR_DIFFERENCE}[self.clearly(top, bottom)]
        return sentence(f"{top} / {bottom}:", f"{self.ratio(top, bottom)}:", words)

    def alike(self, top, bottom, within=0.1, alike="alike", unlike="unlike"):
        """``top`` against ``bottom`` in words, where the point is that they cost the same:
        ``alike`` when their rounds overlap and the medians are within ``within`` of each other,
        ``unlike`` when the rounds do not overlap and the medians differ by more; otherwise no
        verdict. "No clear difference" alone would not hold run after run: chance separates
        three rounds each of two equal runs one time in ten."""
        ratio = self.ratio(top, bottom)
        close = 1 / (1 + within) <= ratio.value <= 1 + within
        clearly = self.clearly(top, bottom)
        if close and not clearly:
            words = f"{alike} (the rounds overlap, the medians are within {within:.0%})"
        elif clearly and not close:
            words = unlike
        else:
            words = f"no clear verdict: {'the rounds' if clearly else 'the medians'} differ"
        return sentence(f"{top} / {bottom}:", f"{ratio}:", words)

    def __str__(self):
        width = max(map(len, self.rates))
        return "\n".join(
            f"{name:<{width}}  {self.median(name):>10,.0f} {self.unit}  "
            f"(rounds {min(rates):,.0f} to {max(rates):,.0f})"
            for name, rates in self.rates.items()
        )

    __repr__ = __str__

    def plot(self, ax, title=None, log=False):
        """Each round as a dot and the median as a bar, a row per configuration (``log``: a
        logarithmic rate axis)."""
        names = list(self.rates)
        ax.barh(names, [self.median(name) for name in names], color="tab:blue", alpha=0.4)
        for row, name in enumerate(names):
            ax.plot(self.rates[name], [row] * len(self.rates[name]), "k.", ms=8)
        ax.invert_yaxis()
        scale = ", log scale" if log else ""
        ax.set(xlabel=f"{self.unit}{scale} (bar: median; dots: rounds)", title=title)
        if log:
            ax.set_xscale("log")
        else:
            ax.set_xlim(left=0)


def in_turn(runs, rounds=3, before=None, warmup=True, unit="samples/s"):
    """Run each of ``runs`` (``{name: run}``; ``run()`` returns how many items it handled) once per
    round, taking turns, for ``rounds`` rounds, after one untimed call of each when ``warmup``;
    ``before()``, when given, runs untimed before every timed call (to empty a cache, say), or,
    as ``{name: before}``, before the timed calls of the runs it names. A run with a ``close()``
    (``epochs_of``'s, ``ceiling.PlainProcesses``) is closed at the end, or when a run fails.
    Returns a ``Comparison`` of items per second, named ``unit``."""
    if rounds < 2:
        raise ValueError(f"a spread needs at least 2 rounds, got {rounds}")
    if not isinstance(before, dict):
        before = dict.fromkeys(runs, before)
    rates = {name: [] for name in runs}
    try:
        for run in runs.values() if warmup else ():
            run()
        for _ in range(rounds):
            for name, run in runs.items():
                if before.get(name) is not None:
                    before[name]()
                started = time.perf_counter()
                items = run()
                rates[name].append(items / (time.perf_counter() - started))
    finally:  # workers and processes would otherwise stay, each with its memory, after an error too
        for run in runs.values():
            if hasattr(run, "close"):
                run.close()
    return Comparison(rates, unit)


def epochs_of(dataset, samples=None, **loader_kwargs):
    """A ``run`` for ``in_turn``: each call is one epoch of the same ``DataLoader`` over
    ``dataset`` and returns the samples it delivered, checked against ``samples`` (by default
    ``len(dataset)``; give it for a stream without a length). Workers stay between epochs
    (``persistent_workers``), as in training, so only the first epoch starts them; ``close()``,
    which ``in_turn`` calls once it is done, lets them go, and a later call starts new ones."""
    return Epochs(dataset, samples, loader_kwargs)


class Epochs:
    """``epochs_of``'s run: one epoch of a ``DataLoader`` a call, its workers kept until
    ``close()``."""

    def __init__(self, dataset, samples, loader_kwargs):
        workers = loader_kwargs.get("num_workers", 0)
        self.dataset = dataset
        self.loader_kwargs = {"persistent_workers": workers > 0, **loader_kwargs}
        self.expected, self.source = (
            (len(dataset), "len(dataset)") if samples is None else (samples, "samples")
        )
        self.loader = None  # made by the first call, and again after close()

    def __call__(self):
        if self.loader is None:
            self.loader = DataLoader(self.dataset, **self.loader_kwargs)
        seen = sum(count_samples(batch) for batch in self.loader)
        if seen != self.expected:
            raise SampleCountError(
                f"an epoch delivered {seen} samples but {self.source} is {self.expected}; check "
                "__len__, drop_last, the sampler, or how an iterable dataset splits its work"
            )
        return seen

    def close(self):
        """Let the workers go: they stop with the loader that started them."""
        self.loader = None
