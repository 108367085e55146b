"""The peers lab (`make bench-peers`): every driver offers the same interface, and the lab's audit
counts duplicates and missing samples. The drivers themselves import only in the side environments
(.venv-peers, .venv-mosaic), which `make bench-peers` builds: the test that imports them is skipped
where those are absent, and nothing here installs anything."""

import ast
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "benchmarks" / "peers"
DRIVERS = sorted(PEERS.glob("tool_*.py"))
CONSTANTS = ("TITLE", "PACKAGE", "VENV", "READS", "KEEPS", "WRITER")
FUNCTIONS = {"convert": ["root", "out", "shards"], "open_loader": ["place", "state"]}


def load_runner():
    """benchmarks/peers/run.py as a module (it is a script, not part of a package)."""
    spec = importlib.util.spec_from_file_location("peers_run", PEERS / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run = load_runner()


def top_level(path):
    """``({constant: value}, {function: argument names})`` defined at the top of a module, and the
    names bound there by assignment or import."""
    tree = ast.parse(path.read_text())
    constants, functions, names = {}, {}, set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in (t for t in node.targets if isinstance(t, ast.Name)):
                names.add(target.id)
                if target.id in CONSTANTS:
                    constants[target.id] = ast.literal_eval(node.value)
        elif isinstance(node, ast.FunctionDef):
            functions[node.name] = [arg.arg for arg in node.args.args]
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return constants, functions, names


def test_every_tool_of_the_lab_has_a_driver_and_ours_comes_first():
    assert [path.stem.removeprefix("tool_") for path in DRIVERS] == sorted(run.TOOLS)
    assert run.TOOLS[0] == run.OURS


@pytest.mark.parametrize("path", DRIVERS, ids=lambda path: path.stem)
def test_driver_offers_the_shared_interface(path):
    constants, functions, names = top_level(path)
    assert set(constants) == set(CONSTANTS), f"{path.name} lacks {set(CONSTANTS) - set(constants)}"
    assert isinstance(constants.pop("KEEPS"), bool)
    assert all(isinstance(value, str) and value for value in constants.values())
    assert constants["VENV"] in run.PYTHONS
    for name, arguments in FUNCTIONS.items():
        # a function of its own, or one imported under that name (a shared writer)
        assert name in functions or name in names, f"{path.name} has no {name}"
        if name in functions:
            assert functions[name][: len(arguments)] == arguments


def test_mosaic_alone_needs_its_own_environment():
    venvs = {path.stem.removeprefix("tool_"): run.venv_of(path.stem[5:]) for path in DRIVERS}
    assert {tool for tool, venv in venvs.items() if venv != "peers"} == {"mosaic"}


def test_the_audit_counts_duplicates_missing_and_unknown_samples():
    lab = run.Lab.__new__(run.Lab)
    lab.expected = ["a", "b", "c", "d"]
    assert lab.audit([["a", "b"], ["c", "d"]]) == {
        "delivered": 4,
        "duplicates": 0,
        "missing": 0,
        "unknown": 0,
    }
    audit = lab.audit([["a", "b", "b"], ["a", "x"]])
    assert (audit["duplicates"], audit["missing"], audit["unknown"]) == (2, 2, 1)
    assert run.audit_text(audit) == "2 dup., 2 missing"


def test_the_report_explains_the_rows_whose_driver_has_a_caveat():
    results = {
        "quiet": {"about": {"title": "Quiet", "version": "1.0", "caveat": None}},
        "odd": {"about": {"title": "Odd", "version": "2.0", "caveat": "it resumes oddly."}},
        "broken": {"errors": {"describe": "no such module"}},
    }
    assert run.caveats(results) == "- **Odd 2.0**: it resumes oddly.\n"


@pytest.mark.parametrize("venv", sorted(run.PYTHONS))
def test_drivers_import_and_describe_themselves_in_their_environment(venv, tmp_path):
    python = run.PYTHONS[venv]
    if not python.exists():
        pytest.skip(f"{python.parent.parent.name} is built by `make bench-peers` on first use")
    for tool in (path.stem[5:] for path in DRIVERS if run.venv_of(path.stem[5:]) == venv):
        job = tmp_path / f"{tool}.json"
        job.write_text(json.dumps({"mode": "describe", "tool": tool}))
        done = subprocess.run(
            [python, PEERS / "harness.py", job], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        about = json.loads(done.stdout.strip().splitlines()[-1])
        assert set(about) == {"title", "package", "reads", "keeps", "writer", "version", "caveat"}
        assert about["caveat"] is None or about["caveat"].endswith(".")
        assert about["version"][0].isdigit()
