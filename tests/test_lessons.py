"""Every lesson runs from top to bottom, as a learner runs it, and leaves its executed deck.

A cell may fail only where the lesson says it will (tagged ``raises-exception``); any other error
fails the test with the cell and its traceback. The run writes the executed slide deck to
``build/slides/``, where ``tests/test_slides.py`` measures it in a browser, so that ``make test``
executes each lesson once. Without npm the deck still builds (it then loads reveal.js from a CDN,
which only the browser tests would mind).

Start methods: `make test` points ``PYTHONSTARTUP`` at ``tests/start_method.py``, so every
``DataLoader``, ``WebLoader`` and ``Pool`` a lesson makes without a start method of its own starts
its workers by ``forkserver``, the default on Linux from Python 3.14. The lessons of
``UNDER_SPAWN`` then run once more with ``spawn``, the default on macOS and Windows, shortened by
``SHORTER_UNDER_SPAWN``: each spawned worker imports torch again (1.5 to 3.5 s of CPU with
torchvision), so every comparison runs two rounds instead of three and the longest sweeps fewer
workers. Every cell still runs and starts its workers by spawn; an edit whose text is gone from
its lesson fails the test. Lessons 1, 6 and 7 start dozens of workers in their measurements: even
shortened, lessons 1 and 6 took a fresh clone's `make test` from about 14 to 16 minutes, and lesson
7 alone to 14.8 and 15.0 minutes (two runs), past the 15 it must keep, so they run only with
``PACKDATA_SPAWN_LESSONS=all``. Lesson 7's resumable job stream is tested with spawned workers in
``tests/test_resume.py``. Both methods pickle what they send to a worker, and a forkserver's workers
start from a fresh interpreter too (the server is a new process, not a copy of the kernel), so a
lambda or a class defined in the notebook fails under either; what spawn adds is that torch and
torchvision are not imported before a worker starts.
"""

import os
import re
from pathlib import Path

import pytest

from packdata.course.schedule import run_seconds
from packdata.course.slides import build_slides

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))
EVERY_LESSON = os.environ.get("PACKDATA_SPAWN_LESSONS") == "all"
UNDER_SPAWN = [lesson for lesson in LESSONS if EVERY_LESSON or lesson.match("0[023458]_*.md")]
# (lessons, pattern, replacement) for the spawn run: fewer rounds everywhere, fewer workers in the
# measurements that start most (lesson 1: 31 workers for 0 to 16; lesson 5: 12, 3 per loader;
# lesson 6: 24, 4 per loader; lesson 7: 16, 2 per source and round, here 6); lesson 8's Slurm cell
# takes the branch of a machine without Slurm, as on macOS (srun and torchrun start their own
# processes, whatever the kernel's start method: the first run covers them)
SHORTER_UNDER_SPAWN = [
    ("*", r"rounds=3\b", "rounds=2"),
    ("08_*", r"missing := localslurm\.missing_programs\(\)", 'missing := ["slurmctld"]'),
    ("01_*", r"worker_counts = 5, \[0, 1, 2, 4, 8, 16\]", "worker_counts = 5, [0, 1, 4]"),
    ("06_*", r"workers, latencies_ms = 4, ", "workers, latencies_ms = 2, "),
    ("05_*", r"batch_size=None, num_workers=3\)\]", "batch_size=None, num_workers=2)]"),
    ("07_*", r"(compare_sources\(photo_shards, .*)rounds=2\)", r"\1rounds=1, cache_sizes=(0.5,))"),
]


def copied(lesson, tmp_path, text=None):
    """``lesson`` (or ``text`` in its name) alone in a fresh folder, where it runs."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    (folder / lesson.name).write_text(lesson.read_text() if text is None else text)
    return folder


@pytest.mark.parametrize("lesson", LESSONS, ids=[path.stem for path in LESSONS])
def test_lesson_runs(lesson, tmp_path):
    (deck,) = build_slides(copied(lesson, tmp_path), ROOT / "build" / "slides", execute=True)
    assert deck.stat().st_size > 0


def shorter_under_spawn(lesson):
    """The text of ``lesson`` with the edits of ``SHORTER_UNDER_SPAWN`` that apply to it."""
    text = lesson.read_text()
    for pattern_of_names, pattern, replacement in SHORTER_UNDER_SPAWN:
        if lesson.match(f"{pattern_of_names}.md"):
            text, count = re.subn(pattern, replacement, text)
            assert count or pattern_of_names == "*", f"{lesson.name} no longer has {pattern!r}"
    return text


@pytest.mark.parametrize("lesson", LESSONS, ids=[path.stem for path in LESSONS])
def test_every_spawn_edit_still_finds_its_text(lesson):
    # runs for every lesson, also those make test leaves out of the spawn run
    shorter_under_spawn(lesson)


@pytest.mark.parametrize("lesson", UNDER_SPAWN, ids=[path.stem for path in UNDER_SPAWN])
def test_lesson_runs_under_spawn(lesson, tmp_path, monkeypatch):
    monkeypatch.setenv("PACKDATA_START_METHOD", "spawn")
    run_seconds(
        copied(lesson, tmp_path, shorter_under_spawn(lesson)) / lesson.name
    )  # a cell failing unexpectedly raises
