"""Resuming a ``ShardDataset`` mid-epoch: with ``StatefulDataLoader``, after a real SIGKILL, and
with other numbers of ranks and workers; every sample exactly once per epoch, then the usual next
epoch.

Exactly once is counted against the checkpoint: what was delivered after the last checkpoint and
before the kill comes again after the restart, as a training job restarted from that checkpoint
needs. The kill tests start and kill ``packdata.preemption``'s training job."""

import io
import json
import random
import tarfile
import warnings
from collections import Counter
from itertools import islice
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from torchdata.stateful_dataloader import StatefulDataLoader

from packdata import preemption
from packdata.layout import keys_digest, member_keys
from packdata.resume import ShardChanged, loader_states, rest_of_epoch
from packdata.shardwrite import write_shards as write_image_shards
from packdata.streaming import ShardDataset

KEYS = ("__key__", "cls")
SIZES = [5, 9, 3, 12, 7, 1, 8, 6, 4, 10]  # uneven on purpose; 65 samples in 10 shards
PROPERTY = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def write_shards(folder):
    """Tiny shards of ``SIZES`` samples: a key and a label each, nothing to decode."""
    folder.mkdir(parents=True, exist_ok=True)
    for shard, size in enumerate(SIZES):
        with tarfile.open(
            folder / f"tiny-{shard:02d}.tar", "w", format=tarfile.USTAR_FORMAT
        ) as tar:
            for number in range(size):
                payload = str(number % 10).encode()
                info = tarfile.TarInfo(f"s{shard:02d}n{number:03d}.cls")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return sorted(str(path) for path in folder.glob("tiny-*.tar"))


@pytest.fixture(scope="module")
def urls(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("tiny-shards"))


@pytest.fixture(scope="module")
def all_keys(urls):
    return sorted(
        f"s{shard:02d}n{number:03d}" for shard, n in enumerate(SIZES) for number in range(n)
    )


def dataset(urls, rank=0, world_size=1, buffer_size=6, **options):
    return ShardDataset(
        urls,
        rank=rank,
        world_size=world_size,
        seed=11,
        buffer_size=buffer_size,
        keys=KEYS,
        decode=False,
        **options,
    )


def keys_of(batch):
    """The sample keys of a batch collated from ``(key, label)`` tuples."""
    return list(batch[0])


def assert_exactly_once(delivered, expected, context=""):
    repeated = {key: n for key, n in Counter(delivered).items() if n > 1}
    assert not repeated, f"{context}delivered more than once: {repeated}"
    missing = set(expected) - set(delivered)
    assert sorted(delivered) == sorted(expected), f"{context}missing: {missing}"


# --- the state ------------------------------------------------------------------------------------


def test_a_state_is_small_json_and_names_what_it_counts(urls):
    data = dataset(urls)
    stream = data.iterate()
    next(stream), next(stream), next(stream)
    state = data.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["epoch"] == 0 and state["rest"] is None and state["layout"] == [0, 1, 0, 1]
    assert state["yielded"] == 3 and sum(state["read"]) == 3 + 6  # the buffer of 6 filled first
    assert state["dataset"].startswith("10 shards ") and "seed 11" in state["dataset"]


def test_a_state_before_iterating_is_the_start_of_the_epoch(urls):
    data = dataset(urls)
    data.set_epoch(4)
    state = data.state_dict()
    assert (state["epoch"], state["read"], state["yielded"]) == (4, [], 0)
    resumed = dataset(urls)
    resumed.set_epoch(4)
    resumed.load_state_dict(state)
    assert list(resumed.iterate()) == list(data.iterate())


def test_a_state_of_another_dataset_or_layout_is_refused(urls):
    data = dataset(urls, rank=1, world_size=2)
    state = data.state_dict()
    with pytest.raises(ValueError, match="another dataset.*seed 11.*seed 12"):
        ShardDataset(urls, rank=1, world_size=2, seed=12, buffer_size=6, keys=KEYS).load_state_dict(
            state
        )
    other = dataset(urls, rank=1, world_size=3)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="rank 1 of 2.*rank 1 of 3.*rest_of_epoch"):
        list(other.iterate())
    with pytest.raises(ValueError, match="not a ShardDataset state"):
        data.load_state_dict({"epoch": 0})


def rewrite(urls, change):
    """Rewrite each shard under its name with ``change(members)`` of its ``(TarInfo, bytes)``."""
    for url in urls:
        with tarfile.open(url) as tar:
            members = [(info, tar.extractfile(info).read()) for info in tar.getmembers()]
        with tarfile.open(url, "w", format=tarfile.USTAR_FORMAT) as tar:
            for info, payload in change(members):
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))


