"""The JupyterHub path, for real: a hub on 127.0.0.1 (``packdata.course.localhub``, as ``make hub``
starts it), the README's nbgitpuller link followed in headless Chromium, lesson 0 run in the
learner's server, and a second pull that keeps the learner's edit.

The link is the README's template with the hub's address and a ``file://`` URL of a clone of this
repository standing in for the public one; nbgitpuller clones it into the learner's home. The
learner logs in through the hub's login form (the dummy authenticator of a test hub), edits and
saves with the keyboard, and runs the lesson from Lab's Run menu. Chromium may reach 127.0.0.1
only, and its network log shows that nothing the pages asked for left the machine.
Screenshots: ``build/hub/lesson0.png`` (lesson 0 run) and ``build/hub/lesson0-pulled-again.png``.
"""

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from browser import CHROMIUM, NOTEBOOK, browser, press_save, wait_for_notebook
from test_slides import assert_offline

from packdata.course import localhub

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "build" / "hub"
USER = "learner"
FOLDER = "packdata-course"
LESSON = "notebooks/00_welcome.md"
NOTE = "# the learner's own note, kept across pulls"
UPSTREAM_LINE = "Upstream change after the learner's first pull."

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)"
)
needs_npm = pytest.mark.skipif(
    shutil.which("npm") is None,
    reason="npm is needed to install configurable-http-proxy, the hub's proxy",
)
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="nbgitpuller needs git")


