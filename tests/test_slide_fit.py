"""Every code cell that a slide shows fits on it: at most 90 columns and 20 lines; every deck has
at most 20 slides.

A cell is shown unless its ``slideshow`` ``slide_type`` is ``skip`` (``notes`` cells are Markdown
and never code). The deck's CSS (``packdata.course.slides``) sizes code so that 90 columns and
20 lines fit a 1280x720 slide with text of at least 14 px; ``test_deck_fits_the_screen`` in
``test_slides.py`` renders the built decks in Chromium and checks them, outputs included.

Hidden set-up cells (``slide_type: skip``) are the place for print and plot boilerplate; code a
learner should read stays visible and is wrapped to fit. A failure names the lesson, the code
cell (counting code cells from 1, hidden ones included, as Jupyter shows them in order) with its
first line, and the line.

Slides are counted in the source (``packdata.course.slides.deck_slides``, as the instructor guide's
minutes count them): shown cells whose ``slide_type`` is ``slide`` or ``subslide``. A
lesson over the limit merges two slides that make one idea, or moves a detail subslide to the
notebook only (``skip``, its Markdown and its code, "in the notebook, not on the slides" in its
heading).
"""

from pathlib import Path

import jupytext
import pytest

from packdata.course.slides import deck_slides, slide_type

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))
MAX_COLUMNS = 90
MAX_LINES = 20
MAX_SLIDES = 20


def visible_code_cells(lesson):
    """``(number, cell)`` of the code cells a slide shows; numbers count code cells from 1."""
    code = [cell for cell in jupytext.read(lesson).cells if cell.cell_type == "code"]
    return [
        (number, cell) for number, cell in enumerate(code, start=1) if slide_type(cell) != "skip"
    ]


def misfits(lesson):
    """One readable line per visible code cell that is too wide or too long."""
    problems = []
    for number, cell in visible_code_cells(lesson):
        lines = cell.source.splitlines()
        where = f"{lesson.name} code cell {number} ({lines[0][:40] if lines else ''!r})"
        if len(lines) > MAX_LINES:
            problems.append(f"{where}: {len(lines)} lines > {MAX_LINES}")
        for row, line in enumerate(lines, start=1):
            if len(line) > MAX_COLUMNS:
                problems.append(f"{where} line {row}: {len(line)} columns > {MAX_COLUMNS}")
    return problems


@pytest.mark.parametrize("lesson", LESSONS, ids=[path.stem for path in LESSONS])
def test_visible_code_fits_a_slide(lesson):
    problems = misfits(lesson)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("lesson", LESSONS, ids=[path.stem for path in LESSONS])
def test_deck_has_at_most_20_slides(lesson):
    count = deck_slides(jupytext.read(lesson).cells)
    assert count <= MAX_SLIDES, f"{lesson.name}: {count} slides > {MAX_SLIDES}"


def test_finds_lessons():
    assert len(LESSONS) >= 5
