"""Set a Jupyter installation up for the course: JupyterLab opens jupytext Markdown as notebooks,
and nothing in Lab or in a RISE slideshow reaches for the internet.

Used by ``make setup`` (for ``.venv``) and by ``postBuild`` (for a JupyterHub or Binder image).
"""

import json
import sys
from pathlib import Path

LAB_OVERRIDES = {
    # Lessons are .md files: open them as notebooks (jupytext), not as text.
    "@jupyterlab/docmanager-extension:plugin": {
        "defaultViewers": {"markdown": "Jupytext Notebook"}
    },
    # The course runs offline: no news or update checks that would try to reach the internet.
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    # RISE's default reveal theme, "simple", like most of them imports its fonts from Google.
    # "serif" and "white" use local fonts only; "white" capitalises headings, code names included.
    "jupyterlab-rise:plugin": {"theme": "serif"},
}

# Built for JupyterLab 3: jupyterlab-rise 0.43 requires jupyterlab-mathjax3, whose extension
# JupyterLab 4 lists as incompatible, with a red X (Lab 4 renders math with its own MathJax 3). The
# course pins jupyterlab-rise 0.42.0, which does not require it; an environment built with 0.43
# keeps it installed (pip does not remove a dependency that is no longer asked for). There it is
# disabled, so neither Lab nor RISE activates it, and locked, so Lab's plugin manager cannot
# enable it (Lab does not rewrite the file to add the lock itself, as it does to a bare
# disabledExtensions).
DISABLED_EXTENSIONS = {"@jupyterlab/mathjax3-extension": True}


def write_lab_settings(prefix=None):
    """Write JupyterLab's ``overrides.json`` and ``page_config.json`` under ``prefix`` (default:
    this Python's); return the path of ``overrides.json``.

    Settings already in the files for other plugins and extensions are kept.
    """
    prefix = Path(prefix or sys.prefix)
    overrides = prefix / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    merge_json(overrides, LAB_OVERRIDES)
    page_config = prefix / "etc" / "jupyter" / "labconfig" / "page_config.json"
    merge_json(
        page_config,
        {"disabledExtensions": DISABLED_EXTENSIONS, "lockedExtensions": DISABLED_EXTENSIONS},
    )
    return overrides


def merge_json(path, settings):
    """Update the JSON object in ``path`` (created when missing) with ``settings``, one level deep:
    the keys of a nested object that ``settings`` does not name are kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    current = json.loads(path.read_text()) if path.exists() else {}
    for key, value in settings.items():
        old = current.get(key)
        current[key] = {**old, **value} if isinstance(old, dict) else value
    path.write_text(json.dumps(current, indent=2) + "\n")