def git(repo, *args):
    """Run git in ``repo`` with a fixed identity; return its output."""
    identity = ["-c", "user.name=Course author", "-c", "user.email=author@example.org"]
    cmd = ["git", "-C", str(repo), *identity, *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """A clone of this repository's committed state, branch ``main``: the public repository's
    stand-in. A fresh clone has only the ``.md`` sources, no ``.ipynb``."""
    repo = tmp_path_factory.mktemp("upstream") / FOLDER
    subprocess.run(
        ["git", "clone", "--quiet", "--depth=1", ROOT.as_uri(), str(repo)],
        check=True,
        capture_output=True,
    )
    git(repo, "checkout", "--quiet", "-B", "main")
    return repo


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A hub on loopback; learners' data in scratch space, the small dataset."""
    scratch = tmp_path_factory.mktemp("scratch")
    env = {"PACKDATA_DATA_DIR": str(scratch / "data"), "PACKDATA_SIZE": "small"}
    running = localhub.start(scratch / "hub", users=(USER,), env=env)
    yield running
    localhub.stop(running)


def log_in(page):
    """Fill the hub's login form as the test learner (the dummy authenticator takes any
    password)."""
    page.wait_for("!!document.querySelector('input[name=username]')", "no login form")
    page.click("input[name=username]")
    page.type_text(USER)
    page.click("input[name=password]")
    page.type_text("any password")
    page.click("#login_submit")


# The prompts of the open notebook's code cells: "[3]:" once run, "[*]:" while running.
PROMPTS = (
    f"[...document.querySelectorAll('{NOTEBOOK} .jp-CodeCell .jp-InputPrompt')]"
    ".map(p => p.textContent.trim())"
)


def run_all_cells(page):
    """Run every cell from Lab's Run menu; wait until each code cell has its number."""
    page.click(".lm-MenuBar-itemLabel", "Run")
    page.click(".lm-Menu-itemLabel", "Run All Cells")
    page.wait_for(
        f"{PROMPTS}.every(p => /^\\[\\d+\\]:$/.test(p))",
        "the lesson's cells did not all run",
        timeout=120,
    )


def edit_first_code_cell_and_save(page):
    """Type ``NOTE`` at the end of the first code cell and save with Ctrl+S."""
    cell = f"{NOTEBOOK} .jp-CodeCell .cm-content"
    page.click(cell)
    page.press("End", "End", 35, modifiers=2)  # Ctrl+End: the end of the cell
    page.type_text("\n" + NOTE)
    page.wait_for(
        f"document.querySelector('{cell}').textContent.includes({json.dumps(NOTE)})",
        "the edit did not reach the cell",
    )
    page.press("Escape", "Escape", 27)
    press_save(page)


def saved_code_cells(page, lesson, timeout=60):
    """The code cells of ``lesson``'s saved .ipynb pair (jupytext writes it with the outputs) once
    every one has run and the edit is in the .md. On a busy machine the tab can look saved while
    the disk holds an autosave from mid-run: as a learner would, this presses Ctrl+S again."""
    deadline = time.monotonic() + timeout
    while True:
        ran = json.loads(lesson.with_suffix(".ipynb").read_text())
        code = [cell for cell in ran["cells"] if cell["cell_type"] == "code"]
        done = all(cell["execution_count"] for cell in code) and NOTE in lesson.read_text()
        if done or time.monotonic() > deadline:
            return code
        press_save(page, tries=1)
        time.sleep(2)


def test_the_link_is_the_readme_template_filled_in(tmp_path):
    link = localhub.git_pull_link(
        "http://127.0.0.1:8000/", "https://github.com/org/packdata-course", "packdata-course"
    )
    assert link == (
        "http://127.0.0.1:8000/hub/user-redirect/git-pull?"
        "repo=https%3A%2F%2Fgithub.com%2Forg%2Fpackdata-course&branch=main&"
        "urlpath=lab/tree/packdata-course/notebooks/00_welcome.md"
    )
    readme = tmp_path / "README.md"
    readme.write_text("# No hub section\n")
    with pytest.raises(localhub.HubError, match="found 0"):
        localhub.git_pull_link("http://127.0.0.1:8000", "file:///x", "x", readme=readme)


@needs_chromium
@needs_npm
@needs_git
def test_nbgitpuller_link_opens_runs_and_pulls_again_keeping_edits(hub, upstream, tmp_path):
    link = localhub.git_pull_link(hub.url, upstream.as_uri(), FOLDER)
    copy = hub.home(USER) / FOLDER
    net_log = tmp_path / "net.json"
    with browser(net_log) as page:
        page.open(link)
        log_in(page)
        assert wait_for_notebook(page, Path(LESSON).name) == "Python 3 (ipykernel)"
        assert page.evaluate("location.pathname") == f"/user/{USER}/lab/tree/{FOLDER}/{LESSON}"
        assert (copy / LESSON).exists() and (copy / ".git").is_dir(), "nbgitpuller cloned nothing"

        run_all_cells(page)
        edit_first_code_cell_and_save(page)
        page.screenshot(SCREENSHOTS / "lesson0.png")

        # jupytext pairs the lesson with an .ipynb: the saved outputs show what ran.
        code = saved_code_cells(page, copy / LESSON)
        assert all(cell["execution_count"] for cell in code)
        errors = [o for cell in code for o in cell["outputs"] if o["output_type"] == "error"]
        assert not errors, f"lesson 0 failed in the learner's server: {errors}"
        assert NOTE in (copy / LESSON).read_text()

        readme = upstream / "README.md"
        readme.write_text(readme.read_text() + f"\n{UPSTREAM_LINE}\n")
        git(upstream, "commit", "--quiet", "-am", "A change upstream")

        page.open(link)
        wait_for_notebook(page, Path(LESSON).name)
        # code cells get their editors when Lab has time: on a busy machine, after the notebook
        page.wait_for(
            f"document.querySelector('{NOTEBOOK}').textContent.includes({json.dumps(NOTE)})",
            "the learner's note on the page after the second pull",
        )
        page.screenshot(SCREENSHOTS / "lesson0-pulled-again.png")

    assert UPSTREAM_LINE in (copy / "README.md").read_text(), "the second pull merged nothing"
    assert NOTE in (copy / LESSON).read_text(), "the second pull lost the learner's edit"
    assert git(copy, "log", "-1", "--format=%H") != git(upstream, "log", "-1", "--format=%H")
    assert_offline(net_log, f"/user/{USER}/lab/tree/{FOLDER}/{LESSON}")
