"""Opening a lesson, solution or exercise sheet in JupyterLab and saving it without edits leaves the
file as it was: jupytext (the pinned version) writes back exactly what the repository holds, so
autosave never marks a tracked file modified."""

from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    path
    for folder in ("notebooks", "solutions", "exercises")
    for path in (ROOT / folder).glob("[0-9][0-9]_*.md")
)


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_saving_without_edits_writes_the_same_file(path):
    text = path.read_text(encoding="utf-8")
    assert jupytext.writes(jupytext.reads(text, fmt="md"), fmt="md") == text, (
        f"{path.relative_to(ROOT)} changes when saved: write it once with jupytext "
        "(python -c \"import jupytext as j; p='FILE'; j.write(j.read(p), p)\")"
    )
