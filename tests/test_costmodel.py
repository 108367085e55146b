import numpy as np
import pytest

from packdata.costmodel import (
    fit_cost_model,
    plot_throughput_vs_size,
    predict_time,
    size_for_efficiency,
    throughput,
)
from packdata.disks import REFERENCE_STORAGE


def test_predict_time_adds_waiting_and_transfer():
    assert predict_time(1000, 50e6, latency=0.01, bandwidth=100e6) == pytest.approx(10 + 0.5)
    assert predict_time(1000, 50e6, latency=0.01, bandwidth=100e6, concurrency=10) == pytest.approx(
        1 + 0.5
    )


def test_throughput_is_latency_bound_for_small_files_and_bandwidth_bound_for_large():
    assert throughput(1000, latency=0.01, bandwidth=100e6) == pytest.approx(1000 / (0.01 + 1e-5))
    assert throughput(1e12, latency=0.01, bandwidth=100e6) == pytest.approx(100e6, rel=1e-3)
    sizes = np.array([1e3, 1e6])
    assert throughput(sizes, 0.01, 100e6, concurrency=4) == pytest.approx(
        sizes / (0.0025 + sizes / 100e6)
    )


def test_fit_recovers_latency_and_bandwidth():
    rng = np.random.default_rng(0)
    requests = rng.integers(10, 5000, size=30)
    sizes = requests * rng.uniform(1e3, 1e6, size=30)
    seconds = predict_time(requests, sizes, latency=0.004, bandwidth=250e6)
    assert fit_cost_model(zip(requests, sizes, seconds)) == pytest.approx((0.004, 250e6), rel=1e-9)
    noisy = seconds * rng.normal(1, 0.01, size=30)
    assert fit_cost_model(np.stack([requests, sizes, noisy], axis=1)) == pytest.approx(
        (0.004, 250e6), rel=0.05
    )


def test_fit_needs_enough_varied_measurements():
    with pytest.raises(ValueError, match="at least two"):
        fit_cost_model([(10, 1000, 0.1)])
    with pytest.raises(ValueError, match="no bandwidth limit"):
        fit_cost_model([(10, 1000, 0.1), (20, 1000, 0.2), (40, 1e6, 0.3)])


@pytest.mark.parametrize("efficiency, concurrency", [(0.9, 1), (0.5, 1), (0.9, 16)])
def test_size_for_efficiency_reaches_exactly_that_fraction(efficiency, concurrency):
    size = size_for_efficiency(0.05, 100e6, efficiency, concurrency)
    assert throughput(size, 0.05, 100e6, concurrency) / 100e6 == pytest.approx(
        efficiency, rel=1e-12
    )


def test_size_for_efficiency_rejects_impossible_targets():
    for efficiency in (0, 1, 1.5):
        with pytest.raises(ValueError):
            size_for_efficiency(0.01, 100e6, efficiency)


def test_plot_has_a_line_and_a_knee_per_storage_type_and_the_measured_points():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    ax = plot_throughput_vs_size(REFERENCE_STORAGE, measured_points=[(3000, 1e6), (1e6, 5e7)])
    assert len(ax.lines) == 2 * len(REFERENCE_STORAGE) + 1
    assert ax.get_xscale() == ax.get_yscale() == "log"
    matplotlib.pyplot.close("all")
