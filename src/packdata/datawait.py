"""Is the GPU waiting? A training loop's time split into waiting for the next batch and the step.

"Your GPU is starving" is a measurement, not a feeling: time each step's wait for its batch apart
from the step itself. A wait share near zero means the loader keeps up and a faster loader buys
nothing; a large one means every second of it is paid for by an idle accelerator.

    times = time_steps(loader, lambda batch: train_step(model, batch), steps=50)
    print(times)                                   # 50 steps: waiting 62% of the time, ...
    required_rate(steps_per_s=12, batch_size=256, bytes_per_sample=110e3)   # what to deliver

On a GPU the step is asynchronous: ``time_steps`` synchronises before it stops each step's clock,
so the step's time is the device's, not the time it took to queue the work.
"""

import statistics
import time
from dataclasses import dataclass, field

import torch


@dataclass
class StepTimes:
    """Seconds each step waited for its batch, and seconds it computed."""

    wait: list = field(default_factory=list)
    compute: list = field(default_factory=list)

    @property
    def seconds(self):
        """The loop's time: every wait and every step."""
        return sum(self.wait) + sum(self.compute)

    @property
    def wait_share(self):
        """The share of the loop's time spent waiting for data, 0..1."""
        return sum(self.wait) / self.seconds if self.seconds else 0.0

    def after(self, steps):
        """The same times without the first ``steps`` (the workers' start-up, say)."""
        return StepTimes(self.wait[steps:], self.compute[steps:])

    @property
    def steps_per_s(self):
        return len(self.wait) / self.seconds

    def __str__(self):
        return (
            f"{len(self.wait)} steps: waiting {self.wait_share:.0%} of the time "
            f"(median wait {statistics.median(self.wait) * 1e3:.1f} ms, "
            f"median step {statistics.median(self.compute) * 1e3:.1f} ms), "
            f"{self.steps_per_s:.1f} steps/s"
        )


def time_steps(loader, step, steps=None, device=None):
    """Run ``step(batch)`` on the batches of ``loader`` (at most ``steps`` of them) and time, for
    each, the wait for the batch and the step. ``device``: a CUDA device to synchronise before each
    step's clock stops (default: the current one when CUDA is in use)."""
    on_gpu = torch.device(device).type == "cuda" if device else torch.cuda.is_initialized()
    times, batches = StepTimes(), iter(loader)
    while steps is None or len(times.wait) < steps:
        started = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            break
        arrived = time.perf_counter()
        step(batch)
        if on_gpu:
            torch.cuda.synchronize(device)
        times.wait.append(arrived - started)
        times.compute.append(time.perf_counter() - arrived)
    return times


def required_rate(steps_per_s, batch_size, bytes_per_sample):
    """``(samples/s, MB/s)`` a loader must deliver so that a model running ``steps_per_s`` steps of
    ``batch_size`` samples never waits."""
    samples_per_s = steps_per_s * batch_size
    return samples_per_s, samples_per_s * bytes_per_sample / 1e6


def copy_seconds(device, batch_shape=(256, 3, 224, 224), repeats=20):
    """Seconds to copy one uint8 batch of ``batch_shape`` to ``device``, by how the batch is held:
    ``{"pageable": s, "pinned": s, "pinned, non_blocking": s}`` (medians of ``repeats``). Pinned
    (page-locked) memory is what ``DataLoader(pin_memory=True)`` hands out; only a copy to a GPU
    can use it, so ``device`` must be a CUDA device."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"pinned memory speeds up copies to a CUDA device, not to {device}")
    pageable = torch.randint(0, 256, batch_shape, dtype=torch.uint8)
    held = {"pageable": pageable, "pinned": pageable.pin_memory()}
    ways = [("pageable", False), ("pinned", False), ("pinned, non_blocking", True)]
    seconds = {}
    for name, non_blocking in ways:
        batch, times = held[name.split(",")[0]], []
        for _ in range(repeats):
            torch.cuda.synchronize(device)
            started = time.perf_counter()
            batch.to(device, non_blocking=non_blocking)
            torch.cuda.synchronize(device)
            times.append(time.perf_counter() - started)
        seconds[name] = statistics.median(times)
    return seconds
