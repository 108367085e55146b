"""JupyterLab as the course sets it up: the extensions it loads, and saving a lesson unedited.

``jupyter labextension list`` marks an extension whose declared dependencies do not match the
installed JupyterLab with a red X. jupyterlab-rise 0.43 requires jupyterlab-mathjax3, a JupyterLab
3 extension; the course pins 0.42.0, which does not, and ``packdata lab-settings`` disables it
where an older environment still has it (``packdata.course.hub``). The test runs the list
against the settings that ``write_lab_settings`` writes into a fresh prefix, so it checks what
``make setup`` and ``postBuild`` ship rather than the state of one machine's ``.venv``.

Saving: every lesson, worked sheet and exercise sheet goes through a real ``jupyter lab``'s
contents API the way Lab's autosave does, fetched as a notebook and put back with what running it
adds (a kernel's ``language_info``, execution counts, outputs, cell execution metadata). The
``.md`` must come back byte for byte, so that opening a lesson leaves ``git status`` clean.
tests/test_jupytext_roundtrip.py checks the same through jupytext alone.

In a browser: headless Chromium opens a lesson and an exercise sheet in that ``jupyter lab`` the
way a learner does (``tests/browser.py``). Each opens as a notebook with the course kernel,
``python3`` (jupyter_client starts it with the Python that runs Lab: ``.venv``'s), shows the RISE
button, and Ctrl+S without an edit writes the ``.md`` back byte for byte.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from browser import CHROMIUM, NOTEBOOK, browser, press_save, wait_for_notebook
from labserver import lab_server

from packdata.course import hub

ROOT = Path(__file__).resolve().parents[1]
SHEETS = ("notebooks", "solutions", "exercises")

JUPYTER = Path(sys.executable).with_name("jupyter")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# "        jupyterlab-rise v0.42.0 enabled OK (python, jupyterlab_rise)"
ROW = re.compile(
    r"^\s+(?P<name>\S+) v(?P<version>\S+)\s+(?P<state>enabled|disabled)\s+(?P<ok>OK|X)"
)


@pytest.fixture(scope="module")
def extensions(tmp_path_factory):
    """``{name: (state, "OK" or "X")}`` from ``jupyter labextension list`` with the course's
    settings written into a fresh prefix."""
    prefix = tmp_path_factory.mktemp("prefix")
    hub.write_lab_settings(prefix)
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(prefix / "etc" / "jupyter")}
    result = subprocess.run(
        [str(JUPYTER), "labextension", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    text = ANSI.sub("", result.stdout + result.stderr)
    rows = (ROW.match(line) for line in text.splitlines())
    return {row["name"]: (row["state"], row["ok"]) for row in rows if row}


def test_every_enabled_lab_extension_is_compatible(extensions):
    assert "jupyterlab-rise" in extensions, f"the list names no RISE: {extensions}"
    broken = sorted(name for name, (state, ok) in extensions.items() if ok == "X")
    enabled_broken = [name for name in broken if extensions[name][0] == "enabled"]
    assert not enabled_broken, (
        f"JupyterLab loads incompatible extensions {enabled_broken}: uninstall them, or disable "
        "them in DISABLED_EXTENSIONS of packdata.course.hub"
    )
    assert set(broken) <= set(hub.DISABLED_EXTENSIONS), (
        f"incompatible extensions {broken}; only {sorted(hub.DISABLED_EXTENSIONS)} are known"
    )


def test_the_course_extensions_are_enabled_and_compatible(extensions):
    for name in ("jupyterlab-jupytext", "jupyterlab-rise"):
        assert extensions.get(name) == ("enabled", "OK"), f"{name}: {extensions.get(name)}"


def test_lab_settings_keep_the_extensions_someone_else_disabled(tmp_path):
    page_config = tmp_path / "etc" / "jupyter" / "labconfig" / "page_config.json"
    page_config.parent.mkdir(parents=True)
    page_config.write_text('{"disabledExtensions": {"other-extension": true}, "x": 1}')
    hub.write_lab_settings(tmp_path)
    written = json.loads(page_config.read_text())
    assert written["disabledExtensions"] == {"other-extension": True, **hub.DISABLED_EXTENSIONS}
    assert written["lockedExtensions"] == hub.DISABLED_EXTENSIONS
    assert written["x"] == 1


def ran(notebook):
    """``notebook`` (nbformat JSON) as Lab holds it after running every cell."""
    notebook["metadata"]["language_info"] = {"name": "python", "version": "3.11.7"}
    for count, cell in enumerate(notebook["cells"], 1):
        if cell["cell_type"] == "code":
            cell["execution_count"] = count
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
            cell["metadata"]["execution"] = {"iopub.status.idle": "2026-11-25T12:00:00.000Z"}
            cell["metadata"]["trusted"] = True
    return notebook


def test_saving_an_unedited_lesson_in_lab_changes_nothing(tmp_path):
    root = tmp_path / "root"
    for folder in SHEETS:
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("*.ipynb"))
    sheets = sorted(root.glob("*/[0-9][0-9]_*.md"))
    assert len(sheets) >= 3 * 7
    changed = []
    with lab_server(root, tmp_path) as (base, token):
        for sheet in sheets:
            url = f"{base}/api/contents/{sheet.relative_to(root).as_posix()}?token={token}"
            before = sheet.read_bytes()
            with urllib.request.urlopen(f"{url}&type=notebook&content=1") as answer:
                notebook = json.load(answer)["content"]
            model = {"type": "notebook", "format": "json", "content": ran(notebook)}
            put = urllib.request.Request(
                url,
                data=json.dumps(model).encode(),
                method="PUT",
                headers={"Content-Type": "application/json"},
            )
            urllib.request.urlopen(put).close()
            if sheet.read_bytes() != before:
                changed.append(sheet.relative_to(root).as_posix())
    assert not changed, (
        f"saving rewrites {changed}: write them once with jupytext "
        "(python -c \"import jupytext as j; p='FILE'; j.write(j.read(p), p)\")"
    )


# A lesson and an exercise sheet, opened in the browser.
OPENED_IN_BROWSER = ("notebooks/00_welcome.md", "exercises/01_small_files.md")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_lab_opens_a_lesson_and_an_exercise_sheet_with_the_course_kernel(tmp_path):
    root = tmp_path / "root"
    for sheet in OPENED_IN_BROWSER:
        (root / sheet).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / sheet, root / sheet)
    with lab_server(root, tmp_path) as (base, token):
        for sheet in OPENED_IN_BROWSER:
            check_opens_as_notebook(base, token, root, sheet)


def check_opens_as_notebook(base, token, root, sheet):
    """Open ``sheet`` in a browser of its own: navigating away from a notebook whose kernel runs
    can raise Lab's "leave the page?" dialog, which would hold the next navigation."""
    with browser() as page:
        saved = (root / sheet).stat().st_mtime_ns
        page.open(f"{base}/lab/tree/{sheet}?token={token}")
        assert wait_for_notebook(page, Path(sheet).name) == "Python 3 (ipykernel)"
        with urllib.request.urlopen(f"{base}/api/sessions?token={token}") as answer:
            kernels = {s["path"]: s["kernel"]["name"] for s in json.load(answer)}
        assert kernels.get(sheet) == "python3", kernels
        page.wait_for(
            f"!!document.querySelector('{NOTEBOOK} [data-jp-item-name=RISE-button]')",
            f"{sheet}: no RISE button in the notebook's toolbar",
        )
        press_save(page)
        assert (root / sheet).stat().st_mtime_ns != saved, f"{sheet} was not written"
        assert (root / sheet).read_bytes() == (ROOT / sheet).read_bytes(), (
            f"opening and saving {sheet} in Lab rewrote it"
        )
