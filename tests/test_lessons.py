"""Every lesson runs from top to bottom, as a learner runs it, and leaves its executed deck.

A cell may fail only where the lesson says it will (tagged ``raises-exception``); any other error
fails the test with the cell and its traceback. The run writes the executed slide deck to
``build/slides/``, where ``tests/test_slides.py`` measures it in a browser, so that ``make test``
executes each lesson once. Without npm the deck still builds (it then loads reveal.js from a CDN,
which only the browser tests would mind).

Start methods: `make test` points ``PYTHONSTARTUP`` at ``tests/start_method.py``, so every
``DataLoader``, ``WebLoader`` and ``Pool`` a lesson makes without a start method of its own starts
its workers by ``forkserver``, the default on Linux from Python 3.14. Every lesson then runs once
more with ``spawn``, the default on macOS and Windows (those that start processes: the
others would run as before), where each worker imports torch again (1.5
to 3.5 s of CPU with torchvision). To keep that affordable, each loader that starts workers by
the default method starts only one (``$PACKDATA_MOST_WORKERS``): it must still unpickle what it is
sent. A loader, or a ceiling's plain processes, whose workers would import nothing a spawned worker
has not imported before starts them from a forkserver instead (``$PACKDATA_SPAWN_ONCE``:
tests/start_method.py says when).
``SHORTER_UNDER_SPAWN`` lists the other edits of that run: two rounds instead of three in
every comparison (and no untimed warm-up round before them), and fewer samples,
epochs or loaders in the longest measurements; an edit whose text is gone from its lesson fails the
test. Both methods pickle what they send to a worker, and a forkserver's workers start from a fresh
interpreter too (the server is a new process, not a copy of the kernel), so a lambda or a class
defined in the notebook fails under either; what spawn adds is that torch and torchvision are not
imported before a worker starts.
"""

import re
from pathlib import Path

import pytest

from packdata.course.schedule import run_seconds
from packdata.course.slides import build_slides

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))
# the lessons that start no process from the kernel (no loader with workers, pool, ceiling): under
# spawn they would run exactly as they do in the first run, so they run once (the first run checks
# that they still start none)
NO_WORKERS = ("00_welcome", "02_packing")
WITH_WORKERS = [lesson for lesson in LESSONS if lesson.stem not in NO_WORKERS]
# (lessons, pattern, replacement) for the spawn run: fewer rounds everywhere, and no untimed warm-up
# round (an epoch of every loader that tells this run nothing); fewer samples, epochs and loaders in
# the measurements that take longest with one worker per loader; lesson 8's Slurm cell takes the
# branch of a machine without Slurm, as on macOS, and its two torchrun nodes do not start, nor does
# lesson 6's torchrun (a `python -c pass` stands in): srun and torchrun start their own processes,
# whatever the kernel's start method, and scripts/train.py picks its workers' own, so the first run
# covers them
SHORTER_UNDER_SPAWN = [
    ("*", r"(compare\.in_turn\(\w+, )rounds=3\)", r"\1rounds=2, warmup=False)"),
    ("*", r"rounds=3\b", "rounds=2"),
    ("08_*", r"missing := localslurm\.missing_programs\(\)", 'missing := ["slurmctld"]'),
    ("08_*", r"nodes = launch_nodes\(", "nodes = [] and launch_nodes("),
    ("06_*", r'"-m", "torch\.distributed\.run",', '"-c", "pass",'),
    (
        "01_*",
        r"worker_counts = 5, \[n for n in \(0, 1, 2, 4, 8, 16\) if n <= most_workers\]",
        "worker_counts = 5, [0, 1]",
    ),
    ("01_*", r"min\((500|400)(?=, len\((photo_train|dataset)\)\))", "min(100"),
    ("03_*", r"(first\(.*), 500\)", r"\1, 100)"),
    (
        "06_*",
        r"n_objects if (latency_ms < 10) else min\(workers \* 64, n_objects\)",
        r"min(200 if \1 else 50, n_objects)",
    ),
    ("04_*", r"ProcessPoolExecutor\(4\)", "ProcessPoolExecutor(2)"),
    ("04_*", r"(plain_runs\(work, len\(work\)|\"4 processes\"), processes=4", r"\1, processes=2"),
    ("06_*", r"latencies_ms = 4, \[0, 2, 20\]", "latencies_ms = 4, [0, 20]"),
    ("06_*", r"epochs=6,", "epochs=2,"),
    ("06_*", r"for (_|epoch) in range\(3\):", r"for \1 in range(2):"),
    ("06_*", r"steps=30\)", "steps=10)"),
    ("06_*", r"len\(keys\) // 40\)", "len(keys) // 10)"),
    ("06_*", r'"--epochs", "2"', '"--epochs", "1"'),
    ("07_*", r"(compare_sources\(photo_shards, .*)rounds=2\)", r"\1rounds=1, cache_sizes=(0.5,))"),
]


def copied(lesson, tmp_path, text=None):
    """``lesson`` (or ``text`` in its name) alone in a fresh folder, where it runs."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    (folder / lesson.name).write_text(lesson.read_text() if text is None else text)
    return folder


@pytest.mark.parametrize("lesson", LESSONS, ids=[path.stem for path in LESSONS])
def test_lesson_runs(lesson, tmp_path, monkeypatch):
    started = tmp_path / "processes.log"  # tests/start_method.py notes each process started
    monkeypatch.setenv("PACKDATA_PROCESS_LOG", str(started))
    (deck,) = build_slides(copied(lesson, tmp_path), ROOT / "build" / "slides", execute=True)
    assert deck.stat().st_size > 0
    if lesson.stem in NO_WORKERS:
        assert not started.exists(), (
            f"{lesson.stem} now starts processes ({started.read_text().split()}): take it out "
            "of NO_WORKERS, so that it also runs under spawn"
        )
    else:
        assert started.exists(), f"{lesson.stem} starts no process: add it to NO_WORKERS"


def shorter_under_spawn(lesson):
    """The text of ``lesson`` with the edits of ``SHORTER_UNDER_SPAWN`` that apply to it."""
    text = lesson.read_text()
    for pattern_of_names, pattern, replacement in SHORTER_UNDER_SPAWN:
        if lesson.match(f"{pattern_of_names}.md"):
            text, count = re.subn(pattern, replacement, text)
            assert count or pattern_of_names == "*", f"{lesson.name} no longer has {pattern!r}"
    return text


@pytest.mark.parametrize("lesson", WITH_WORKERS, ids=[path.stem for path in WITH_WORKERS])
def test_lesson_runs_under_spawn(lesson, tmp_path, monkeypatch):
    monkeypatch.setenv("PACKDATA_START_METHOD", "spawn")
    monkeypatch.setenv("PACKDATA_MOST_WORKERS", "1")
    monkeypatch.setenv("PACKDATA_SPAWN_ONCE", "1")
    run_seconds(
        copied(lesson, tmp_path, shorter_under_spawn(lesson)) / lesson.name
    )  # a cell failing unexpectedly raises
