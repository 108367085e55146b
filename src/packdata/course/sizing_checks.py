"""Checks of lesson 6 that decide from numbers: staging against streaming, samples per shard
from the cost model, and the steps every rank can take.
"""

import math
import numbers

from .feedback import (
    CheckFailed,
    is_whole,
    mismatch,
    passed,
)


def check_samples_per_shard(samples_per_shard):
    """Lesson 6: samples per shard so that each GET reaches ``efficiency`` of the bandwidth, by the
    cost model."""
    from ..costmodel import size_for_efficiency

    cases = [
        (0.002, 100e6, 2_100, 0.9),
        (0.02, 100e6, 2_100, 0.9),
        (0.05, 1e9, 110_000, 0.95),
        (1e-4, 500e6, 2_100, 0.5),
        (0.01, 100e6, 1_000, 0.5),  # exactly 1,000 samples: nothing to round
    ]
    for latency, bandwidth, mean_bytes, efficiency in cases:
        expected = math.ceil(size_for_efficiency(latency, bandwidth, efficiency) / mean_bytes)
        got = samples_per_shard(latency, bandwidth, mean_bytes, efficiency)
        call = f"samples_per_shard({latency}, {bandwidth:g}, {mean_bytes}, {efficiency})"
        if isinstance(got, float) and got == expected:
            raise CheckFailed(
                f"{call} returned {got!r}, a float: return an int (math.ceil gives one; np.ceil "
                "gives "
                "a float)."
            )
        if not isinstance(got, numbers.Integral) or isinstance(got, bool):
            raise CheckFailed(
                f"{call} {mismatch(got, expected)}: a number of samples is a whole number (round "
                "up)."
            )
        if got == expected - 1:
            raise CheckFailed(
                f"{call} {mismatch(got, expected)}: one too few. Round up, or the shard falls "
                f"short of {efficiency:.0%}."
            )
        if got == expected + 1:
            raise CheckFailed(
                f"{call} {mismatch(got, expected)}: one too many. When the size is already a "
                "whole number of samples, math.ceil keeps it; int(x) + 1 does not."
            )
        size = size_for_efficiency(latency, bandwidth, efficiency)
        if got != expected and abs(got - size) <= 1:
            raise CheckFailed(
                f"{call} {mismatch(got, expected)}: that is the shard's size in bytes. Divide it "
                "by the bytes of a sample (mean_bytes), then round up."
            )
        slips = [
            math.ceil(size_for_efficiency(latency * f, bandwidth, efficiency) / mean_bytes)
            for f in (1e-3, 1e3)  # the latency taken for milliseconds, or made into them
        ]
        if got != expected and got in slips:
            raise CheckFailed(
                f"{call} {mismatch(got, expected)}: about 1,000 times off. The latency comes in "
                "seconds and the bandwidth in bytes per second: use them as they are."
            )
        if got != expected:
            raise CheckFailed(
                f"{call} {mismatch(got, expected)}. Solve size / (size + latency × bandwidth) = "
                "efficiency for the size in bytes, then divide by the bytes per sample."
            )
    passed(
        "right shard size for every latency and bandwidth: the slower the round trip, the bigger "
        "the shard."
    )


def _stage_or_stream(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch_bytes, dataset_bytes):
    """The reference: stage when the data fits on scratch and the copy plus every epoch from the
    disk takes less time than every epoch over the network."""
    if dataset_bytes > scratch_bytes:
        return "stream"
    return "stage" if copy_s + epochs * local_epoch_s < epochs * remote_epoch_s else "stream"