def grown(members):
    """Two new samples first, then the shard's own."""
    return [(tarfile.TarInfo(f"new{number}.cls"), b"0") for number in range(2)] + members


CHANGES = {
    "grown": grown,
    "cut to its first sample": lambda members: members[:1],
    "reordered": lambda members: members[::-1],
}


def digest_of(url):
    """The digest of a shard's sample keys, from Python's own tar reader."""
    with tarfile.open(url) as tar:
        return keys_digest(member_keys(tar.getnames()))


def checkpoint_after(data, samples=8):
    """``data``'s state, through JSON, after ``samples`` samples: the buffer holds some of the
    first shards' samples then."""
    stream = data.iterate()
    for _ in range(samples):
        next(stream)
    return json.loads(json.dumps(data.state_dict()))


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("other_layout", [False, True])
def test_a_shard_rewritten_since_the_state_is_named_on_the_resume(tmp_path, change, other_layout):
    # the places the state counts would hold other samples: some would come twice, some never
    urls = write_shards(tmp_path / "shards")
    data = dataset(urls)
    state = checkpoint_after(data)
    opened = data.epoch_order()[: len(state["read"])]  # one rank, one worker: every shard
    assert state["shards"] == [digest_of(url) for url in opened]
    if other_layout:  # the rest of the epoch, for two workers
        state = rest_of_epoch(dataset(urls), [state])
    rewrite(urls, CHANGES[change])
    resumed = dataset(urls)
    resumed.load_state_dict(state)
    workers = 2 if other_layout else 1
    with pytest.raises(
        ShardChanged, match=r"tiny-\d\d\.tar holds other samples than when the state was saved"
    ):
        for worker in range(workers):
            list(resumed.iterate(worker, workers))


def without_labels(members):
    """Every sample's ``.cls`` member renamed ``.txt``."""
    for info, _ in members:
        info.name = info.name.replace(".cls", ".txt")
    return members


def test_held_samples_gone_from_a_shard_of_the_same_keys_are_named(tmp_path):
    urls = write_shards(tmp_path / "shards")
    state = checkpoint_after(dataset(urls, errors="skip"))
    rewrite(urls, without_labels)  # the same keys: the samples are there, their labels not
    resumed = dataset(urls, errors="skip")
    resumed.load_state_dict(state)
    with pytest.raises(
        ValueError, match=r"no longer in their shards \(.*tiny-\d\d\.tar.*rewritten"
    ):
        list(resumed.iterate())


def test_held_samples_of_a_shard_gone_since_the_state_name_why_when_skipping(tmp_path):
    urls = write_shards(tmp_path / "shards")
    data = dataset(urls, errors="skip")
    state = checkpoint_after(data)
    for url in data.epoch_order()[: len(state["read"])]:  # the shards the buffer held samples of
        Path(url).rename(f"{url}.moved")
    resumed = dataset(urls, errors="skip")
    resumed.load_state_dict(state)
    with pytest.raises(FileNotFoundError, match=r"tiny-\d\d\.tar"):
        list(resumed.iterate())


def test_the_rest_of_an_epoch_needs_every_worker_of_every_rank(urls):
    states = [dataset(urls, rank=rank, world_size=2).state_dict() for rank in range(2)]
    with pytest.raises(ValueError, match="every worker of every rank.*rank 1 of 2, worker 0 of 1"):
        rest_of_epoch(dataset(urls), states[:1])
    with pytest.raises(ValueError, match="each once"):
        rest_of_epoch(dataset(urls), states + states[1:])


def test_states_of_a_rest_merge_whether_they_went_through_json_or_not(urls, all_keys):
    before, states = run(urls, (1, 2), 0, None, [7])
    rest = rest_of_epoch(dataset(urls), every_worker(states))
    workers = [dataset(urls) for _ in range(2)]
    for data in workers:
        data.load_state_dict(rest)
    streams = [data.iterate(worker, 2) for worker, data in enumerate(workers)]
    middle = [next(stream)[0] for stream in streams]
    kept = [workers[0].state_dict(), json.loads(json.dumps(workers[1].state_dict()))]
    after, _ = run(urls, (1, 1), 0, rest_of_epoch(dataset(urls), kept), [None])
    assert_exactly_once(flat(before) + middle + flat(after), all_keys)


def saved_by_older(state, fields):
    """``state`` as an older packdata saved it: without ``fields``; its rest's rows without the
    digest (``shards``) and the problems (``reported``), and the rest without its skips."""
    rest = state["rest"]
    if rest is not None and "reported" in fields:
        width = 4 if "shards" in fields else 5
        rest = {"generation": rest["generation"], "shards": [r[:width] for r in rest["shards"]]}
    return {**{k: v for k, v in state.items() if k not in fields}, "rest": rest}


OLDER = [("reported", "skipped", "size"), ("shards", "reported", "skipped", "size")]


