"""The ``packdata`` command: every verb is listed, and a course verb without the course tools says
what to install instead of failing with a traceback."""

import subprocess
import sys

import pytest

from packdata import cli
from packdata.shardwrite import write_shards

WITHOUT_JUPYTEXT = """
import sys

import pytest
sys.modules["jupytext"] = None  # as if only the library were installed
from packdata import cli
sys.exit(cli.main(["exercises", "--check"]))
"""


def test_help_lists_every_verb(capsys):
    parser = cli.build_parser()
    parser.print_help()
    listed = capsys.readouterr().out
    for verb in ("make-data", "export", "shards", "serve", "exercises", "schedule", "slides"):
        assert verb in listed
    assert "lab-settings" in listed


def test_a_course_verb_without_the_course_tools_says_what_to_install():
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_JUPYTEXT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "packdata exercises: error: needs 'jupytext'" in done.stderr
    assert "pip install 'packdata[course]'" in done.stderr and "Traceback" not in done.stderr


def test_a_data_verb_needs_no_course_tools(tiny_dataset, tmp_path):
    shard = write_shards(tiny_dataset, tmp_path, maxcount=100, progress=False)[0].path
    code = f"""
import sys

import pytest
for name in ("jupytext", "nbclient", "nbconvert"):
    sys.modules[name] = None
from packdata import cli
sys.exit(cli.main(["shards", "list", {str(shard)!r}]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "60 samples" in done.stdout


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["shards", "map", "x.tar", "-o", "out", "-c", "true", "-p", "0"], "0: give 1 or more"),
        (
            ["shards", "map", "x.tar", "-o", "out", "-c", "true", "-p", "-1", "--dask", "local"],
            "-1: give 1 or more",
        ),
        (["shards", "write", "src", "out", "-p", "0"], "0: give 1 or more"),
        (["serve", ".", "--port", "70000"], "70000: a port is 0 to 65535"),
    ],
)
def test_counts_and_ports_out_of_range_are_refused_in_a_line(arguments, said, capsys):
    with pytest.raises(SystemExit) as ended:
        cli.main(arguments)
    assert ended.value.code == 2 and said in capsys.readouterr().err