def check_stage_or_stream(stage_or_stream):
    """Lesson 6: ``stage_or_stream(copy_s, remote_epoch_s, local_epoch_s, epochs, scratch_bytes,
    dataset_bytes)`` says "stage" when the data fits on scratch and copying once, then reading
    locally, beats reading remotely every epoch; else "stream"."""
    gb = 1e9
    # (copy_s, remote_epoch_s, local_epoch_s, epochs, scratch_bytes, dataset_bytes)
    cases = [
        (60, 30, 10, 5, 1000 * gb, 100 * gb),  # 110 s against 150 s: stage
        (60, 30, 10, 2, 1000 * gb, 100 * gb),  # 80 s against 60 s: stream
        (60, 30, 10, 5, 50 * gb, 100 * gb),  # staging would pay, but it does not fit
        (60, 30, 10, 1, 1000 * gb, 100 * gb),  # one epoch: the copy is pure cost
        (100, 30, 10, 10, 1000 * gb, 100 * gb),  # pays back only over several epochs
        (20, 12, 11, 50, 2000 * gb, 1500 * gb),  # a small saving, many epochs, a big dataset
        (30, 10, 12, 100, 1000 * gb, 1 * gb),  # the remote store is faster than the disk
        (60, 30, 10, 3, 1000 * gb, 100 * gb),  # 90 s each way: a tie streams
        (65, 30, 10, 3, 1000 * gb, 100 * gb),  # 95 s against 90 s: the copy is no epoch
        (60, 30, 10, 5, 100 * gb, 100 * gb),  # the dataset fills scratch exactly: it fits
    ]
    # (what a learner whose answers follow this rule in every case got wrong, the rule)
    mistakes = [
        (
            "you return 'stage' where streaming is quicker, and the other way round.",
            lambda *case: {"stage": "stream", "stream": "stage"}[_stage_or_stream(*case)],
        ),
        (
            "staging needs room: when the dataset is bigger than the scratch disk there is "
            "nothing to decide, however much time staging would save.",
            lambda c, r, loc, e, scratch, size: _stage_or_stream(c, r, loc, e, size, size),
        ),
        (
            "you left out the copy: reading from the disk saves time in every epoch, but only "
            "after the copy has been paid for.",
            lambda c, r, loc, e, scratch, size: _stage_or_stream(0, r, loc, e, scratch, size),
        ),
        (
            "the copy is paid once, and the saving comes in every epoch: compare the whole job, "
            "all of its epochs, not one epoch.",
            lambda c, r, loc, e, scratch, size: _stage_or_stream(c, r, loc, 1, scratch, size),
        ),
        (
            "the copy does not stand in for an epoch: the job copies first, then reads every "
            "one of its epochs from the disk (an epoch trained during the copy would read "
            "remotely: that is streaming). Compare copy + epochs × local against epochs × remote.",
            lambda c, r, loc, e, scratch, size: _stage_or_stream(c - loc, r, loc, e, scratch, size),
        ),
        (
            "on a tie, stream: staging then gains nothing, and streaming starts at once.",
            lambda c, r, loc, e, scratch, size: _stage_or_stream(
                c, r + 1e-9, loc, e, scratch, size
            ),
        ),
        (
            "a dataset exactly as big as the free space still fits: stream only when it is bigger.",
            lambda c, r, loc, e, scratch, size: _stage_or_stream(c, r, loc, e, scratch - 1, size),
        ),
        (
            "when the disk is slower than the network (local_epoch_s > remote_epoch_s), staging "
            "never pays back: a break-even of copy_s / (remote_epoch_s - local_epoch_s) epochs "
            "is then negative, and every number of epochs passes it.",
            lambda c, r, loc, e, scratch, size: (
                "stage" if size <= scratch and r != loc and e > c / (r - loc) else "stream"
            ),
        ),
        (
            "you stage from the break-even on, epochs >= copy_s / (remote_epoch_s - "
            "local_epoch_s): at the break-even itself both plans take as long, so stream (it "
            "starts at once); and when the disk is slower than the network the break-even is "
            "negative, so every number of epochs passes it though staging never pays back. "
            "Compare the whole job each way: copy + epochs × local against epochs × remote.",
            lambda c, r, loc, e, scratch, size: (
                "stage" if size <= scratch and r != loc and e >= c / (r - loc) else "stream"
            ),
        ),
        (
            "fitting on scratch is not enough: staging must also save time, and it does not "
            "when there are few epochs, or when the disk is no faster than the network.",
            lambda c, r, loc, e, scratch, size: "stage" if size <= scratch else "stream",
        ),
    ]
    for case in cases:
        got, expected = stage_or_stream(*case), _stage_or_stream(*case)
        if got == expected:
            continue
        copy_s, remote_s, local_s, epochs, scratch, size = case
        call = (
            f"stage_or_stream({copy_s}, {remote_s}, {local_s}, {epochs}, {scratch / gb:g}e9, "
            f"{size / gb:g}e9)"
        )
        if got not in ("stage", "stream"):
            raise CheckFailed(
                f"{call} returned {got!r}: return the string 'stage' or the string 'stream'."
            )
        follows = [
            hint
            for hint, rule in mistakes
            if all(stage_or_stream(*other) == rule(*other) for other in cases)
        ]
        staged, streamed = copy_s + epochs * local_s, epochs * remote_s
        fits = "fits on" if size <= scratch else "does not fit on"
        hint = (
            follows
            or [
                f"here staging takes {staged:g} s for the whole job, streaming {streamed:g} s, "
                f"and the {size / gb:g} GB dataset {fits} {scratch / gb:g} GB of scratch."
            ]
        )[0]
        raise CheckFailed(f"{call} returned {got!r}, expected {expected!r}: {hint}")
    passed(
        "stage only when the data fits and the copy pays for itself within the job's epochs; "
        "stream otherwise."
    )


