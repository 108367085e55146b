"""The instructor's measuring scripts: scripts/lesson_memory.py and scripts/teaching_minutes.py."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MB = 1_000_000


def load(name):
    """Import ``scripts/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The kernel holds 200 MB; a forked worker allocates 100 MB more of its own for a second.
ALLOCATING = """\
```python
import numpy as np
from multiprocessing import get_context

block = np.ones(200 * 1_000_000 // 8)
```

```python
def hold(_):
    import time
    import numpy as np
    mine = np.ones(100 * 1_000_000 // 8)
    time.sleep(1.5)
    return float(mine.sum())

with get_context("fork").Pool(1) as pool:
    pool.map(hold, [0])
```
"""


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc")
def test_lesson_memory_counts_the_kernel_and_its_workers(tmp_path):
    notebook = tmp_path / "00_alloc.md"
    notebook.write_text(ALLOCATING)
    usage = load("lesson_memory").measure(notebook, interval=0.05)
    assert usage.name == f"{tmp_path.name}/00_alloc"
    assert usage.peak_processes >= 2  # the kernel and the pool's worker
    # 300 MB allocated across two processes, plus the kernel's own Python and numpy
    assert 300 * MB < usage.peak_pss < usage.peak_rss
    assert usage.cpu_s > 0 and usage.wall_s > 1.5


def test_lesson_memory_refuses_a_missing_notebook(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lesson_memory.py"), str(tmp_path / "nope.md")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "no such notebook" in result.stderr


LESSON = """\
<!-- #region slideshow={"slide_type": "slide"} -->
# One two three
<!-- #endregion -->

```python slideshow={"slide_type": "fragment"}
print(1)
print(2)
```

<!-- #region slideshow={"slide_type": "subslide"} -->
four five
<!-- #endregion -->

```python slideshow={"slide_type": "skip"}
hidden = True
```

<!-- #region slideshow={"slide_type": "notes"} -->
six seven eight
<!-- #endregion -->
"""

SOLUTION = """\
```python
from packdata.course import folder_checks
```

```python
# a comment
answer = 1

answer += 1
folder_checks.check_answer(answer)
```
"""


def test_teaching_minutes_counts_what_the_slides_show(tmp_path):
    for folder in ("notebooks", "solutions"):
        (tmp_path / folder).mkdir()
    (tmp_path / "notebooks" / "01_a.md").write_text(LESSON)
    (tmp_path / "solutions" / "01_a.md").write_text(SOLUTION)
    script = load("teaching_minutes")
    counts = script.lesson_counts(tmp_path / "notebooks" / "01_a.md")
    assert counts == {
        "slides": 2,
        "slide words": 5,
        "note words": 3,
        "code cells": 1,
        "code lines": 2,
    }
    assert script.solution_lines(tmp_path / "solutions" / "01_a.md") == [3]
    teach, practise = script.estimate(counts, [3])
    assert teach == pytest.approx(8 / script.WORDS_PER_MINUTE + script.CODE_CELL_MINUTES)
    assert practise == pytest.approx(script.EXERCISE_MINUTES + 3 * script.MINUTES_PER_SOLUTION_LINE)
    table = script.markdown_table(script.lesson_rows(tmp_path))
    assert table.splitlines()[2].startswith("| `01_a` | 2 | 5 | 3 | 1 (2) | 1 (3) |")


def test_the_guides_estimate_is_what_the_lessons_hold_now():
    # slides, code cells and exercises exactly; minutes within 2 (a reworded slide moves them a
    # little, a new section more)
    script = load("teaching_minutes")
    guide = (ROOT / "INSTRUCTORS.md").read_text()
    block = guide.split(script.START, 1)[1].split(script.END, 1)[0]
    shown = {row[0].strip("` "): row for row in _table_rows(block)}
    redo = "run .venv/bin/python scripts/teaching_minutes.py --write INSTRUCTORS.md"
    for lesson in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md")):
        counts = script.lesson_counts(lesson)
        exercises = script.solution_lines(ROOT / "solutions" / lesson.name)
        teach, practise = script.estimate(counts, exercises)
        assert lesson.stem in shown, f"INSTRUCTORS.md has no estimate for {lesson.stem}: {redo}"
        _, slides, _, _, cells, sheet, shown_teach, shown_practise = shown[lesson.stem]
        assert (int(slides), int(cells.split()[0]), int(sheet.split()[0])) == (
            counts["slides"],
            counts["code cells"],
            len(exercises),
        ), f"{lesson.stem} changed its slides, code cells or exercises: {redo}"
        assert abs(int(shown_teach) - teach) <= 2 and abs(int(shown_practise) - practise) <= 2, (
            f"{lesson.stem}'s minutes moved: {redo}"
        )


def _table_rows(markdown):
    """The cells of each body row of the Markdown table in ``markdown``."""
    lines = [line for line in markdown.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