@pytest.mark.parametrize(
    ("fields", "named"),
    [(("size",), None), (OLDER[0], "reported, skipped"), (OLDER[1], "shards, reported, skipped")],
)
def test_a_workers_state_saved_by_an_older_packdata_resumes_with_a_warning(urls, fields, named):
    whole = [key for key, _ in dataset(urls).iterate()]
    first = dataset(urls, errors="skip")
    taken = [key for key, _ in islice(first.iterate(), 10)]
    resumed = dataset(urls, errors="skip")
    old = saved_by_older(first.state_dict(), fields)
    if named is None:  # it does not decode: the missing size leaves nothing unchecked
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            resumed.load_state_dict(old)
    else:
        with pytest.warns(UserWarning, match=f"older packdata, without {named}: it resumes"):
            resumed.load_state_dict(old)
    assert taken + [key for key, _ in resumed.iterate()] == whole


def test_an_older_state_is_warned_of_once_whatever_the_workers(urls, capfd):
    first = StatefulDataLoader(dataset(urls), batch_size=4, num_workers=2)
    batches = iter(first)
    [next(batches) for _ in range(3)]
    state = first.state_dict()
    del batches
    for worker in state["_snapshot"]["_worker_snapshots"].values():
        worker["dataset_state"] = saved_by_older(worker["dataset_state"], OLDER[1])
    spawned = {"num_workers": 2, "multiprocessing_context": "spawn"}  # warnings to stderr
    again = StatefulDataLoader(dataset(urls), batch_size=4, **spawned)
    again.load_state_dict(state)
    list(again)
    assert capfd.readouterr().err.count("older packdata, without shards: it resumes") == 1


@pytest.mark.parametrize("fields", OLDER)
def test_a_rest_saved_by_an_older_packdata_resumes_with_a_warning(urls, all_keys, fields):
    before, states = run(urls, (2, 2), 0, None, [7, 4], errors="skip")
    old = [saved_by_older(state, fields) for state in every_worker(states)]
    with pytest.warns(UserWarning, match="older packdata") as warned:
        rest = rest_of_epoch(dataset(urls, errors="skip"), old)
    assert len(warned) == 1
    with warnings.catch_warnings():  # rank 1 merges the same states: rank 0 warned of them
        warnings.simplefilter("error")
        rest_of_epoch(dataset(urls, rank=1, world_size=2, errors="skip"), old)
    rest = saved_by_older(rest, fields)
    lacks = ", ".join(fields[:-1])  # a rest has no size
    with pytest.warns(UserWarning, match=f"older packdata, without {lacks}: it"):
        after, _ = run(urls, (1, 2), 0, rest, [None], errors="skip")
    assert_exactly_once(flat(before) + flat(after), all_keys)


def test_loader_states_refuse_a_checkpoint_between_snapshots(urls):
    loader = StatefulDataLoader(
        dataset(urls), batch_size=4, num_workers=1, snapshot_every_n_steps=3
    )
    batches = iter(loader)
    next(batches)
    with pytest.raises(ValueError, match="1 step.*snapshot_every_n_steps=1"):
        loader_states(loader.state_dict())


# --- StatefulDataLoader ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("batching", ["loader", "dataset"])
def test_stateful_dataloader_resumes_the_same_order_exactly(urls, all_keys, num_workers, batching):
    def loader():
        in_dataset = 4 if batching == "dataset" else None
        return StatefulDataLoader(
            dataset(urls, batch_size=in_dataset),
            batch_size=None if in_dataset else 4,
            num_workers=num_workers,
        )

    whole = [keys_of(batch) for batch in loader()]
    before, after = checkpointed_and_resumed(loader, keys_of)
    assert before + after == whole
    assert_exactly_once([key for batch in before + after for key in batch], all_keys)


def test_the_jobs_stream_resumes_exactly_in_spawned_workers(urls, all_keys):
    # lesson 7's loader with its 2 workers: the lesson's spawn run in test_lessons.py starts one
    def loader():
        data = preemption.job_dataset(urls)
        return StatefulDataLoader(
            data, batch_size=4, num_workers=2, multiprocessing_context="spawn"
        )

    before, after = checkpointed_and_resumed(loader, preemption.keys_of)
    assert_exactly_once([key for batch in before + after for key in batch], all_keys)


def checkpointed_and_resumed(make_loader, keys_of, taken=5):
    """The keys of each batch up to a checkpoint after ``taken`` batches, and of each batch a new
    loader from ``make_loader``, resumed from that checkpoint, delivers."""
    first = make_loader()
    batches = iter(first)
    before = [keys_of(next(batches)) for _ in range(taken)]
    state = first.state_dict()
    del batches, first  # the job is gone; a new one loads the checkpoint
    again = make_loader()
    again.load_state_dict(state)
    return before, [keys_of(batch) for batch in again]


