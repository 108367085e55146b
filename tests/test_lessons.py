"""Every lesson runs from top to bottom, as a learner runs it, and leaves its executed deck.

A cell may fail only where the lesson says it will (tagged ``raises-exception``); any other error
fails the test with the cell and its traceback. The run writes the executed slide deck to
``build/slides/``, where ``tests/test_slides.py`` measures it in a browser, so that ``make test``
executes each lesson once. Without npm the deck still builds (it then loads reveal.js from a CDN,
which only the browser tests would mind).
"""

import shutil
from pathlib import Path

import pytest

from packdata.course.slides import build_slides

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))


@pytest.mark.parametrize("lesson", LESSONS, ids=[path.stem for path in LESSONS])
def test_lesson_runs(lesson, tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    shutil.copy(lesson, folder / lesson.name)
    (deck,) = build_slides(folder, ROOT / "build" / "slides", execute=True)
    assert deck.stat().st_size > 0
