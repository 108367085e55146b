"""``pip install .`` gives a working library and command; the extras name the rest."""

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_the_library_the_course_tools_and_their_template(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("packdata-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"packdata/streaming.py", "packdata/cli.py", "packdata/course/checks.py"} <= names
    assert "packdata/course/templates/offline_reveal.html.j2" in names


def test_the_extras_and_the_command_are_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {"course", "s3", "dev"} <= set(project["optional-dependencies"])
    assert "jupytext" in project["optional-dependencies"]["course"]
    assert not {"jupytext", "nbclient", "nbconvert"} & set(project["dependencies"])
    assert project["scripts"]["packdata"] == "packdata.cli:main"