@pytest.mark.parametrize("num_workers, then", [(2, 1), (1, 3), (0, 2), (2, 0)])
def test_stateful_dataloader_resumes_with_other_workers(urls, all_keys, num_workers, then):
    first = StatefulDataLoader(dataset(urls), batch_size=4, num_workers=num_workers)
    batches = iter(first)
    before = [key for _ in range(6) for key in keys_of(next(batches))]
    state = first.state_dict()
    resumed = dataset(urls)
    resumed.load_state_dict(rest_of_epoch(resumed, loader_states(state)))
    after = StatefulDataLoader(resumed, batch_size=4, num_workers=then)
    assert_exactly_once(before + [key for batch in after for key in keys_of(batch)], all_keys)


def loader_in(urls, epoch, num_workers, state=None, rest=None):
    """A new job's loader over epoch ``epoch``: from a loader ``state`` (the same number of
    workers), or with the rest of an epoch loaded into the dataset (any number)."""
    data = dataset(urls)
    data.set_epoch(epoch)
    if rest is not None:
        data.load_state_dict(rest)
    loader = StatefulDataLoader(data, batch_size=4, num_workers=num_workers)
    if state is not None:
        loader.load_state_dict(state)
    return loader


def keys_in(loader, epoch=None):
    if epoch is not None:
        loader.dataset.set_epoch(epoch)
    return [key for batch in loader for key in keys_of(batch)]


@pytest.mark.parametrize("num_workers, then", [(0, 0), (2, 2), (0, 2), (2, 1)])
def test_the_epoch_after_a_resumed_one_is_the_usual_next_epoch(urls, all_keys, num_workers, then):
    first = loader_in(urls, 2, num_workers)
    batches = iter(first)
    before = [key for _ in range(3) for key in keys_of(next(batches))]
    state = first.state_dict()
    del batches
    if then == num_workers:
        loader = loader_in(urls, 2, then, state=state)
    else:
        loader = loader_in(urls, 2, then, rest=rest_of_epoch(dataset(urls), loader_states(state)))
    assert_exactly_once(before + keys_in(loader), all_keys)
    assert keys_in(loader, 3) == keys_in(loader_in(urls, 3, then))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_checkpoint_at_the_end_of_an_epoch_starts_the_next(urls, num_workers):
    first = loader_in(urls, 0, num_workers)
    keys_in(first)
    loader = loader_in(urls, 1, num_workers, state=first.state_dict())
    assert keys_in(loader) == keys_in(loader_in(urls, 1, num_workers))


def test_a_state_from_the_middle_of_another_epoch_is_refused(urls):
    data = dataset(urls)
    data.set_epoch(2)
    next(data.iterate())
    resumed = dataset(urls)
    resumed.load_state_dict(data.state_dict())
    with pytest.raises(ValueError, match="middle of epoch 2.*at epoch 0: call set_epoch\\(2\\)"):
        next(resumed.iterate())
    resumed.load_state_dict(data.state_dict())
    resumed.set_epoch(5)  # another epoch drops the state: it starts afresh
    fresh = dataset(urls)
    fresh.set_epoch(5)
    assert list(resumed.iterate()) == list(fresh.iterate())


def test_persistent_workers_start_the_next_epoch_afresh_after_a_resume(urls):
    first = StatefulDataLoader(dataset(urls), batch_size=4, num_workers=2, persistent_workers=True)
    batches = iter(first)
    next(batches)
    state = first.state_dict()
    del batches
    data = dataset(urls)
    loader = StatefulDataLoader(data, batch_size=4, num_workers=2, persistent_workers=True)
    loader.load_state_dict(state)
    list(loader)
    data.set_epoch(1)
    fresh = dataset(urls)
    fresh.set_epoch(1)
    expected = [keys_of(batch) for batch in StatefulDataLoader(fresh, batch_size=4, num_workers=2)]
    assert [keys_of(batch) for batch in loader] == expected


def test_decoded_batches_resume_exactly(tiny_dataset, tmp_path):
    write_image_shards(tiny_dataset, tmp_path, maxcount=9, progress=False)
    urls = sorted(str(path) for path in tmp_path.glob("train-*.tar"))

    def loader():
        data = ShardDataset(urls, buffer_size=10, keys=("jpg", "cls", "__key__"), batch_size=5)
        return StatefulDataLoader(data, batch_size=None, num_workers=2)

    whole = list(loader())
    first = loader()
    batches = iter(first)
    before = [next(batches) for _ in range(4)]
    state = first.state_dict()
    del batches
    again = loader()
    again.load_state_dict(state)
    resumed = before + list(again)
    assert len(resumed) == len(whole)
    for (images, labels, keys), (images_then, labels_then, keys_then) in zip(resumed, whole):
        assert keys == keys_then and torch.equal(labels, labels_then)
        assert torch.equal(images, images_then)


