"""The cost model behind every lesson: ``time ≈ requests × latency / concurrency + bytes /
bandwidth``.

``latency`` is seconds per request, ``concurrency`` is how many requests wait at the same time, and
``bandwidth`` is the bytes/s that all requests in flight move together. Where the cap applies per
connection, each response paced on its own (the emulated ``NetworkStore``, an object store's
per-connection rate), ``concurrency`` connections together move ``concurrency ×`` that cap, up to
what the link carries: pass that total. With one request at a time the two are the same. All
functions accept numpy arrays.
"""

import math

import numpy as np


def predict_time(n_requests, n_bytes, latency, bandwidth, concurrency=1):
    """Seconds to fetch ``n_bytes`` in ``n_requests`` requests."""
    return n_requests * latency / concurrency + n_bytes / bandwidth


def throughput(file_size, latency, bandwidth, concurrency=1):
    """Bytes/s achieved when reading files of ``file_size`` bytes, one request each."""
    return file_size / predict_time(1, file_size, latency, bandwidth, concurrency)


def workers_needed(target_rate, latency, seconds_per_sample=0.0):
    """How many workers, each fetching one sample at a time, reach ``target_rate`` samples/s.

    One worker spends ``latency`` waiting plus ``seconds_per_sample`` working per sample, so it
    delivers ``1 / (latency + seconds_per_sample)`` samples/s. Waiting overlaps across workers;
    working does only while there are free cores, so the answer is a lower bound on a busy machine.
    """
    if target_rate <= 0:
        raise ValueError(f"target_rate must be positive, got {target_rate}")
    return max(1, math.ceil(target_rate * (latency + seconds_per_sample) - 1e-9))


def fit_cost_model(measurements):
    """``(latency, bandwidth)`` fitted by least squares to ``(requests, bytes, seconds)``
    measurements, on relative errors: each measurement divided by its seconds, so that the short
    requests, which show the latency, count as much as the long transfers, whose noise alone
    would outweigh them.

    The latency is per request as seen by the caller, i.e. already divided by any concurrency.
    """
    points = np.asarray(list(measurements), dtype=float)
    if points.ndim != 2 or points.shape[1] != 3 or len(points) < 2:
        raise ValueError("need at least two (requests, bytes, seconds) measurements")
    relative = points[:, :2] / points[:, 2:]
    (latency, seconds_per_byte), *_ = np.linalg.lstsq(relative, np.ones(len(points)), rcond=None)
    if seconds_per_byte <= 0:
        raise ValueError(
            "the fit found no bandwidth limit: vary the byte counts more between measurements"
        )
    return float(latency), float(1 / seconds_per_byte)


def size_for_efficiency(latency, bandwidth, efficiency=0.9, concurrency=1):
    """The file (or shard) size in bytes whose throughput is ``efficiency`` × ``bandwidth``.

    Solves ``s / (s + latency × bandwidth / concurrency) = efficiency`` for ``s``.
    """
    if not 0 < efficiency < 1:
        raise ValueError(f"efficiency must be between 0 and 1, got {efficiency}")
    return efficiency / (1 - efficiency) * latency * bandwidth / concurrency


def plot_throughput_vs_size(storage_types, measured_points=None, ax=None, efficiency=0.9):
    """Log-log throughput against file size, one line per storage type (anything with ``name``,
    ``latency`` and ``bandwidth``), a dot where each reaches ``efficiency`` of its bandwidth, and
    ``measured_points`` (``(file_size, bytes_per_s)`` pairs) on top."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    if ax is None:
        _, ax = plt.subplots()
    sizes = np.logspace(2, 10, 200)  # 100 B to 10 GB
    for storage in storage_types:
        (line,) = ax.loglog(
            sizes, throughput(sizes, storage.latency, storage.bandwidth), label=storage.name
        )
        knee = size_for_efficiency(storage.latency, storage.bandwidth, efficiency)
        ax.plot(knee, efficiency * storage.bandwidth, "o", color=line.get_color())
    if measured_points is not None:
        size, rate = np.asarray(measured_points, dtype=float).T
        ax.plot(size, rate, "k^", label="measured")
    ax.xaxis.set_major_formatter(EngFormatter(unit="B"))
    ax.yaxis.set_major_formatter(EngFormatter(unit="B/s"))
    ax.set_xlabel("file size")
    ax.set_ylabel("throughput")
    ax.set_title(f"throughput vs file size (dots: {efficiency:.0%} of bandwidth)")
    ax.legend()
    return ax
