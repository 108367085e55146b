"""``pip install .`` gives the library, the course tools and their template; extras name the rest.

The wheel is built offline (no build isolation: setuptools comes from this environment) from a copy
of the project, so that no stale ``build/lib`` of the checkout can slip into it and nothing is
written into the checkout."""

import email
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = {"course", "s3", "dev"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source)
    shutil.copytree(
        ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--disable-pip-version-check", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("packdata-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


def test_the_wheel_holds_the_library_the_course_tools_and_their_template(wheel):
    names = set(wheel.namelist())
    assert {"packdata/__init__.py", "packdata/streaming.py", "packdata/cli.py"} <= names
    course = {
        f"packdata/course/{path.name}"
        for path in (ROOT / "src" / "packdata" / "course").glob("*.py")
    }
    assert "packdata/course/feedback.py" in course
    assert course <= names
    assert "packdata/course/templates/offline_reveal.html.j2" in names


def test_the_wheel_declares_the_extras_and_the_command(wheel):
    info = next(name for name in wheel.namelist() if name.endswith(".dist-info/METADATA"))
    metadata = email.message_from_bytes(wheel.read(info))
    assert set(metadata.get_all("Provides-Extra")) >= EXTRAS
    entry_points = wheel.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert "packdata = packdata.cli:main" in entry_points


def test_pyproject_declares_the_extras_and_keeps_the_course_tools_out_of_the_library():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert set(extras) >= EXTRAS
    assert {"jupytext", "nbclient", "nbconvert"} <= set(extras["course"])
    assert not {"jupytext", "nbclient", "nbconvert", "boto3", "pytest"} & set(
        project["dependencies"]
    )
    assert project["scripts"]["packdata"] == "packdata.cli:main"