def spoil(url, jpgs=(), labels=(), garbage=b"garbage"):
    """Rewrite the shard at ``url`` with its ``jpgs``-th images replaced by ``garbage`` and its
    ``labels``-th labels left out (counted among the shard's images and labels, from 0)."""
    with tarfile.open(url) as tar:
        members = [(member, tar.extractfile(member).read()) for member in tar.getmembers()]
    seen = Counter()
    with tarfile.open(url, "w", format=tarfile.USTAR_FORMAT) as tar:
        for member, data in members:
            kind = member.name.rsplit(".", 1)[1]
            seen[kind] += 1
            if kind == "cls" and seen[kind] - 1 in labels:
                continue
            data = garbage if kind == "jpg" and seen[kind] - 1 in jpgs else data
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))


@pytest.mark.filterwarnings("ignore:epoch 0. rank")
def test_decode_skips_are_counted_once_across_a_resume(tiny_dataset, tmp_path):
    write_image_shards(tiny_dataset, tmp_path, maxcount=9, progress=False)
    urls = sorted(str(path) for path in tmp_path.glob("train-*.tar"))
    spoil(urls[2], jpgs=(1, 5))
    spoil(urls[4], labels=(3,))

    def loader():
        keys = ("jpg", "cls", "__key__")
        data = ShardDataset(urls, buffer_size=10, keys=keys, batch_size=5, errors="skip")
        return StatefulDataLoader(data, batch_size=None, num_workers=2)

    def skipped(loader):
        return [
            sum(counts)
            for counts in zip(*(s["skipped"] for s in loader_states(loader.state_dict())))
        ]

    whole = loader()
    keys = [key for batch in whole for key in batch[2]]
    assert skipped(whole) == [0, 0, 3] and len(keys) == 60 - 3
    first = loader()
    batches = iter(first)
    before = [key for _ in range(3) for key in next(batches)[2]]
    state = first.state_dict()
    del batches
    again = loader()
    again.load_state_dict(state)
    assert before + [key for batch in again for key in batch[2]] == keys
    assert skipped(again) == [0, 0, 3]


@pytest.mark.filterwarnings("ignore:epoch 0. rank")
def test_a_resumed_worker_batches_images_of_the_shape_it_batched_before(tiny_dataset, tmp_path):
    write_image_shards(tiny_dataset, tmp_path, maxcount=9, progress=False)
    urls = sorted(str(path) for path in tmp_path.glob("train-*.tar"))[:3]
    other = io.BytesIO()
    Image.new("RGB", (40, 30)).save(other, "JPEG")
    spoil(urls[1], jpgs=range(1, 9), garbage=other.getvalue())  # after 10 samples: 8 of another

    def dataset():
        keys = ("jpg", "__key__")
        return ShardDataset(urls, shuffle=False, keys=keys, batch_size=5, errors="skip")

    whole = [key for _, keys in dataset() for key in keys]
    first = dataset()
    batches = first.iterate()
    before = [key for _ in range(2) for key in next(batches)[1]]
    again = dataset()
    again.load_state_dict(first.state_dict())
    assert before + [key for _, keys in again.iterate() for key in keys] == whole
    assert again.state_dict()["skipped"] == [0, 0, 8]
    with pytest.warns(UserWarning, match="without size: it resumes, but the image shape its"):
        dataset().load_state_dict(saved_by_older(first.state_dict(), ("size",)))


# --- a real kill ----------------------------------------------------------------------------------


def job(urls, folder, num_workers):
    """packdata's preemptible training job over ``urls``: 2 epochs in batches of 4, the stream
    of ``dataset(urls)``, a checkpoint every 3 steps."""
    options = {"epochs": 2, "pause": 0.04, "batch_size": 4, "buffer_size": 6, "seed": 11}
    return preemption.start(urls, folder, num_workers, **options)


def logged(folder, pid):
    return preemption.logged(folder, pid)[0]


