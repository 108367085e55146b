"""Every lesson runs from top to bottom, as a learner runs it, and leaves its executed deck.

A cell may fail only where the lesson says it will (tagged ``raises-exception``); any other error
fails the test with the cell and its traceback. The run writes the executed slide deck to
``build/slides/``, where ``tests/test_slides.py`` measures it in a browser, so that ``make test``
executes each lesson once. Without npm the deck still builds (it then loads reveal.js from a CDN,
which only the browser tests would mind).

Start methods: `make test` points ``PYTHONSTARTUP`` at ``tests/start_method.py``, so every
``DataLoader``, ``WebLoader`` and ``Pool`` a lesson makes without a start method of its own starts
its workers by ``forkserver`` (Linux from Python 3.14), or by ``spawn`` (macOS, Windows) in the
lessons of ``SPAWNED``: the worker-handles lesson, the two streaming lessons, whose worker code
learners copy, and the scale-out lesson. Both pickle what they send to a worker, so a lambda or a
class defined in the notebook fails under either. Lessons 3 and 8 take no longer under ``spawn``;
lessons 1, 6 and 7 start dozens of workers, each of which would import torch again (2 to 4 times
their forkserver time). ``PACKDATA_SPAWN_LESSONS=all`` runs every lesson under ``spawn``.
"""

import os
import shutil
from pathlib import Path

import pytest

from packdata.course.slides import build_slides

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))
SPAWNED = "*" if os.environ.get("PACKDATA_SPAWN_LESSONS") == "all" else "0[3458]"


@pytest.mark.parametrize("lesson", LESSONS, ids=[path.stem for path in LESSONS])
def test_lesson_runs(lesson, tmp_path, monkeypatch):
    if lesson.match(f"{SPAWNED}_*.md"):
        monkeypatch.setenv("PACKDATA_START_METHOD", "spawn")
    folder = tmp_path / "notebooks"
    folder.mkdir()
    shutil.copy(lesson, folder / lesson.name)
    (deck,) = build_slides(folder, ROOT / "build" / "slides", execute=True)
    assert deck.stat().st_size > 0
