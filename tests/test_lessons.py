"""Every lesson runs from top to bottom, as a learner runs it, and leaves its executed deck.

A cell may fail only where the lesson says it will (tagged ``raises-exception``); any other error
fails the test with the cell and its traceback. The run writes the executed slide deck to
``build/slides/``, where ``tests/test_slides.py`` measures it in a browser, so that ``make test``
executes each lesson once. Without npm the deck still builds (it then loads reveal.js from a CDN,
which only the browser tests would mind).

Start methods: `make test` points ``PYTHONSTARTUP`` at ``tests/start_method.py``, so every
``DataLoader``, ``WebLoader`` and ``Pool`` a lesson makes without a start method of its own starts
its workers by ``forkserver``, the default on Linux from Python 3.14. The lessons of
``SPAWN_AGAIN`` then run once more with ``spawn``, the default on macOS and Windows: every lesson
but the three whose measurements start dozens of workers (1, 6 and 7: each spawned worker imports
torch again, 1.5 to 3 s of CPU, which would take `make test` past 15 minutes). Both methods pickle
what they send to a worker, and a forkserver's workers start from a fresh interpreter too (the
server is a new process, not a copy of the kernel), so a lambda or a class defined in the notebook
fails under either; what forkserver adds is torch and torchvision imported before the fork.
``PACKDATA_SPAWN_LESSONS=all`` runs every lesson again under ``spawn``.
"""

import os
import shutil
from pathlib import Path

import pytest

from packdata.course.schedule import run_seconds
from packdata.course.slides import build_slides

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))
SPAWN_AGAIN = "*" if os.environ.get("PACKDATA_SPAWN_LESSONS") == "all" else "0[023458]"
AGAIN = [lesson for lesson in LESSONS if lesson.match(f"{SPAWN_AGAIN}_*.md")]


def copied(lesson, tmp_path):
    """``lesson`` copied alone into a fresh folder, where it runs."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    shutil.copy(lesson, folder / lesson.name)
    return folder


@pytest.mark.parametrize("lesson", LESSONS, ids=[path.stem for path in LESSONS])
def test_lesson_runs(lesson, tmp_path):
    (deck,) = build_slides(copied(lesson, tmp_path), ROOT / "build" / "slides", execute=True)
    assert deck.stat().st_size > 0


@pytest.mark.parametrize("lesson", AGAIN, ids=[path.stem for path in AGAIN])
def test_lesson_runs_under_spawn(lesson, tmp_path, monkeypatch):
    monkeypatch.setenv("PACKDATA_START_METHOD", "spawn")
    run_seconds(copied(lesson, tmp_path) / lesson.name)  # a cell failing unexpectedly raises