def _common_full_steps(samples_per_worker, batch_size):
    """The reference: each worker's full batches, added up per rank; the fewest over the ranks."""
    return min(sum(n // batch_size for n in rank) for rank in samples_per_worker)


def check_common_full_steps(common_full_steps):
    """Lesson 6: ``common_full_steps(samples_per_worker, batch_size)``, where
    ``samples_per_worker[rank][worker]`` is what each DataLoader worker of each rank streams, is
    the number of full batches (``drop_last=True``) that every rank can run."""
    cases = [
        ([[100, 100], [100, 90]], 32),
        ([[50, 50], [60, 60]], 32),
        ([[70, 70], [64, 64], [80, 40]], 16),
        ([[33, 31]], 16),
        ([[12, 12, 12, 12], [16, 16, 8, 8]], 8),
        ([[40, 40], [24, 24]], 8),
    ]

    def full(n, batch_size):
        return n // batch_size

    def short_too(n, batch_size):
        return -(-n // batch_size)

    # (what a learner whose answers follow this rule in every case got wrong, the rule)
    mistakes = [
        (
            "you took the most full batches of any rank: the ranks with fewer run out first, and "
            "the others then wait for them in the next gradient all-reduce. Take the fewest.",
            lambda ranks, b: max(sum(full(n, b) for n in rank) for rank in ranks),
        ),
        (
            "that is rank 0's own count: every rank must stop after the same number of steps, "
            "the number the rank with the fewest full batches can run.",
            lambda ranks, b: sum(full(n, b) for n in ranks[0]),
        ),
        (
            "you pooled each rank's samples into its batches (samples // batch_size per rank). "
            "But each DataLoader worker batches its own samples, and drop_last=True drops each "
            "worker's short last batch: count the full batches worker by worker.",
            lambda ranks, b: min(full(sum(rank), b) for rank in ranks),
        ),
        (
            "you counted each worker's short last batch: drop_last=True drops it. Round down.",
            lambda ranks, b: min(sum(short_too(n, b) for n in rank) for rank in ranks),
        ),
        (
            "you shared all the samples out among the ranks; but a rank can only run the batches "
            "its own workers deliver. Count per rank, then take the fewest.",
            lambda ranks, b: full(sum(map(sum, ranks)), b * len(ranks)),
        ),
        (
            "you added up the steps of every rank; but the ranks step together, each through its "
            "own batches. Take the fewest that any rank can run.",
            lambda ranks, b: sum(sum(full(n, b) for n in rank) for rank in ranks),
        ),
        (
            "round() counts a short last batch when it is at least half full; drop_last=True "
            "drops every short batch. Divide with //.",
            lambda ranks, b: min(sum(round(n / b) for n in rank) for rank in ranks),
        ),
        (
            "one step fewer than every rank can run: the last full batch of the shortest rank "
            "counts too.",
            lambda ranks, b: _common_full_steps(ranks, b) - 1,
        ),
    ]
    for samples_per_worker, batch_size in cases:
        got = common_full_steps([list(rank) for rank in samples_per_worker], batch_size)
        expected = _common_full_steps(samples_per_worker, batch_size)
        if got == expected and is_whole(got):
            continue
        call = f"common_full_steps({samples_per_worker}, {batch_size})"
        if got == expected:
            raise CheckFailed(
                f"{call} returned {got!r}, a {type(got).__name__}: a number of steps is a whole "
                "number, an int (// divides to one)."
            )
        follows = [
            hint
            for hint, rule in mistakes
            if all(
                common_full_steps([list(r) for r in ranks], b) == rule(ranks, b)
                for ranks, b in cases
            )
        ]
        hint = (
            follows
            or [
                "count the full batches each worker delivers, add them up per rank, and every "
                "rank can run as many steps as the rank with the fewest."
            ]
        )[0]
        raise CheckFailed(f"{call} {mismatch(got, expected)}: {hint}")
    passed(
        "full batches counted worker by worker, and every rank stops after as many steps as the "
        "rank with the fewest: no rank waits for another in the all-reduce."
    )
