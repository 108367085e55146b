"""Set a Jupyter installation up for the course: JupyterLab opens jupytext Markdown as notebooks.

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
}


def write_lab_settings(prefix=None):
    """Write JupyterLab's ``overrides.json`` under ``prefix`` (default: this Python's); return its
    path.

    Settings already in the file for other plugins are kept.
    """
    path = Path(prefix or sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    settings = json.loads(path.read_text()) if path.exists() else {}
    settings.update(LAB_OVERRIDES)
    path.write_text(json.dumps(settings, indent=2) + "\n")
    return path
