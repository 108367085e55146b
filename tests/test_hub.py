"""Hub readiness: JupyterLab settings, the post-build step, and the generated schedule."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from packdata.course import hub, schedule

ROOT = Path(__file__).resolve().parents[1]


def test_lab_settings_open_markdown_as_notebooks_and_keep_other_settings(tmp_path):
    path = tmp_path / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps({"@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"}})
    )
    assert hub.write_lab_settings(tmp_path) == path
    settings = json.loads(path.read_text())
    assert (
        settings["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]["markdown"]
        == "Jupytext Notebook"
    )
    assert settings["@jupyterlab/apputils-extension:themes"] == {"theme": "JupyterLab Dark"}


def test_post_build_generates_the_dataset_and_lab_settings(tmp_path):
    # in a copy of the course: jupytext, writing the .ipynb pairs, also touches the .md sources
    # (which the lessons' tests, running beside this one, compare with their decks)
    course = tmp_path / "course"
    for folder in ("notebooks", "solutions", "exercises"):
        shutil.copytree(ROOT / folder, course / folder, ignore=shutil.ignore_patterns("*.ipynb"))
    shutil.copy(ROOT / "postBuild", course)
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PACKDATA_DATA_DIR": str(tmp_path / "data"),
        "PACKDATA_SIZE": "small",
    }
    subprocess.run(
        [str(course / "postBuild")], env=env, check=True, capture_output=True, timeout=300
    )
    assert (tmp_path / "data" / "synthetic-small" / "manifest.json").exists()
    settings = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    assert "Jupytext Notebook" in settings.read_text()
    assert (course / "notebooks" / "00_welcome.ipynb").exists()


LESSON = """\
```python
print(sum(range(10)))
```
"""


def test_timing_run_and_guide_update(tmp_path):
    for folder in ("notebooks", "solutions"):
        (tmp_path / folder).mkdir()
    (tmp_path / "notebooks" / "00_a.md").write_text(LESSON)
    (tmp_path / "notebooks" / "01_b.md").write_text(LESSON)
    (tmp_path / "solutions" / "01_b.md").write_text(LESSON)
    rows = schedule.timing_run(tmp_path)
    assert [(name, solution is None) for name, _, solution in rows] == [
        ("00_a", True),
        ("01_b", False),
    ]
    assert all(seconds > 0 for _, seconds, _ in rows)

    guide = tmp_path / "GUIDE.md"
    guide.write_text(f"# Guide\n\n{schedule.START}\nold\n{schedule.END}\n\nafter\n")
    schedule.update_guide(guide, schedule.schedule_markdown(rows, data_bytes=5_000_000))
    text = guide.read_text()
    assert "old" not in text and text.endswith("after\n")
    assert "| `00_a` |" in text and "| `01_b` |" in text and "**5 MB**" in text


def test_schedule_totals_the_lessons_alone_and_with_the_worked_exercises():
    text = schedule.schedule_markdown([("00_a", 60, None), ("01_b", 120, 60)], data_bytes=0)
    assert (
        "All lessons together: **3.0 minutes** of computation; with the worked exercises, **4.0 "
        "minutes**." in text
    )


def test_guide_without_markers_is_refused(tmp_path):
    guide = tmp_path / "GUIDE.md"
    guide.write_text("# no markers here\n")
    with pytest.raises(ValueError, match="no schedule markers"):
        schedule.update_guide(guide, "table")


def test_instructor_guide_has_a_schedule_slot():
    text = (ROOT / "INSTRUCTORS.md").read_text()
    assert schedule.START in text and schedule.END in text


def test_instructor_schedule_covers_every_lesson():
    """Adding a lesson means timing it too: run `make schedule`."""
    text = (ROOT / "INSTRUCTORS.md").read_text()
    for lesson in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md")):
        assert f"| `{lesson.stem}` |" in text, (
            f"{lesson.stem} is not in the schedule: run 'make schedule'"
        )