@pytest.mark.parametrize("num_workers, then", [(2, 2), (0, 0), (2, 1)])
def test_a_killed_job_resumes_from_its_checkpoint_exactly_once(
    urls, all_keys, tmp_path, num_workers, then
):
    steps = -(-len(all_keys) // 4)
    kill_at = random.randrange(1, steps - 2)  # a random step of the first epoch
    first = job(urls, tmp_path, num_workers)
    preemption.kill_after(first, tmp_path, kill_at, timeout=60)
    killed = logged(tmp_path, first.pid)
    assert {line["epoch"] for line in killed} == {0}, f"killed at step {kill_at}: too late"
    saved = (tmp_path / "checkpoint.pt").exists()
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["step"] if saved else 0
    second = job(urls, tmp_path, then)
    assert second.wait(timeout=120) == 0
    resumed = logged(tmp_path, second.pid)
    epochs = [[line for line in resumed if line["epoch"] == epoch] for epoch in (0, 1)]
    kept = [line for line in killed if line["step"] < checkpoint]
    delivered = [key for line in kept + epochs[0] for key in line["keys"]]
    # against the checkpoint: what it kept, then what the restart delivered
    assert_exactly_once(delivered, all_keys, f"killed at step {kill_at}, checkpoint {checkpoint}: ")
    again = [line["keys"] for line in killed if line["step"] >= checkpoint]
    if then == num_workers:  # the same layout goes on in the same order: the same batches again
        assert [line["keys"] for line in epochs[0][: len(again)]] == again
    next_epoch = dataset(urls)
    next_epoch.set_epoch(1)
    expected = StatefulDataLoader(next_epoch, batch_size=4, num_workers=then)
    assert [line["keys"] for line in epochs[1]] == [keys_of(batch) for batch in expected]


# --- properties: any kill points, any numbers of ranks and workers --------------------------------


def test_a_job_that_fails_is_named_with_the_last_line_it_printed(tmp_path):
    job = preemption.start([str(tmp_path / "missing.tar")], tmp_path, num_workers=0)
    with pytest.raises(RuntimeError, match=r"before step 1 \(exit 1\); the last line .*missing"):
        preemption.kill_after(job, tmp_path, steps=1, timeout=60)


def interleaved(streams):
    """``(worker, item)`` from each of the workers' ``streams`` in turn, as a DataLoader takes
    them; an exhausted stream drops out."""
    active = dict(enumerate(streams))
    while active:
        for worker, stream in list(active.items()):
            item = next(stream, None)
            if item is None:
                del active[worker]
            else:
                yield worker, item


def run(urls, layout, epoch, loaded, stops, **options):
    """Every rank of ``layout`` (world size, workers) in ``epoch``, from ``loaded``: None (the
    start), a rest of the epoch, or a state per worker per rank; rank ``r`` stops after
    ``stops[r]`` samples (None: at the end). The keys each worker of each rank delivered, and every
    worker's state then (through JSON, as a checkpoint keeps it)."""
    world_size, num_workers = layout
    delivered, states = [], []
    for rank in range(world_size):
        workers = [dataset(urls, rank, world_size, **options) for _ in range(num_workers)]
        for worker, data in enumerate(workers):
            data.set_epoch(epoch)
            if isinstance(loaded, list):
                data.load_state_dict(loaded[rank][worker])
            elif loaded is not None:
                data.load_state_dict(loaded)
        streams = [data.iterate(worker, num_workers) for worker, data in enumerate(workers)]
        delivered.append([[] for _ in workers])
        for worker, (key, _) in islice(interleaved(streams), stops[rank]):
            delivered[rank][worker].append(key)
        states.append([json.loads(json.dumps(data.state_dict())) for data in workers])
    return delivered, states


def flat(per_rank):
    """The keys of every worker of every rank, in one list."""
    return [key for workers in per_rank for keys in workers for key in keys]


def every_worker(states):
    """The states of every worker of every rank, in one list."""
    return [state for workers in states for state in workers]


layouts = st.tuples(st.integers(1, 3), st.integers(1, 3))


@PROPERTY
@given(data=st.data(), buffer_size=st.sampled_from([0, 4, 20]), epoch=st.integers(0, 3))
def test_kills_and_resumes_with_any_layouts_deliver_every_sample_once(
    urls, all_keys, data, buffer_size, epoch
):
    plan = data.draw(st.lists(layouts, min_size=2, max_size=4), label="layouts")
    delivered, loaded = [], None
    for segment, layout in enumerate(plan):
        last = segment == len(plan) - 1
        stops = [None if last else data.draw(st.integers(0, 40)) for _ in range(layout[0])]
        keys, states = run(urls, layout, epoch, loaded, stops, buffer_size=buffer_size)
        delivered += flat(keys)
        if not last:  # the same layout may load the workers' states, any layout the rest
            same = plan[segment + 1] == layout and data.draw(st.booleans(), label="worker states")
            merged = (
                None
                if same
                else rest_of_epoch(dataset(urls, buffer_size=buffer_size), every_worker(states))
            )
            loaded = states if same else merged
    assert_exactly_once(delivered, all_keys)


@PROPERTY
@given(
    data=st.data(),
    layout=layouts,
    buffer_size=st.sampled_from([0, 3, 20]),
    kills=st.integers(1, 3),
)
def test_the_same_layout_resumes_the_same_order(urls, data, layout, buffer_size, kills):
    whole, _ = run(urls, layout, 1, None, [None] * layout[0], buffer_size=buffer_size)
    delivered, loaded = [[[] for _ in range(layout[1])] for _ in range(layout[0])], None
    for kill in range(kills + 1):
        last = kill == kills
        stops = [None if last else data.draw(st.integers(0, 30)) for _ in range(layout[0])]
        keys, states = run(urls, layout, 1, loaded, stops, buffer_size=buffer_size)
        delivered = [[a + b for a, b in zip(*pair)] for pair in zip(delivered, keys)]
        loaded = states
    assert delivered == whole


@PROPERTY
@given(data=st.data(), first=layouts, then=layouts, epoch=st.integers(0, 2))
def test_equalized_ranks_stay_equal_and_lose_nothing_when_the_world_size_stays(
    urls, data, first, then, epoch
):
    whole, _ = run(urls, first, epoch, None, [None] * first[0], equalize=True)
    plan = flat(whole)
    steps = data.draw(st.integers(0, len(plan) // first[0]))  # ranks stop together, as in DDP
    before, states = run(urls, first, epoch, None, [steps] * first[0], equalize=True)
    rest = rest_of_epoch(dataset(urls, equalize=True), every_worker(states))
    after, _ = run(urls, then, epoch, rest, [None] * then[0], equalize=True)
    delivered = flat(before) + flat(after)
    assert len({len(flat([rank])) for rank in after}) == 1, "every rank yields as many samples"
    assert len(delivered) == len(set(delivered)) and set(delivered) <= set(plan)
    if then[0] == first[0]:
        assert sorted(delivered) == sorted(plan)


@PROPERTY
@given(data=st.data(), first=layouts, then=layouts, equalize=st.booleans())
def test_len_counts_what_each_rank_has_left_of_a_resumed_epoch(urls, data, first, then, equalize):
    stops = [data.draw(st.integers(0, 40)) for _ in range(first[0])]
    _, states = run(urls, first, 1, None, stops, equalize=equalize)
    rest = rest_of_epoch(dataset(urls, equalize=equalize), every_worker(states))
    after, _ = run(urls, then, 1, rest, [None] * then[0], equalize=equalize)
    for rank, workers in enumerate(after):
        resumed = dataset(urls, rank, then[0], equalize=equalize)
        resumed.set_epoch(1)
        resumed.load_state_dict(rest)
        assert len(resumed) == len(flat([workers])), f"rank {rank} of {then[0]}"


def test_len_after_a_state_without_workers_counts_what_is_left(urls):
    data = dataset(urls)
    stream = data.iterate()
    taken = [next(stream) for _ in range(10)]
    resumed = dataset(urls)
    resumed.load_state_dict(data.state_dict())
    assert len(resumed) == sum(SIZES) - len(taken) == len(list(resumed.iterate()))
    assert len(resumed) == sum(SIZES)  # the state was used: a whole epoch again
    one_of_two = dataset(urls)
    one_of_two.load_state_dict(run(urls, (1, 2), 0, None, [5])[1][0][1])
    with pytest.raises(ValueError, match="worker's of rank 0 of 1, worker 1 of 2: load the rest"):
        len(one_of_two)


def write_bad_shards(folder):
    """A shard with a sample that has no label, one cut short after 4 samples, one missing."""
    folder.mkdir(parents=True, exist_ok=True)
    unlabelled, cut = folder / "unlabelled.tar", folder / "cut.tar"
    for path, names in [
        (unlabelled, ["b000.cls", "b001.txt", "b002.cls"]),
        (cut, [f"c{number:03d}.cls" for number in range(12)]),
    ]:
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for name in names:
                info = tarfile.TarInfo(name)
                info.size = 1
                tar.addfile(info, io.BytesIO(b"1"))
    cut.write_bytes(cut.read_bytes()[: 4 * 1024 + 100])  # a member is 1 KiB: 4 of 12 left
    return [str(unlabelled), str(cut), str(folder / "missing.tar")]


@pytest.fixture(scope="module")
def with_bad(urls, tmp_path_factory):
    return [*urls, *write_bad_shards(tmp_path_factory.mktemp("bad-shards"))]


def test_len_counts_the_samples_before_a_shards_damage_after_a_resume(with_bad):
    cut = [url for url in with_bad if url.endswith("cut.tar")]
    first = dataset(cut, shuffle=False, errors="skip", buffer_size=0)
    assert len(first) == 4  # the 4 samples before the cut
    taken = list(islice(first.iterate(), 2))
    resumed = dataset(cut, shuffle=False, errors="skip", buffer_size=0)
    resumed.load_state_dict(first.state_dict())
    assert len(taken) == 2 and len(resumed) == 2
    with pytest.warns(UserWarning, match="the rest of 1 damaged shard"):
        assert len(list(resumed.iterate())) == 2


def test_a_skip_before_a_resume_is_counted_once(with_bad):
    options = {"shuffle": False, "errors": "skip"}
    with pytest.warns(UserWarning, match=r"1 shard\(s\), the rest of 1 damaged shard\(s\), and 1"):
        whole = [key for key, _ in dataset(with_bad, **options).iterate()]
    first = dataset(with_bad, **options)
    before = [key for key, _ in islice(first.iterate(), len(whole) - 1)]
    resumed = dataset(with_bad, **options)
    resumed.load_state_dict(first.state_dict())
    counted = r"1 shard\(s\), the rest of 1 damaged shard\(s\), and 1 sample\(s\) this epoch"
    with pytest.warns(UserWarning, match=counted + r" \(3 of them before a resume"):
        after = [key for key, _ in resumed.iterate()]  # the shard under way read again: no twice
    assert before + after == whole


def test_the_skips_of_every_worker_before_a_rest_go_on_with_rank_0_worker_0(with_bad):
    options = {"shuffle": False, "errors": "skip"}
    with pytest.warns(UserWarning, match="skipped"):
        _, states = run(with_bad, (2, 1), 0, None, [None, None], **options)
    rest = rest_of_epoch(dataset(with_bad, **options), every_worker(states))
    resumed = dataset(with_bad, **options)
    resumed.load_state_dict(rest)
    counted = r"\(3 of them before a resume, 3 of those by the workers before the epoch's rest, c"
    with pytest.warns(UserWarning, match=counted):
        assert list(resumed.iterate()) == []


def test_a_workers_own_skips_in_a_rest_are_not_put_down_to_the_workers_before(with_bad):
    options = {"shuffle": False, "errors": "skip"}
    _, states = run(with_bad, (2, 1), 0, None, [0, 0], **options)  # nothing read, nothing skipped
    rest = rest_of_epoch(dataset(with_bad, **options), every_worker(states))
    first = dataset(with_bad, **options)
    first.load_state_dict(rest)
    taken = list(islice(first.iterate(), len(dataset(with_bad, **options)) - 2))  # bad ones too
    resumed = dataset(with_bad, **options)
    resumed.load_state_dict(first.state_dict())
    with pytest.warns(UserWarning, match=r"\(3 of them before a resume, counted in its state\)"):
        assert len(taken + list(resumed.iterate())) == 65 + 2 + 4


@pytest.mark.filterwarnings("ignore:epoch 1. rank")
@PROPERTY
@given(data=st.data(), buffer_size=st.sampled_from([0, 4, 20]))
def test_skips_are_counted_once_an_epoch_across_kills_and_resumes(with_bad, data, buffer_size):
    options = {"buffer_size": buffer_size, "errors": "skip"}
    whole, states = run(with_bad, (1, 1), 1, None, [None], **options)
    expected = states[0][0]["skipped"]
    plan = data.draw(st.lists(layouts, min_size=2, max_size=4), label="layouts")
    delivered, loaded = [], None
    for segment, layout in enumerate(plan):
        last = segment == len(plan) - 1
        stops = [None if last else data.draw(st.integers(0, 60)) for _ in range(layout[0])]
        keys, states = run(with_bad, layout, 1, loaded, stops, **options)
        delivered += flat(keys)
        same = not last and plan[segment + 1] == layout and data.draw(st.booleans())
        merged = rest_of_epoch(dataset(with_bad, **options), every_worker(states))
        loaded = states if same else merged
    assert_exactly_once(delivered, flat(whole))
    counted = [state["skipped"] for state in every_worker(states)]
    assert [sum(column) for column in zip(*counted)] == expected


def test_the_audit_of_an_epoch_before_the_checkpoint_keeps_all_the_killed_job_took(tmp_path):
    def log(pid, start, batches):
        lines = [{"resumed from": start}]
        lines += [{"epoch": e, "step": s, "keys": keys} for e, s, keys in batches]
        (tmp_path / f"log-{pid}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    log(1, [0, 0], [(0, 0, ["a", "b"]), (0, 1, ["c", "d"]), (1, 0, ["e", "f"])])
    log(2, [1, 1], [(1, 1, ["g", "h"])])  # the checkpoint: epoch 1, after its first step
    counted, again = preemption.audit(tmp_path, 1, 2, ["a", "b", "c", "d"], epoch=0)
    assert (counted.delivered, counted.duplicates, counted.missing, again) == (4, 0, 0, 0)
    counted, again = preemption.audit(tmp_path, 1, 2, ["e", "f", "g", "h"], epoch=1)
    assert (counted.delivered, counted.duplicates, counted.missing, again) == (4, 0, 0, 0)
